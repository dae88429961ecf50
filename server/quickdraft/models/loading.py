"""`load_models(ModelConfig) -> LoadedModels`: resolve references, load, check, quantize.

References are resolved to files (models/references.py). Then the runtime (models/runtime.py:
llama.cpp or torch) and, for torch on a CPU, the compute
path (models/cpu_kernels.py: exact int8, bfloat16 or float32) are chosen for this machine,
each runtime loads its models (models/llamacpp.py, models/torch_loading.py), and every step is
reported to `progress` so an editor can say what is happening.

Target and draft must share a tokenizer (TokenizerMismatchError otherwise). Their embedding
tables may differ in size inside a family (Qwen2.5-Coder 0.5B has 151,936 rows, 7B 152,064);
only the shared id range is compared, and `LoadedModels.shared_vocab_size` tells the engine where
to slice logits.
"""

from __future__ import annotations

import dataclasses
import filecmp
import functools
import gc
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from quickdraft.config import ModelConfig
from quickdraft.decoding import llamacpp
from quickdraft.errors import ConfigError, ModelError
from quickdraft.models import cpu_kernels, decoder_loop
from quickdraft.models.cpu_kernels import KernelChoice
from quickdraft.models.draft_format import DraftFormat, as_given, choose_draft_format
from quickdraft.models.draft_runtime import DraftRuntime, choose_draft_runtime, torch_step_ms
from quickdraft.models.llamacpp import LlamaCppModel, load_llamacpp_models
from quickdraft.models.presets import STOP_TOKENS, Preset
from quickdraft.models.references import (
    ResolvedModel,
    plan_references,
    resolve_draft,
    resolve_reference,
)
from quickdraft.models.runtime import (
    TYPICAL_PROMPT_TOKENS,
    ModelShape,
    RuntimeChoice,
    choose_runtime,
    torch_cost_estimate,
)
from quickdraft.models.tokenizers import (
    check_tokenizers,
    detect_family,
    load_tokenizer,
    stop_token_ids_for,
)
from quickdraft.models.torch_loading import (
    KernelOnDemand,
    Progress,
    count_parameters,
    ensure_weights,
    load_torch_model,
    load_torch_models,
    torch_compute_path,
)

log = logging.getLogger(__name__)


@dataclass
class LoadedModels:
    target: Any
    draft: Any | None
    tokenizer: Any
    family: str
    stop_token_ids: set[int]
    preset: Preset | None
    device: torch.device
    dtype: str
    """"int8", "float32", "bfloat16", "float16" (or "float64" for float64 test checkpoints)."""
    shared_vocab_size: int
    """Ids below this exist in both models' embeddings (the engine slices logits to it)."""
    target_info: ResolvedModel | None = None
    draft_info: ResolvedModel | None = None
    threads: int | None = None
    load_seconds: float = 0.0
    stop_tokens: list[str] = field(default_factory=list)
    runtime: str = "torch"
    """"torch" or "llamacpp" (then `target` and `draft` are models.llamacpp.LlamaCppModel)."""
    runtime_reason: str = ""
    kernel: KernelChoice | None = None
    """The measured CPU compute path behind `dtype` (torch on a CPU with dtype auto)."""
    draft_runtime: DraftRuntime | None = None
    """Where the draft runs and why, when it was measured on both runtimes (it may differ
    from `runtime`, the target's)."""
    draft_format: DraftFormat | None = None
    """Which GGUF llama.cpp runs the draft from and why (models/draft_format.py), where it
    may run it."""

    def names(self) -> list[str]:
        """The names the target is known by: its preset's and its reference (a next edit's
        prompt format is chosen by them)."""
        names = [self.preset.name] if self.preset is not None else []
        return names + ([self.target_info.reference] if self.target_info is not None else [])

    def describe(self) -> dict[str, Any]:
        def one(model, info: ResolvedModel | None) -> dict[str, Any] | None:
            if model is None:
                return None
            where = {
                "reference": info.reference if info else None,
                "path": str(info.path) if info else None,
                "kind": info.kind if info else None,
                "note": info.note if info else "",
            }
            if not isinstance(model, torch.nn.Module):  # llama.cpp
                return {**where, **model.describe()}
            rows = model.get_input_embeddings().weight.shape[0]
            return {
                **where,
                "architecture": type(model).__name__,
                "parameters": count_parameters(model),
                "vocab_rows": rows,
                "layers": getattr(model.config, "num_hidden_layers", None),
                "hidden_size": getattr(model.config, "hidden_size", None),
            }

        return {
            "preset": self.preset.name if self.preset else None,
            "family": self.family,
            "runtime": self.runtime,
            "runtime_reason": self.runtime_reason,
            "device": str(self.device),
            "dtype": self.dtype,
            "kernel": self.kernel.to_dict() if self.kernel is not None else None,
            "threads": self.threads,
            "target": one(self.target, self.target_info),
            "draft": one(self.draft, self.draft_info),
            "shared_vocab_size": self.shared_vocab_size,
            "stop_token_ids": sorted(self.stop_token_ids),
            "stop_tokens": list(self.stop_tokens),
            "load_seconds": round(self.load_seconds, 2),
            "draft_runtime": dataclasses.asdict(self.draft_runtime)
            if self.draft_runtime is not None
            else None,
            "draft_format": self.draft_format.reason if self.draft_format is not None else None,
        }

    @property
    def _draft_on_llamacpp(self) -> bool:
        if self.draft_runtime is not None:
            return self.draft_runtime.runtime == "llamacpp"
        return self.runtime == "llamacpp"

    def summary(self) -> str:
        """One line for logs and status items: what runs, on what, with which draft."""

        def name(info: ResolvedModel | None) -> str:
            if info is None:
                return "none"
            return info.path.name if info.kind in ("preset-pypi", "gguf") else info.reference

        how = "llama.cpp" if self.runtime == "llamacpp" else f"torch {self.dtype}"
        if self.kernel is not None and self.runtime == "torch" and self.dtype == "int8":
            how = f"torch {self.kernel.label}"
        draft = name(self.draft_info)
        if self.draft_format is not None and self.draft_format.copy and self._draft_on_llamacpp:
            draft += " as Q4_0"
        if self.draft_runtime is not None and self.draft_runtime.runtime != self.runtime:
            draft += " on llama.cpp" if self.draft_runtime.runtime == "llamacpp" else " on torch"
        return (
            f"target {name(self.target_info)}, draft {draft} ({how} on "
            f"{self.device}, {self.threads or '-'} threads; loaded in {self.load_seconds:.0f} s)"
        )


# --- devices, dtypes, threads -------------------------------------------------------------


def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in allowed:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(
            f"model.device: {device!r} is not a device (auto, cpu, cuda, cuda:N)"
        ) from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device: {device!r} asked for, but CUDA is not available")
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"model.device: {device!r} is not supported (auto, cpu, cuda, cuda:N)")
    return resolved


# --- loading --------------------------------------------------------------------------------


def _say(progress: Progress | None, message: str) -> None:
    log.info("%s", message)
    if progress is not None:
        progress(message)


def _vocab_rows(model: Any) -> int:
    """Rows of a model's input embedding (its vocabulary, padding included)."""
    if isinstance(model, torch.nn.Module):
        return model.get_input_embeddings().weight.shape[0]
    return model.vocab_size  # llama.cpp


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
"""The files a Hugging Face tokenizer is read from."""


def same_tokenizer_files(first: Path, second: Path) -> bool:
    """Whether two model directories hold the same tokenizer, file for file and byte for byte
    (a fast tokenizer's tokenizer.json in both): then the draft's need not be loaded (about
    100 MB for Qwen2.5's) nor compared."""
    if not ((first / "tokenizer.json").is_file() and (second / "tokenizer.json").is_file()):
        return False
    for name in TOKENIZER_FILES:
        a, b = first / name, second / name
        if a.is_file() != b.is_file():
            return False
        if a.is_file() and not filecmp.cmp(a, b, shallow=False):
            return False
    return True


def _target_shape(preset: Preset | None, target_info: ResolvedModel) -> ModelShape:
    """The target's shape: a preset knows it; else read (a GGUF's metadata takes gguf's reader
    5-20 s to parse: its 150k-token vocabulary is read in Python)."""
    if preset is not None and target_info.kind.startswith("preset"):
        return ModelShape.of(preset.target.arch)
    if target_info.gguf is not None:
        return ModelShape.from_gguf(target_info.gguf)
    return ModelShape.of(AutoConfig.from_pretrained(target_info.path))


def llamacpp_hint(
    runtime: RuntimeChoice, kernel: KernelChoice | None, preset: Preset | None = None
) -> str | None:
    """What to tell a user whom torch serves without fast exact int8 because llama.cpp is not
    installed (8.6 GB and several times slower, for the 1.5B pair in float32), or because the
    preset's GGUF was removed (fetched before llama.cpp was installed, it was converted for
    torch); None when that is not the case."""
    if kernel is None or kernel.dtype == "int8":
        return None
    slower = f"torch runs {kernel.dtype}, slower and with about three times the memory"
    if runtime.llamacpp_missing:
        return (
            f"llama.cpp is not installed, and this CPU has no fast exact int8 ({kernel.reason}): "
            f"{slower}; `{llamacpp.INSTALL_HINT}` adds llama.cpp, which `runtime: auto` then "
            "measures"
        )
    if runtime.gguf_missing and preset is not None:
        return (
            f"llama.cpp is installed, but {preset.name}'s GGUF files are not here (fetched "
            f"before llama.cpp was installed, they were converted for torch and removed), and "
            f"this CPU has no fast exact int8 ({kernel.reason}): {slower}; `quickdraft models "
            f"fetch {preset.name}` brings the GGUF files back, and `runtime: auto` then "
            "measures llama.cpp"
        )
    return None


def load_models(
    config: ModelConfig,
    *,
    home: Path | None = None,
    progress: Progress | None = None,
    prompt_tokens: int = TYPICAL_PROMPT_TOKENS,
) -> LoadedModels:
    """Load target (and draft) as configured. Raises ModelError subclasses for user errors.

    `prompt_tokens`: the size of a typical prompt (`context.max_prompt_tokens`), at which the
    runtimes' costs are compared."""
    started = time.monotonic()
    device = resolve_device(config.device)
    preset, target_ref, draft_ref = plan_references(config, device.type)
    target_info = resolve_reference(target_ref, home)
    draft_info = resolve_draft(draft_ref, home) if draft_ref is not None else None

    threads = None
    if device.type == "cpu":
        threads = config.threads or physical_cores()
        torch.set_num_threads(threads)
        decoder_loop.settle_rotary_math()
    shape = functools.cache(functools.partial(_target_shape, preset, target_info))
    kernel = KernelOnDemand(
        lambda: cpu_kernels.choose(shape(), threads or 1, home=home, progress=progress)
    )
    runtime = choose_runtime(
        config.runtime,
        device_type=device.type,
        gguf=target_info.gguf,
        shape=shape,
        threads=threads or 1,
        kernel=kernel,
        progress=progress,
        home=home,
        prompt_tokens=prompt_tokens,
    )

    _say(progress, f"loading the tokenizer of {target_info.path.name}")
    tokenizer = load_tokenizer(target_info)
    draft_tokenizer = None  # None with a draft: the target's tokenizer files, byte for byte
    if draft_info is not None and not same_tokenizer_files(target_info.path, draft_info.path):
        draft_tokenizer = load_tokenizer(draft_info)
    say = functools.partial(_say, progress)
    # The GGUF llama.cpp would run the draft from: its Q4_0 copy where that is faster here.
    draft_format = _draft_format(config, draft_info, runtime, device, threads or 1, home, say)
    llama_draft = draft_info
    if draft_info is not None and draft_format is not None:
        llama_draft = dataclasses.replace(draft_info, gguf=draft_format.path)
    chosen_kernel: KernelChoice | None = None
    if runtime.runtime == "llamacpp":
        extra = runtime.probe.extra_bufts if runtime.probe is not None else True
        # The draft's own probe decides its buffers: its file may take kernels the target's
        # does not (models/draft_format.py).
        draft_extra = draft_format.extra_bufts if draft_format is not None else extra
        target, draft = load_llamacpp_models(
            target_info, llama_draft, threads or 1, extra, draft_extra, say
        )
        dtype = "gguf"
        log.info("runtime %s: %s", runtime.runtime, runtime.reason)
    else:
        for info in (target_info, draft_info):
            if info is not None:
                ensure_weights(info, progress)
        dtype, backend, chosen_kernel = torch_compute_path(
            config.dtype, device, target_info.path, kernel
        )
        hint = llamacpp_hint(runtime, chosen_kernel, preset)
        if hint is None:
            log.info("runtime %s: %s", runtime.runtime, runtime.reason)
        else:
            say(hint)  # once, in the log and the progress, in place of the runtime line
        target, draft = load_torch_models(target_info, draft_info, dtype, device, backend, say)
    draft_runtime = None
    if draft is not None and config.runtime == "auto" and device.type == "cpu":
        draft, draft_runtime = _draft_on_its_cheapest_runtime(
            draft,
            runtime,
            draft_info,
            llama_draft.gguf,
            preset,
            threads or 1,
            config,
            device,
            kernel,
            say,
        )

    model_type = getattr(getattr(target, "config", None), "model_type", None)
    family = preset.family if preset is not None else detect_family(tokenizer, model_type)
    if family is None:
        raise ModelError(
            f"cannot tell the FIM family of {target_ref} (no known infilling tokens in its "
            "vocabulary); use a preset or a Qwen2.5-Coder, DeepSeek-Coder, StarCoder2 or CodeLlama model"
        )
    shared = _vocab_rows(target)
    if draft is not None:
        shared = min(shared, _vocab_rows(draft))
    if draft is not None and draft_info is not None and draft_tokenizer is not None:
        check_tokenizers(
            tokenizer,
            draft_tokenizer,
            shared,
            target_name=f"target {target_info.reference}",
            draft_name=f"draft {draft_info.reference}",
            extra_tokens=STOP_TOKENS.get(family, ()),
        )
    # The configs of torch models name EOS ids too; a GGUF's tokenizer already has them.
    configured = [m for m in (target, draft) if isinstance(m, torch.nn.Module)]
    stop_ids, stop_names = stop_token_ids_for(tokenizer, family, configured)
    return LoadedModels(
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        family=family,
        stop_token_ids=stop_ids,
        preset=preset,
        device=device,
        dtype=dtype,
        shared_vocab_size=shared,
        target_info=target_info,
        draft_info=draft_info,
        threads=threads,
        load_seconds=time.monotonic() - started,
        stop_tokens=stop_names,
        runtime=runtime.runtime,
        runtime_reason=runtime.reason,
        kernel=chosen_kernel or runtime.kernel,
        draft_runtime=draft_runtime,
        draft_format=draft_format,
    )


def _draft_format(
    config: ModelConfig,
    draft_info: ResolvedModel | None,
    runtime: RuntimeChoice,
    device: torch.device,
    threads: int,
    home: Path | None,
    say: Progress,
) -> DraftFormat | None:
    """The GGUF llama.cpp runs the draft from (models/draft_format.py), where llama.cpp may
    run it here: as the runtime, or as the draft's own when `runtime: auto` on a CPU compares
    both. None where it will not, or the draft has no GGUF."""
    if draft_info is None or draft_info.gguf is None or device.type != "cpu":
        return None
    if runtime.runtime != "llamacpp" and (config.runtime != "auto" or not llamacpp.available()):
        return None
    if config.draft_format == "as-is":
        return as_given(draft_info.gguf, threads, "model.draft_format is as-is", home=home, say=say)
    chosen = choose_draft_format(draft_info.gguf, threads, home=home, say=say)
    log.info("draft format: %s", chosen.reason)
    return chosen


def _draft_on_its_cheapest_runtime(
    draft: Any,
    runtime: RuntimeChoice,
    draft_info: ResolvedModel,
    draft_gguf: Path | None,
    preset: Preset | None,
    threads: int,
    config: ModelConfig,
    device: torch.device,
    kernel: KernelOnDemand,
    say: Progress,
) -> tuple[Any, DraftRuntime | None]:
    """The loaded draft, moved to the runtime that steps it cheaper (models/draft_runtime.py),
    and the choice; (draft, None) where llama.cpp is not installed."""
    if not llamacpp.available():
        return draft, None
    vocab = _vocab_rows(draft)
    loaded: dict[str, Any] = {runtime.runtime: draft}

    def torch_draft() -> Any:
        if "torch" not in loaded:
            ensure_weights(draft_info, say)
            dtype, backend, _ = torch_compute_path(config.dtype, device, draft_info.path, kernel)
            say(f"loading the draft {draft_info.path.name} in torch to time its step")
            loaded["torch"] = load_torch_model(draft_info, dtype, device, backend, is_draft=True)
        return loaded["torch"]

    def torch_estimate() -> float | None:
        if runtime.kernel is None or preset is None or preset.draft is None:
            return None  # no kernel measurement, or no shape without reading the GGUF
        return torch_cost_estimate(runtime.kernel, ModelShape.of(preset.draft.arch)).target_ms[1]

    try:
        choice = choose_draft_runtime(
            runtime.runtime,
            gguf=draft_gguf,
            threads=threads,
            torch_ms=lambda: torch_step_ms(torch_draft(), vocab),
            torch_estimate_ms=torch_estimate,
            progress=say,
        )
    except (ModelError, OSError) as exc:  # the draft stays where it loaded
        log.warning("could not measure the draft on both runtimes: %s", exc)
        return draft, None
    if choice.runtime not in loaded:
        say(f"loading the draft {draft_gguf.name} in llama.cpp (cheaper here)")
        loaded[choice.runtime] = LlamaCppModel(
            draft_gguf, threads=threads, extra_bufts=choice.extra_bufts
        )
    chosen = loaded.pop(choice.runtime)
    for other in loaded.values():  # the draft not taken: free it now
        close = getattr(other, "close", None)
        if callable(close):
            close()
    loaded.clear()
    gc.collect()
    log.info("draft runtime %s: %s", choice.runtime, choice.reason)
    return chosen, choice

"""The torch runtime's side of loading: which dtype and int8 kernel run, weights for torch
(a GGUF converted once), and one transformers model loaded, cast or quantized."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from quickdraft.decoding import llamacpp
from quickdraft.errors import ConfigError, ModelError, ModelNotFoundError
from quickdraft.models import convert, store
from quickdraft.models.cpu_kernels import KernelChoice, score
from quickdraft.models.precision import cast_floating, keep_stored_embedding
from quickdraft.models.quantize import Int8Linear, default_int8_backend, quantize_model
from quickdraft.models.references import ResolvedModel

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
"""Told, in a few words, what loading is doing now (shown to the user)."""

TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_dtype(
    dtype: str,
    device: torch.device,
    checkpoint_dtype: torch.dtype | None,
    kernel: Callable[[], KernelChoice] | None = None,
) -> str:
    """The runtime dtype name for `dtype` on `device`.

    `auto`: bfloat16 on CUDA; on CPU what `kernel()` measured fastest here (cpu_kernels),
    except that a float64 checkpoint (the tiny test models of `quickdraft.testing`) stays
    float64 so greedy identity tests stay exact.
    """
    if dtype == "auto":
        if device.type == "cuda":
            return "bfloat16"
        if checkpoint_dtype == torch.float64:
            return "float64"
        return kernel().dtype if kernel is not None else "float32"
    if dtype == "int8" and device.type != "cpu":
        raise ConfigError("model.dtype: int8 runs on CPU only; use bfloat16 on CUDA")
    return dtype


def best_int8_backend(kernel: KernelChoice) -> str:
    """`dtype: int8` asked for explicitly: the fastest exact int8 backend measured here, even
    where float32 would be faster (the log says so)."""
    timed = sorted(
        (score(t), name.split("/", 1)[1])
        for name, t in kernel.timings_ms.items()
        if name.startswith("int8/")
    )
    if not timed:
        return default_int8_backend()
    backend = timed[0][1]
    log.warning(
        "dtype int8 asked for: using %s, although %s is measured faster on this CPU (%s)",
        backend,
        kernel.dtype,
        kernel.reason,
    )
    return backend


def checkpoint_dtype(path: Path) -> torch.dtype | None:
    """The dtype a Hugging Face checkpoint says it is stored in (None: it does not say)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    return TORCH_DTYPES.get(name) if isinstance(name, str) else None


def load_torch_model(
    resolved: ResolvedModel, dtype: str, device: torch.device, int8_backend: str | None
):
    """Load one torch model; half-precision checkpoints load as stored (half the peak memory)
    and are cast afterwards, their input embedding kept as stored (StoredEmbedding)."""
    stored = checkpoint_dtype(resolved.path)
    half = stored if stored in (torch.bfloat16, torch.float16) else None
    compute = torch.float32 if dtype == "int8" else TORCH_DTYPES[dtype]
    load_dtype = half if half is not None and device.type == "cpu" else compute
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=load_dtype)
    except Exception as exc:
        raise ModelError(
            f"cannot load {resolved.reference} from {resolved.path}: {type(exc).__name__}: {exc}"
        ) from exc
    model = model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if load_dtype != compute:
        keep_stored_embedding(model, compute)
    if dtype == "int8":
        quantize_model(model, backend=int8_backend)  # casts the rest to float32
    elif load_dtype != compute:
        cast_floating(model, compute)
    return model.to(device)


def ensure_weights(resolved: ResolvedModel, progress: Progress | None) -> None:
    """Torch needs weights: convert a GGUF-only model once (models/convert.py)."""
    managed = resolved.kind in ("preset-pypi", "gguf")  # quickdraft's own directories
    if store.has_weights(resolved.path) and (store.is_complete(resolved.path) or not managed):
        return
    if resolved.gguf is None:
        raise ModelNotFoundError(
            f"{resolved.reference}: {resolved.path} has no weights for the torch runtime and no "
            "GGUF file to convert; fetch the model again (`quickdraft models fetch PRESET`)"
        )
    keep = not resolved.own_gguf or llamacpp.available()
    convert.ensure_weights(resolved.path, resolved.gguf, keep_gguf=keep, progress=progress)
    if not keep:
        resolved.gguf = None


def count_parameters(model) -> int:
    """Parameters, counting int8 weights (buffers of Int8Linear) as their element count."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    for m in model.modules():
        if isinstance(m, Int8Linear):
            total += m.out_features * m.in_features + (m.bias.numel() if m.bias is not None else 0)
    return total


class KernelOnDemand:
    """The CPU compute path (`cpu_kernels.choose`), measured on the first call only: a light
    start (a cached choice, CUDA, llama.cpp winning) never pays for it."""

    def __init__(self, measure: Callable[[], KernelChoice]) -> None:
        self._measure = measure
        self.choice: KernelChoice | None = None
        """The measured choice, once a call has measured it."""

    def __call__(self) -> KernelChoice:
        if self.choice is None:
            self.choice = self._measure()
        return self.choice


def torch_compute_path(
    requested: str, device: torch.device, target_path: Path, kernel: KernelOnDemand
) -> tuple[str, str | None, KernelChoice | None]:
    """(dtype, int8 backend or None, the kernel measurement behind them or None) for torch:
    `requested` is `model.dtype`."""
    dtype = resolve_dtype(requested, device, checkpoint_dtype(target_path), kernel)
    if dtype == "int8":
        choice = kernel()
        return dtype, choice.int8_backend or best_int8_backend(choice), choice
    measured = kernel.choice if requested == "auto" and device.type == "cpu" else None
    return dtype, None, measured


def load_torch_models(
    target_info: ResolvedModel,
    draft_info: ResolvedModel | None,
    dtype: str,
    device: torch.device,
    int8_backend: str | None,
    say: Progress,
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """Target and draft (None: no draft) loaded as torch models at `dtype` (their weights
    there: `ensure_weights`); each step told to `say`."""
    how = f"int8 ({int8_backend})" if dtype == "int8" else dtype
    say(f"loading the target {target_info.path.name} in torch, {how}")
    target = load_torch_model(target_info, dtype, device, int8_backend)
    if draft_info is None:
        return target, None
    say(f"loading the draft {draft_info.path.name} in torch, {how}")
    return target, load_torch_model(draft_info, dtype, device, int8_backend)

"""The torch runtime's side of loading: which dtype and int8 kernel run, weights for torch
(a GGUF converted once), and one transformers model loaded, cast or quantized.

Memory: a safetensors checkpoint is read tensor by tensor straight into its runtime dtype
(`stream_checkpoint`), into a model built without weights, so no weight is ever held twice.
transformers' own loader maps the file and casts afterwards: the mapped bfloat16 pages it has
read stay resident beside the float32 copies (12.6 GB peak for the 1.5B + 0.5B pair in float32
against 9 GB of weights). A half-precision input embedding kept as stored (`StoredEmbedding`) is
mapped from the file instead of read: a lookup touches only the rows it reads.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from quickdraft.decoding import llamacpp
from quickdraft.errors import ConfigError, ModelError, ModelNotFoundError
from quickdraft.models import convert, store
from quickdraft.models.cpu_kernels import KernelChoice, score
from quickdraft.models.precision import cast_floating, keep_stored_embedding, keep_stored_head
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
        (score(t), t.get("1", float("inf")), name.split("/", 1)[1])
        for name, t in kernel.timings_ms.items()
        if name.startswith("int8/")
    )
    if not timed:
        return default_int8_backend()
    backend = timed[0][2]
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


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

READ_CHUNK_BYTES = 16 << 20
"""What a tensor stored in another dtype is read in at a time (then converted into place)."""


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor of a safetensors checkpoint lies: its file, dtype, shape and bytes."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Byte offset of its data in `file`."""
    end: int


def safetensors_tensors(directory: Path) -> dict[str, StoredTensor] | None:
    """Every tensor of the safetensors checkpoint in `directory` (one file or shards), from the
    headers alone; None where there is none or it holds a dtype not read here."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    try:
        if single.is_file():
            files = [single]
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [directory / name for name in sorted(set(weight_map.values()))]
        else:
            return None
        tensors: dict[str, StoredTensor] = {}
        for file in files:
            with open(file, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(size))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
                if dtype is None:
                    return None
                start, end = entry["data_offsets"]
                tensors[name] = StoredTensor(
                    file, dtype, tuple(entry["shape"]), 8 + size + start, 8 + size + end
                )
        return tensors
    except (OSError, ValueError, KeyError, TypeError):
        return None  # transformers reads it, or says what is wrong with it


def _read_exactly(handle, into: torch.Tensor) -> None:
    view = memoryview(into.view(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(view):
        got = handle.readinto(view[done:])
        if not got:
            raise ModelError(f"{handle.name} ends inside a tensor: the file is truncated")
        done += got


def read_tensor(
    handle, stored: StoredTensor, dtype: torch.dtype, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """`stored` read from the open file `handle` into a new tensor of `dtype`: directly when the
    dtypes agree, else through `scratch` (bytes, `READ_CHUNK_BYTES` unless given), a piece at a
    time, each converted into place. Loading passes one scratch for every tensor: a buffer
    allocated and freed per tensor leaves the C heap fragmented, with hundreds of MB of freed
    memory it cannot hand back."""
    out = torch.empty(stored.shape, dtype=dtype)
    numel = out.numel()
    if numel * stored.dtype.itemsize != stored.end - stored.start:
        raise ModelError(f"{stored.file}: a tensor's size does not match its shape")
    if numel == 0:
        return out
    handle.seek(stored.start)
    if dtype == stored.dtype:
        _read_exactly(handle, out)
        return out
    if scratch is None:
        scratch = torch.empty(READ_CHUNK_BYTES, dtype=torch.uint8)
    step = max(1, scratch.numel() // stored.dtype.itemsize)
    flat = out.view(-1)
    for first in range(0, numel, step):
        n = min(step, numel - first)
        piece = scratch[: n * stored.dtype.itemsize].view(stored.dtype)
        _read_exactly(handle, piece)
        flat[first : first + n].copy_(piece)
    return out


def map_tensor(stored: StoredTensor) -> torch.Tensor:
    """`stored` as it lies in its file, mapped copy-on-write (never written): only the pages
    read are resident, and the OS may drop them again."""
    raw = torch.from_file(
        str(stored.file), shared=False, size=stored.file.stat().st_size, dtype=torch.uint8
    )
    return raw[stored.start : stored.end].view(stored.dtype).view(stored.shape)


def _empty_model(path: Path, dtype: torch.dtype):
    """The model of the checkpoint at `path` with its parameters on the meta device (no memory,
    no initialisation) and its computed buffers (rotary frequencies) real; None for a
    quantized checkpoint (transformers loads those)."""
    from accelerate import init_empty_weights

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "quantization_config", None) is not None:
        return None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    if (path / "generation_config.json").is_file():
        with suppress(OSError, ValueError):
            model.generation_config = GenerationConfig.from_pretrained(path)
    return model


def stream_checkpoint(
    path: Path, dtype: torch.dtype, *, keep_embedding: bool, keep_head: bool = False
):
    """The safetensors checkpoint at `path` as a model whose floating-point tensors are
    `dtype`, read one tensor at a time into the parameter it becomes (no second copy of any
    weight, no state dict); tied weights stay tied. `keep_embedding`: an input embedding not
    tied to the head stays in its stored dtype, mapped from the file (`map_tensor`).

    None where this checkpoint is not one read here (no safetensors, names or shapes the model
    does not have, a quantized checkpoint): transformers loads it then."""
    tensors = safetensors_tensors(path)
    if tensors is None:
        return None
    model = _empty_model(path, dtype)
    if model is None:
        return None
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))

    def shape_in_model(name: str) -> tuple[int, ...] | None:
        tensor = params.get(name, buffers.get(name))
        return None if tensor is None else tuple(tensor.shape)

    unknown = [name for name, stored in tensors.items() if shape_in_model(name) != stored.shape]
    missing = {id(p) for p in params.values()} - {id(params[n]) for n in tensors if n in params}
    if unknown or missing:
        log.info(
            "%s: %d tensors the model does not have as stored, %d parameters not stored; "
            "loading through transformers",
            path,
            len(unknown),
            len(missing),
        )
        return None
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    keep = keep_embedding and not tied and embedding.dtype.is_floating_point
    head_weight = head.weight if keep_head and head is not None else None
    placed: set[int] = set()
    scratch = torch.empty(READ_CHUNK_BYTES, dtype=torch.uint8)
    with ExitStack() as files:
        handles: dict[Path, BinaryIO] = {}

        def handle_of(file: Path) -> BinaryIO:
            if file not in handles:
                handles[file] = files.enter_context(open(file, "rb"))
            return handles[file]

        for name, stored in tensors.items():
            parent_name, _, leaf = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            if name not in params:  # a persistent buffer
                buffer = buffers[name]
                parent._buffers[leaf] = read_tensor(
                    handle_of(stored.file), stored, buffer.dtype, scratch
                )
                continue
            param = params[name]
            if id(param) in placed:  # a tied copy stored twice: one parameter
                continue
            placed.add(id(param))
            if keep and param is embedding:
                aligned = stored.start % stored.dtype.itemsize == 0
                value = (
                    map_tensor(stored)
                    if aligned
                    else read_tensor(handle_of(stored.file), stored, stored.dtype, scratch)
                )
            elif param is head_weight:
                value = read_tensor(handle_of(stored.file), stored, stored.dtype, scratch)
            else:
                into = dtype if stored.dtype.is_floating_point else stored.dtype
                value = read_tensor(handle_of(stored.file), stored, into, scratch)
            parent._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    model.tie_weights()
    if any(p.device.type == "meta" for p in model.parameters()):
        log.info("%s: tied weights did not resolve; loading through transformers", path)
        return None
    config = model.config
    if getattr(config, "dtype", None) is not None:
        config.dtype = dtype
    return model


def load_torch_model(
    resolved: ResolvedModel,
    dtype: str,
    device: torch.device,
    int8_backend: str | None,
    *,
    is_draft: bool = False,
):
    """Load one torch model, read straight into its runtime dtype (`stream_checkpoint`); a
    half-precision checkpoint keeps its input embedding as stored (StoredEmbedding), and int8
    reads the stored half precision and quantizes it (half the peak memory). `is_draft`
    (the draft model, whose tokens the target checks): in float32 its output head stays as
    stored too (StoredHead), 0.27 GB less for the 0.5B."""
    stored = checkpoint_dtype(resolved.path)
    half = stored if stored in (torch.bfloat16, torch.float16) else None
    compute = torch.float32 if dtype == "int8" else TORCH_DTYPES[dtype]
    load_dtype = half if half is not None and device.type == "cpu" else compute
    read_dtype = load_dtype if dtype == "int8" else compute
    keep_head = is_draft and dtype == "float32" and load_dtype != compute
    try:
        model = stream_checkpoint(
            resolved.path,
            read_dtype,
            keep_embedding=load_dtype != compute,
            keep_head=keep_head,
        )
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=load_dtype)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"cannot load {resolved.reference} from {resolved.path}: {type(exc).__name__}: {exc}"
        ) from exc
    model = model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if keep_head:
        keep_stored_head(model, compute)
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
    gc.collect()  # what the target's loading left behind goes before the draft comes
    say(f"loading the draft {draft_info.path.name} in torch, {how}")
    return target, load_torch_model(draft_info, dtype, device, int8_backend, is_draft=True)

"""`load_models(ModelConfig) -> LoadedModels`: resolve references, load, check, quantize.

A model reference is, in the order tried:

1. a preset name: that preset's *target* model (as `target`, with no draft set, the whole
   preset: target and draft), from `$QUICKDRAFT_HOME/models/`;
2. an existing path: a `.gguf` file (its tokenizer, and for torch its converted weights, kept
   once in `$QUICKDRAFT_HOME/converted/`) or a Hugging Face model directory;
3. a Hub id `org/name`: `$QUICKDRAFT_HOME/models/org--name/` (fetched by `quickdraft models fetch
   --source hub`), else the local Hugging Face cache, offline. Nothing is downloaded at load.

Then the runtime (models/runtime.py: llama.cpp or torch) and, for torch on a CPU, the compute
path (models/cpu_kernels.py: exact int8, bfloat16 or float32) are chosen by measuring this
machine, and every step is reported to `progress` so an editor can say what is happening.

Target and draft must share a tokenizer (TokenizerMismatchError otherwise). Their embedding
tables may differ in size inside a family (Qwen2.5-Coder 0.5B has 151,936 rows, 7B 152,064);
only the shared id range is compared, and `LoadedModels.shared_vocab_size` tells the engine where
to slice logits.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quickdraft.config import ModelConfig
from quickdraft.errors import ConfigError, ModelError, ModelNotFoundError, TokenizerMismatchError
from quickdraft.models import convert, fetch, store
from quickdraft.models.cpu_kernels import KernelChoice
from quickdraft.models.precision import cast_floating, keep_stored_embedding
from quickdraft.models.presets import PRESETS, STOP_TOKENS, ModelSource, Preset, default_preset
from quickdraft.models.quantize import quantize_model

log = logging.getLogger(__name__)

_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


@dataclass
class ResolvedModel:
    """Where one model's files are, and what they are."""

    reference: str
    path: Path
    """The model directory: tokenizer files, and weights once converted or downloaded."""
    kind: str  # "preset-pypi" | "preset-hub" | "directory" | "gguf" | "hub-cache"
    source: ModelSource | None = None
    note: str = ""
    gguf: Path | None = None
    """The GGUF file, when there is one (llama.cpp runs it; torch converts it once)."""
    own_gguf: bool = False
    """The GGUF is quickdraft's own download (it may be deleted once converted), not a file
    the user pointed at."""


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
    """"torch" or "llamacpp" (then `target` and `draft` are decoding.llamacpp.LlamaCppModel)."""
    runtime_reason: str = ""
    kernel: KernelChoice | None = None
    """The measured CPU compute path behind `dtype` (torch on a CPU with dtype auto)."""

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
            if self.runtime == "llamacpp":
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
        }

    def summary(self) -> str:
        """One line for logs and status items: what runs, on what, with which draft."""

        def name(info: ResolvedModel | None) -> str:
            if info is None:
                return "none"
            return info.path.name if info.kind in ("preset-pypi", "gguf") else info.reference

        how = "llama.cpp" if self.runtime == "llamacpp" else f"torch {self.dtype}"
        if self.kernel is not None and self.runtime == "torch" and self.dtype == "int8":
            how = f"torch {self.kernel.label}"
        return (
            f"target {name(self.target_info)}, draft {name(self.draft_info)} ({how} on "
            f"{self.device}, {self.threads or '-'} threads; loaded in {self.load_seconds:.0f} s)"
        )


def count_parameters(model) -> int:
    """Parameters, counting int8 weights (buffers of Int8Linear) as their element count."""
    from quickdraft.models.quantize import Int8Linear

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


# --- references -----------------------------------------------------------------------------


def _fetch_hint(preset_name: str) -> str:
    preset = PRESETS[preset_name]
    source = "pypi" if preset.has_pypi else "hub"
    return f"quickdraft models fetch {preset_name} --source {source}"


def _preset_for_source(source: ModelSource) -> str:
    """The first preset using `source` (as target, else as draft), to name in fetch hints."""
    for name, preset in PRESETS.items():
        if preset.target is source:
            return name
    for name, preset in PRESETS.items():
        if preset.draft is source:
            return name
    raise KeyError(source.hub_id)  # pragma: no cover


def resolve_source(source: ModelSource, reference: str, home: Path | None = None) -> ResolvedModel:
    found = fetch.find_local_model(source, home)
    if found is None:
        name = _preset_for_source(source)
        where = ", ".join(str(p) for _, p in fetch.local_model_dirs(source, home))
        raise ModelNotFoundError(
            f"weights of {source.hub_id} (preset {name}) are not downloaded (looked in {where}); "
            f"fetch them with `{_fetch_hint(name)}`"
        )
    kind, path = found
    note, gguf = "", None
    if kind == "pypi" and source.pypi is not None:
        note = source.pypi.note
        gguf = store.gguf_of(path)
        if gguf is None:
            candidate = store.gguf_dir(home) / source.pypi.filename
            gguf = candidate if candidate.is_file() else None
    return ResolvedModel(reference, path, f"preset-{kind}", source, note, gguf, own_gguf=True)


def _looks_like_path(reference: str) -> bool:
    """Hub ids are exactly `org/name`; anything else with a slash or a .gguf is a path."""
    return (
        reference.startswith(("/", ".", "~"))
        or reference.endswith(".gguf")
        or reference.count("/") != 1
    )


def resolve_reference(reference: str, home: Path | None = None) -> ResolvedModel:
    """Turn a model reference into a local directory, or raise ModelNotFoundError."""
    if reference in PRESETS:
        return resolve_source(PRESETS[reference].target, reference, home)
    path = Path(reference).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelNotFoundError(
                    f"{reference}: a model file must be a .gguf (or give the model's directory)"
                )
            gguf = Path(os.path.abspath(path))
            directory = convert.converted_path_for(gguf, home)
            return ResolvedModel(reference, directory, "gguf", note=f"from {path.name}", gguf=gguf)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{reference}: not a Hugging Face model directory (no config.json)"
            )
        return ResolvedModel(reference, path, "directory")
    if _looks_like_path(reference):
        known = ", ".join(PRESETS)
        raise ModelNotFoundError(
            f"{reference!r} is neither a preset ({known}), an existing file or directory, "
            "nor a Hub id of the form org/name"
        )
    return _resolve_hub_id(reference, home)


def _resolve_hub_id(hub_id: str, home: Path | None) -> ResolvedModel:
    ours = fetch.hub_model_dir(hub_id, home)
    if store.is_complete(ours):
        return ResolvedModel(hub_id, ours, "preset-hub")
    try:
        from huggingface_hub import snapshot_download

        cached = snapshot_download(hub_id, local_files_only=True)
        if (Path(cached) / "config.json").is_file():
            return ResolvedModel(hub_id, Path(cached), "hub-cache")
    except Exception:  # not in the cache (LocalEntryNotFoundError and friends)
        pass
    hint = f"download it where the Hub is reachable (`hf download {hub_id}`) into the HF cache"
    users = [n for n, p in PRESETS.items() if p.target.hub_id == hub_id]
    if users:
        hint = f"fetch it with `quickdraft models fetch {users[0]} --source hub`, or " + hint
    pypi = [n for n, p in PRESETS.items() if p.target.hub_id == hub_id and p.has_pypi]
    also = (
        f"; preset {pypi[0]} has a PyPI route (a quantized Instruct variant): "
        f"`{_fetch_hint(pypi[0])}`, then use --preset {pypi[0]}"
        if pypi
        else ""
    )
    raise ModelNotFoundError(
        f"Hub model {hub_id} is not available locally (not in {ours} nor in the Hugging Face "
        f"cache; nothing is downloaded at load time): {hint}{also}"
    )


# --- tokenizers -----------------------------------------------------------------------------

_PROBES = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "function add(a, b) { return a + b; }  // JS\nconst x = `tmpl ${a}`;\n",
    'fn main() {\n\tlet v: Vec<u8> = vec![1, 2, 3];\n\tprintln!("{:?}", v);\n}\n',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); }\n',
    "    \t  \n\n\n  trailing   spaces  ",
    "Unicode: é ü ß 漢字 😀 — ∑",
]


def check_tokenizers(
    target_tokenizer,
    draft_tokenizer,
    shared_vocab_size: int,
    *,
    target_name: str = "target",
    draft_name: str = "draft",
    extra_tokens: tuple[str, ...] = (),
) -> None:
    """Raise TokenizerMismatchError unless both tokenizers agree on ids below the shared size.

    Below `shared_vocab_size`, every id both vocabularies define must be the same token, and
    every token both define must have the same id. An id only one side defines (padding
    entries, a few extra special tokens) is allowed: the target rejects a draft token it does
    not know like any other wrong guess. Then the encodings of probe strings (code in several
    languages, whitespace, Unicode, the family's special tokens) must be identical.
    """
    tv = {t: i for t, i in target_tokenizer.get_vocab().items() if i < shared_vocab_size}
    dv = {t: i for t, i in draft_tokenizer.get_vocab().items() if i < shared_vocab_size}
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    conflicts = sorted(i for i in t_by_id.keys() & d_by_id.keys() if t_by_id[i] != d_by_id[i])
    moved = sorted((tv[t], t) for t in tv.keys() & dv.keys() if tv[t] != dv[t])
    smaller = min(len(tv), len(dv))
    overlap = len(tv.keys() & dv.keys())
    if conflicts or moved or overlap < 0.99 * smaller:
        if conflicts:
            idx = conflicts[0]
            example = (
                f"; e.g. id {idx} is {t_by_id[idx]!r} in {target_name} "
                f"but {d_by_id[idx]!r} in {draft_name}"
            )
        elif moved:
            idx, tok = moved[0]
            example = f"; e.g. {tok!r} is id {idx} in {target_name} but {dv[tok]} in {draft_name}"
        else:
            example = f"; they share only {overlap:,} of {smaller:,} tokens"
        raise TokenizerMismatchError(
            f"{target_name} and {draft_name} do not share a tokenizer: "
            f"{max(len(conflicts), len(moved)):,} of the first {shared_vocab_size:,} ids differ"
            f"{example}. Pick a draft of the same model family (see `quickdraft models list`)"
        )
    probes = list(_PROBES) + ["".join(f"x{tok}y" for tok in extra_tokens)]
    for probe in probes:
        a = target_tokenizer.encode(probe, add_special_tokens=False)
        b = draft_tokenizer.encode(probe, add_special_tokens=False)
        if a != b:
            raise TokenizerMismatchError(
                f"{target_name} and {draft_name} tokenize text differently (probe {probe[:30]!r}: "
                f"{a[:8]} vs {b[:8]}). Pick a draft of the same model family"
            )
        high = [i for i in a if i >= shared_vocab_size]
        if high:
            raise TokenizerMismatchError(
                f"{target_name} encodes ordinary text to ids {high[:4]} beyond the {draft_name}'s "
                f"{shared_vocab_size:,}-row embedding"
            )


def detect_family(tokenizer, model_type: str | None) -> str | None:
    vocab = tokenizer.get_vocab()
    if "<|fim_prefix|>" in vocab:
        return "qwen2.5-coder"
    if "<fim_prefix>" in vocab:
        return "starcoder2"
    if "<｜fim▁begin｜>" in vocab:
        return "deepseek-coder"
    if "▁<PRE>" in vocab or model_type == "llama" and "<s>" in vocab:
        return "codellama"
    return None


def stop_token_ids_for(tokenizer, family: str, models: list[Any]) -> tuple[set[int], list[str]]:
    """EOS ids (tokenizer, configs, generation configs) and the family's stop tokens in vocab."""
    vocab = tokenizer.get_vocab()
    ids: set[int] = set()
    names: list[str] = []
    for token in STOP_TOKENS.get(family, ()):
        if token in vocab:
            ids.add(vocab[token])
            names.append(token)

    def add(value):
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple, set)) else [value]:
            if isinstance(v, int) and v >= 0:
                ids.add(v)

    add(tokenizer.eos_token_id)
    for model in models:
        if model is None:
            continue
        add(getattr(model.config, "eos_token_id", None))
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            add(getattr(gen, "eos_token_id", None))
    id_to_token = {i: t for t, i in vocab.items()}
    for i in sorted(ids):
        token = id_to_token.get(i)
        if token is not None and token not in names:
            names.append(token)
    return ids, names


# --- loading --------------------------------------------------------------------------------


def _checkpoint_dtype(path: Path) -> torch.dtype | None:
    import json

    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    return _TORCH_DTYPES.get(name) if isinstance(name, str) else None


def _load_one(resolved: ResolvedModel, dtype: str, device: torch.device, int8_backend: str | None):
    """Load one torch model; half-precision checkpoints load as stored (half the peak memory)
    and are cast afterwards, their input embedding kept as stored (StoredEmbedding)."""
    from transformers import AutoModelForCausalLM

    stored = _checkpoint_dtype(resolved.path)
    half = stored if stored in (torch.bfloat16, torch.float16) else None
    compute = torch.float32 if dtype == "int8" else _TORCH_DTYPES[dtype]
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


def _load_tokenizer(resolved: ResolvedModel):
    from transformers import AutoTokenizer

    if resolved.gguf is not None and not store.is_complete(resolved.path):
        convert.ensure_tokenizer(resolved.gguf, resolved.path)
    try:
        return AutoTokenizer.from_pretrained(resolved.path)
    except Exception as exc:
        raise ModelError(
            f"cannot load the tokenizer of {resolved.reference} from {resolved.path}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _ensure_weights(resolved: ResolvedModel, progress: Progress | None) -> None:
    """Torch needs weights: convert a GGUF-only model once (models/convert.py)."""
    from quickdraft.decoding import llamacpp

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


def _plan(config: ModelConfig, device: torch.device) -> tuple[Preset | None, str, str | None]:
    """(preset, target reference, draft reference or None) from the configuration."""
    draft = config.draft
    no_draft = isinstance(draft, str) and draft.strip().lower() == "none"
    if no_draft:
        draft = None
    preset: Preset | None = None
    if config.preset is not None:
        if config.preset not in PRESETS:
            raise ModelNotFoundError(
                f"unknown preset {config.preset!r}; presets: {', '.join(PRESETS)}"
            )
        preset = PRESETS[config.preset]
    target = config.target
    if target is None and preset is None:
        preset = PRESETS[default_preset(device.type)]
    if target is not None and preset is None and target in PRESETS and draft is None:
        preset = PRESETS[target]  # `--target qwen2.5-coder-1.5b` means the whole preset
        target = None
    if target is None:
        target = preset.name
    if draft is None and not no_draft and preset is not None and preset.draft is not None:
        draft = f"{preset.name}:draft"  # the preset fills each of target and draft when unset
    return preset, target, draft


Progress = Callable[[str], None]
"""Told, in a few words, what loading is doing now (shown to the user)."""


def _say(progress: Progress | None, message: str) -> None:
    log.info("%s", message)
    if progress is not None:
        progress(message)


def load_models(
    config: ModelConfig, *, home: Path | None = None, progress: Progress | None = None
) -> LoadedModels:
    """Load target (and draft) as configured. Raises ModelError subclasses for user errors."""
    from quickdraft.models import cpu_kernels
    from quickdraft.models.runtime import ModelShape, choose_runtime

    started = time.monotonic()
    device = resolve_device(config.device)
    preset, target_ref, draft_ref = _plan(config, device)

    target_info = resolve_reference(target_ref, home)
    draft_info = None
    if draft_ref is not None:
        if draft_ref.endswith(":draft") and draft_ref[: -len(":draft")] in PRESETS:
            name = draft_ref[: -len(":draft")]
            draft_info = resolve_source(PRESETS[name].draft, name + " (draft)", home)
        else:
            draft_info = resolve_reference(draft_ref, home)

    threads = None
    if device.type == "cpu":
        threads = config.threads or physical_cores()
        torch.set_num_threads(threads)

    @functools.cache
    def shape() -> ModelShape:
        """The target's shape: a preset knows it; else read once (a GGUF's metadata takes
        gguf's reader 5-20 s to parse: its 150k-token vocabulary is read in Python)."""
        if preset is not None and target_info.kind.startswith("preset"):
            return ModelShape.of(preset.target.arch)
        if target_info.gguf is not None:
            return ModelShape.from_gguf(target_info.gguf)
        from transformers import AutoConfig

        return ModelShape.of(AutoConfig.from_pretrained(target_info.path))

    measured: list[KernelChoice] = []

    def kernel() -> KernelChoice:
        if not measured:
            measured.append(cpu_kernels.choose(shape(), threads or 1, home=home, progress=progress))
        return measured[0]

    runtime = choose_runtime(
        config.runtime,
        device_type=device.type,
        gguf=target_info.gguf,
        shape=shape,
        threads=threads or 1,
        kernel=kernel,
        progress=progress,
        home=home,
    )
    log.info("runtime %s: %s", runtime.runtime, runtime.reason)

    _say(progress, f"loading the tokenizer of {target_info.path.name}")
    tokenizer = _load_tokenizer(target_info)
    draft_tokenizer = _load_tokenizer(draft_info) if draft_info is not None else None
    chosen_kernel: KernelChoice | None = None
    if runtime.runtime == "llamacpp":
        from quickdraft.decoding.llamacpp import LlamaCppModel

        extra = runtime.probe.extra_bufts if runtime.probe is not None else True
        if draft_info is not None and draft_info.gguf is None:
            raise ModelNotFoundError(
                f"the llama.cpp runtime needs the draft as a GGUF file too; {draft_info.reference}"
                " has none (use --runtime torch, or a GGUF draft)"
            )
        _say(progress, f"loading {target_info.gguf.name} in llama.cpp")
        target = LlamaCppModel(target_info.gguf, threads=threads or 1, extra_bufts=extra)
        draft = None
        if draft_info is not None:
            _say(progress, f"loading the draft {draft_info.gguf.name} in llama.cpp")
            draft = LlamaCppModel(draft_info.gguf, threads=threads or 1, extra_bufts=extra)
        dtype = "gguf"
        target_rows, model_type = target.vocab_size, None
        draft_rows = draft.vocab_size if draft is not None else None
        config_models: list[Any] = []
    else:
        for info in (target_info, draft_info):
            if info is not None:
                _ensure_weights(info, progress)
        dtype = resolve_dtype(config.dtype, device, _checkpoint_dtype(target_info.path), kernel)
        backend = None
        if dtype == "int8":
            chosen_kernel = kernel()
            backend = chosen_kernel.int8_backend or best_int8_backend(chosen_kernel)
        elif config.dtype == "auto" and device.type == "cpu" and measured:
            chosen_kernel = measured[0]
        how = f"int8 ({backend})" if dtype == "int8" else dtype
        _say(progress, f"loading the target {target_info.path.name} in torch, {how}")
        target = _load_one(target_info, dtype, device, backend)
        draft = None
        if draft_info is not None:
            _say(progress, f"loading the draft {draft_info.path.name} in torch, {how}")
            draft = _load_one(draft_info, dtype, device, backend)
        target_rows = target.get_input_embeddings().weight.shape[0]
        draft_rows = draft.get_input_embeddings().weight.shape[0] if draft is not None else None
        model_type = getattr(target.config, "model_type", None)
        config_models = [target, draft]

    family = preset.family if preset is not None else detect_family(tokenizer, model_type)
    if family is None:
        raise ModelError(
            f"cannot tell the FIM family of {target_ref} (no known infilling tokens in its "
            "vocabulary); use a preset or a Qwen2.5-Coder, DeepSeek-Coder, StarCoder2 or CodeLlama model"
        )
    shared = target_rows
    if draft_info is not None and draft_tokenizer is not None:
        shared = min(target_rows, draft_rows)
        check_tokenizers(
            tokenizer,
            draft_tokenizer,
            shared,
            target_name=f"target {target_info.reference}",
            draft_name=f"draft {draft_info.reference}",
            extra_tokens=STOP_TOKENS.get(family, ()),
        )
    stop_ids, stop_names = stop_token_ids_for(tokenizer, family, config_models)
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
    )


def best_int8_backend(kernel: KernelChoice) -> str:
    """`dtype: int8` asked for explicitly: the fastest exact int8 backend measured here, even
    where float32 would be faster (the log says so)."""
    from quickdraft.models.cpu_kernels import score
    from quickdraft.models.quantize import default_int8_backend

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

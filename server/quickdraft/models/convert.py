"""GGUF -> a model directory: its tokenizer files, and for the torch runtime its weights.

The llama.cpp runtime runs the GGUF file itself and needs only a tokenizer for prompts
(`extract_tokenizer`: seconds). The torch runtime needs weights transformers can load:
transformers reads a GGUF file (`from_pretrained(dir, gguf_file=...)`) and dequantizes every
tensor, which takes a minute or two and peaks at several times the model's size in memory, so
`convert_gguf` does it once and saves a normal Hugging Face directory (model + tokenizer).

Storage dtype: bfloat16. It halves the disk and load time against float32, it is the dtype the
original Qwen2.5-Coder checkpoints ship in, and the rounding it adds (relative 2^-9) is far below
the Q4_K quantization error already in the weights. Loading upcasts to the runtime dtype; every
decoding strategy sees the same upcast weights, so greedy identity is unaffected.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.errors import ModelError
from quickdraft.models import store

if TYPE_CHECKING:  # pragma: no cover
    import torch

STORAGE_DTYPE = "bfloat16"  # torch is imported only when a conversion runs


def _quiet_transformers():
    """transformers warns that packed GGUF weights run best in float32: true, and irrelevant
    to a conversion that unpacks every weight anyway."""
    from transformers.utils import logging as hf_logging  # heavy: a conversion only

    @contextmanager
    def quiet():
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)

    return quiet()


def _tokenizer_into(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer  # heavy: `models fetch` imports this module

    with _quiet_transformers():
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name
            )
        except Exception as exc:  # transformers raises many kinds here
            raise ModelError(
                f"cannot read the tokenizer of {gguf_path}: {type(exc).__name__}: {exc}"
            ) from exc
    tokenizer.save_pretrained(out)


def _convert_into(gguf_path: Path, out: Path, dtype: torch.dtype) -> dict[str, Any]:
    """Load `gguf_path` with transformers and save model + tokenizer into `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: a conversion only

    directory, name = str(gguf_path.parent), gguf_path.name
    with _quiet_transformers():
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype)
        except Exception as exc:  # transformers raises many kinds here
            raise ModelError(f"cannot convert {gguf_path}: {type(exc).__name__}: {exc}") from exc
    _drop_gguf_quantizer(model, gguf_path)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _drop_gguf_quantizer(model, gguf_path: Path) -> None:
    """Make a dequantized GGUF model an ordinary one, so `save_pretrained` writes safetensors.

    transformers attaches its GGUF quantizer even when every weight was unpacked into a plain
    `nn.Linear` (no GGUF kernels on CPU), and then refuses to save. Refuse ourselves if any
    module still holds packed blocks; otherwise detach the quantizer and its config entry.
    """
    packed = {type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()}
    if packed:
        raise ModelError(
            f"cannot convert {gguf_path}: transformers kept packed GGUF modules ({', '.join(packed)})"
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = gguf_path.name


# Tests replace this to simulate a crash half way; the real one is `_convert_into`.
CONVERTER: Callable[[Path, Path, Any], dict[str, Any]] = _convert_into


def convert_gguf(
    gguf_path: Path,
    final_dir: Path,
    *,
    dtype: str = STORAGE_DTYPE,
    info: dict[str, Any] | None = None,
) -> Path:
    """Convert `gguf_path` into `final_dir`, tokenizer and weights (atomic: temp dir, marker
    written last, rename)."""
    import torch  # imported only when a conversion runs (`models fetch` must not pay for it)

    started = time.monotonic()
    meta = dict(info or {}, gguf=str(gguf_path), storage_dtype=dtype, weights=True)
    torch_dtype = getattr(torch, dtype)
    with store.building(final_dir, meta) as temp:
        meta.update(CONVERTER(gguf_path, temp, torch_dtype))
        meta["convert_seconds"] = round(time.monotonic() - started, 1)
    return final_dir


def extract_tokenizer(
    gguf_path: Path, final_dir: Path, *, info: dict[str, Any] | None = None
) -> Path:
    """Make `final_dir` a tokenizer-only model directory for `gguf_path` (llama.cpp runs the
    GGUF itself). Atomic like `convert_gguf`."""
    meta = dict(info or {}, gguf=str(gguf_path), weights=False)
    with store.building(final_dir, meta) as temp:
        _tokenizer_into(gguf_path, temp)
    return final_dir


def ensure_weights(
    directory: Path,
    gguf_path: Path | None,
    *,
    keep_gguf: bool,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Give a tokenizer-only model directory its weights, converting its GGUF (once).

    `keep_gguf`: whether the GGUF file stays afterwards (llama.cpp is installed and may run
    it); otherwise it is deleted, so the cache does not hold the same model twice.
    """
    if store.is_complete(directory) and store.has_weights(directory):
        return directory
    if gguf_path is None or not gguf_path.is_file():
        raise ModelError(
            f"{directory} has no weights for the torch runtime and its GGUF file is gone; "
            "fetch the model again (`quickdraft models fetch PRESET`)"
        )
    info = {k: v for k, v in store.read_marker(directory).items() if k != "completed_at"}
    if progress is not None:
        progress(f"converting {gguf_path.name} for the torch runtime (once; a minute or two)")
    convert_gguf(gguf_path, directory, info=info)
    if not keep_gguf:
        gguf_path.unlink(missing_ok=True)
    return directory


def gguf_cache_key(path: Path, *, hash_limit: int = 64 << 20) -> str:
    """A key for a user's `.gguf` file: sha256 of small files, else size + mtime + head hash.

    Hashing a multi-GiB file on every start would cost seconds, so large files are keyed by
    size, modification time and the sha256 of their first MiB.
    """
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if stat.st_size <= hash_limit:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        else:
            digest.update(handle.read(1 << 20))
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def converted_path_for(gguf_path: Path, home: Path | None = None) -> Path:
    key = gguf_cache_key(gguf_path)
    stem = gguf_path.name.removesuffix(".gguf")
    return store.converted_dir(home) / f"{stem}-{key}"


def ensure_tokenizer(gguf_path: Path, directory: Path) -> Path:
    """The model directory for a `.gguf` file, holding at least its tokenizer."""
    if not store.is_complete(directory):
        extract_tokenizer(gguf_path, directory, info={"source": "gguf-file"})
    return directory

"""A GGUF model loaded in llama.cpp: the file itself, mmapped once, no conversion.

`LlamaCppModel` loads a GGUF through llama-cpp-python's low-level API (`pip install -e
'.[llama]'`); the engine runs it through `decoding.llamacpp.LlamaCppRunner`, a KV cache per
slot, for which it has the `decoding.llamacpp.LlamaCppWeights` contract. Which settings work
here, and what a forward costs, is measured by `models.llamacpp_probe`.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.decoding.llamacpp import library
from quickdraft.errors import ModelError, ModelNotFoundError
from quickdraft.models.references import ResolvedModel


@dataclass
class LlamaCppModel:
    """A GGUF model loaded once; every runner (KV cache) made from it shares its weights."""

    path: Path
    threads: int
    extra_bufts: bool = True
    n_ctx: int = 4096
    _handle: Any = field(default=None, repr=False)
    vocab_size: int = 0
    layers: int = 0
    hidden_size: int = 0
    parameters: int = 0
    size_bytes: int = 0
    description: str = ""
    n_ctx_train: int = 0
    kv_bytes_per_token: int = 0

    def __post_init__(self) -> None:
        lib = library()
        params = lib.llama_model_default_params()
        params.use_extra_bufts = bool(self.extra_bufts)
        params.n_gpu_layers = -1  # Metal on Apple silicon; a CPU build ignores it
        handle = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            raise ModelError(f"llama.cpp could not load {self.path}")
        self._handle = handle
        vocab = lib.llama_model_get_vocab(handle)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.layers = int(lib.llama_model_n_layer(handle))
        self.hidden_size = int(lib.llama_model_n_embd(handle))
        self.parameters = int(lib.llama_model_n_params(handle))
        self.size_bytes = int(lib.llama_model_size(handle))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(handle))
        heads = max(int(lib.llama_model_n_head(handle)), 1)
        kv_heads = int(lib.llama_model_n_head_kv(handle)) or heads
        # f16 keys and values, every layer
        self.kv_bytes_per_token = 2 * self.layers * kv_heads * (self.hidden_size // heads) * 2
        buffer = ctypes.create_string_buffer(256)
        lib.llama_model_desc(handle, buffer, ctypes.sizeof(buffer))
        self.description = buffer.value.decode("utf-8", "replace")

    @property
    def handle(self):
        return self._handle

    def close(self) -> None:
        if self._handle:
            library().llama_model_free(self._handle)
            self._handle = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        with contextlib.suppress(Exception):
            self.close()

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": "llamacpp",
            "path": str(self.path),
            "description": self.description,
            "parameters": self.parameters,
            "file_bytes": self.size_bytes,
            "layers": self.layers,
            "hidden_size": self.hidden_size,
            "vocab_rows": self.vocab_size,
            "extra_buffers": self.extra_bufts,
        }


def load_llamacpp_models(
    target_info: ResolvedModel,
    draft_info: ResolvedModel | None,
    threads: int,
    extra_bufts: bool,
    draft_extra_bufts: bool,
    say: Callable[[str], None],
) -> tuple[LlamaCppModel, LlamaCppModel | None]:
    """Target and draft (None: no draft) loaded from their GGUF files; each step told to `say`.
    Raises ModelNotFoundError when the draft has no GGUF."""
    if draft_info is not None and draft_info.gguf is None:
        raise ModelNotFoundError(
            f"the llama.cpp runtime needs the draft as a GGUF file too; {draft_info.reference}"
            " has none (use --runtime torch, or a GGUF draft)"
        )
    say(f"loading {target_info.gguf.name} in llama.cpp")
    target = LlamaCppModel(target_info.gguf, threads=threads, extra_bufts=extra_bufts)
    if draft_info is None:
        return target, None
    say(f"loading the draft {draft_info.gguf.name} in llama.cpp")
    return target, LlamaCppModel(draft_info.gguf, threads=threads, extra_bufts=draft_extra_bufts)

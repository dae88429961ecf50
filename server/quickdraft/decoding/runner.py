"""One causal LM and its KV cache, and the exact tokens whose keys and values the cache holds.

Knowing those tokens is what lets a new request reuse the cache: the longest common prefix of
the cached tokens and the new sequence is kept, everything after it is cropped, and only the
rest is computed. Every forward appends to `tokens`; every `keep(n)` truncates both together, so
the two never disagree.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts share long prefixes, and list slices compare in C.
    block = 256
    while i + block <= n and a[i : i + block] == b[i : i + block]:
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Runner(Protocol):
    """What the engine needs of a model with a KV cache: `ModelRunner`, `StaticModelRunner`
    (torch) and `decoding.llamacpp.LlamaCppRunner` (llama.cpp)."""

    device: torch.device
    vocab_size: int
    prefill_chunk: int
    tokens: list[int]
    """The tokens whose keys and values the cache holds, in order."""

    def reset(self) -> None: ...

    def keep(self, n: int) -> None: ...

    def forward(self, new_tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor: ...

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> tuple[int, int, torch.Tensor | None]: ...

    def logits_after(self, tokens: Sequence[int]) -> torch.Tensor: ...


PREFILL_CHUNK = 128
"""Tokens per prefill forward on a CPU: cancellation is checked between chunks, so a
superseding request waits for at most one chunk. Accelerators take larger chunks."""


def make_runner(model: Any, static_cache_tokens: int | None = None, compile_steps: bool = False):
    """The runner for `model`: llama.cpp's for a `LlamaCppModel`, else a torch runner (on a
    preallocated static cache when `static_cache_tokens` is set)."""
    from quickdraft.decoding.llamacpp import LlamaCppModel, LlamaCppRunner

    if isinstance(model, LlamaCppModel):
        return LlamaCppRunner(model)
    device = next(model.parameters()).device
    chunk = PREFILL_CHUNK if device.type == "cpu" else 512
    if static_cache_tokens is None:
        return ModelRunner(model, prefill_chunk=chunk)
    return StaticModelRunner(
        model, capacity=static_cache_tokens, compile_steps=compile_steps, prefill_chunk=chunk
    )


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


class ModelRunner:
    """Runs `model` over new tokens on top of a persistent KV cache."""

    def __init__(self, model: torch.nn.Module, *, prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        self.prefill_chunk = prefill_chunk
        params = inspect.signature(model.forward).parameters
        # transformers 5 names the argument `cache`, 4.x `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self.cache = self._make_cache()
        self.tokens: list[int] = []

    def reset(self) -> None:
        """Forget everything: the next request prefills from scratch."""
        self.cache = self._make_cache()
        self.tokens = []

    def _make_cache(self):
        return _new_cache()

    def keep(self, n: int) -> None:
        """Crop the cache to its first `n` tokens."""
        remove = len(self.tokens) - n
        if remove > 0:
            # A negative argument removes that many tokens (transformers 4.x and 5.x agree).
            self.cache.crop(-remove)
            del self.tokens[n:]

    @torch.inference_mode()
    def forward(self, new_tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Append `new_tokens` to the cache and return their logits as float32.

        Shapes: input_ids (1, n) -> logits (1, n, V) -> returned (n, V), or (1, V) if `last_only`.
        """
        input_ids = torch.tensor([list(new_tokens)], dtype=torch.long, device=self.device)
        kwargs = {self._cache_arg: self.cache, "use_cache": True}
        if last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, **kwargs)
        self.tokens.extend(int(t) for t in new_tokens)
        logits = out.logits[0]
        if last_only:
            logits = logits[-1:]
        return logits.float()

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> tuple[int, int, torch.Tensor | None]:
        """Make the cache hold exactly `tokens`, computing only what is not cached yet.

        Returns (reused, computed, logits after the last token or None if nothing was computed).
        Long tails are computed in chunks, checking `cancel` and `deadline` between chunks; a
        stopped extend leaves the cache valid, holding a prefix of `tokens`.
        """
        reused = common_prefix_length(self.tokens, tokens)
        self.keep(reused)
        logits = None
        position = reused
        while position < len(tokens):
            if (cancel is not None and cancel.is_set()) or (
                deadline is not None and time.monotonic() >= deadline
            ):
                break
            chunk = tokens[position : position + self.prefill_chunk]
            logits = self.forward(chunk, last_only=True)[-1]
            position += len(chunk)
        return reused, position - reused, logits

    def logits_after(self, tokens: Sequence[int]) -> torch.Tensor:
        """Logits for the token that follows `tokens`; the cache then holds `tokens`."""
        if common_prefix_length(self.tokens, tokens) >= len(tokens):
            # Everything is cached but we need the last position's logits: recompute it.
            self.keep(len(tokens) - 1)
        _, _, logits = self.extend(tokens)
        assert logits is not None
        return logits


STEP_BUCKETS = (1, 2, 4, 8, 16)
"""Decode and verify forwards are padded to one of these sizes, so a compiled step is reused."""


class StaticModelRunner(ModelRunner):
    """The same runner on a preallocated KV cache, with compiled decode/verify steps (gpt-fast's
    recipe for accelerators: fixed shapes let torch.compile capture each step once, as a CUDA
    graph with mode="reduce-overhead").

    The cache holds `capacity` positions. Cropping only shortens `tokens`: keys and values past
    it stay in memory but are never attended to (the causal mask stops at each query's
    position) and are overwritten by the next forward. A step of n new tokens is padded to the
    next bucket size; the padding writes past the kept tokens, where nothing reads it.
    Prefill chunks run eagerly. A sequence longer than `capacity` reallocates a cache twice
    as large (and recompiles).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        capacity: int = 4096,
        compile_steps: bool = False,
        compile_backend: str = "inductor",
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        self.capacity = capacity
        super().__init__(model, prefill_chunk=prefill_chunk)
        self._step = model.forward
        if compile_steps:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            if compile_backend != "inductor":
                mode = None  # modes are inductor's
            self._step = torch.compile(
                model.forward, backend=compile_backend, mode=mode, fullgraph=True, dynamic=False
            )

    def _make_cache(self):
        from transformers import StaticCache

        self._written = 0  # positions the cache has written, padding included
        self._allocated = self.capacity
        return StaticCache(config=self.model.config, max_cache_len=self.capacity)

    def reset(self) -> None:
        """Forget everything, keeping the same cache tensors: a compiled step (a CUDA graph)
        is bound to their addresses, and new ones would mean compiling again."""
        if self._allocated != self.capacity:
            super().reset()
            return
        self.tokens = []
        self._rewind(0)

    def keep(self, n: int) -> None:
        del self.tokens[n:]
        self._rewind(len(self.tokens))

    def _rewind(self, n: int) -> None:
        """Make the cache write its next keys and values at position n."""
        if self._written > n:
            # transformers 5 static layers count what they hold and write after it; a negative
            # crop moves that count back (the stale entries stay, masked, until overwritten).
            crop = getattr(self.cache, "crop", None)
            if crop is not None:
                with torch.inference_mode():  # the count was made in inference mode
                    crop(-(self._written - n))
            self._written = n

    def _grow(self, needed: int) -> None:
        tokens = list(self.tokens)
        while self.capacity < needed:
            self.capacity *= 2
        self.reset()
        if tokens:
            self.extend(tokens)

    @torch.inference_mode()
    def forward(self, new_tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """As ModelRunner.forward; shapes: input_ids (1, bucket) -> logits (n, V) or (1, V)."""
        n = len(new_tokens)
        start = len(self.tokens)
        self._rewind(start)  # drop the previous step's padding
        bucket = next((b for b in STEP_BUCKETS if b >= n), None)
        width = bucket if bucket is not None and not last_only else n
        if start + width > self.capacity:
            self._grow(start + width)
        ids = list(new_tokens) + [0] * (width - n)  # padding: written past `tokens`, unread
        positions = torch.arange(start, start + width, device=self.device)
        kwargs = {
            self._cache_arg: self.cache,
            "use_cache": True,
            "cache_position": positions,
            "position_ids": positions.unsqueeze(0),
        }
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        if width == bucket:
            out = self._step(input_ids=input_ids, **kwargs)
        else:  # prefill chunks and oversized steps: eager, any shape
            if last_only and self._has_logits_to_keep:
                kwargs["logits_to_keep"] = 1
            out = self.model(input_ids=input_ids, **kwargs)
        self._written = start + width
        self.tokens.extend(int(t) for t in new_tokens)
        logits = out.logits[0]
        logits = logits[-1:] if last_only else logits[:n]
        # A CUDA graph reuses its output buffer on the next replay: hand out a copy.
        return logits.float().clone()

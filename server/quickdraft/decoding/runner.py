"""One causal LM and its KV caches, and the exact tokens whose keys and values a cache holds.

Knowing those tokens is what lets a new request reuse the cache: the longest common prefix of
the cached tokens and the new sequence is kept, everything after it is cropped, and only the
rest is computed. Every forward appends to `tokens`; every `keep(n)` truncates both together, so
the two never disagree.

Slots: a runner keeps one cache per document (`select(slot)`), so switching to another file
and back finds each file's cache as it was. Caches not in use are kept least recently used
first within a memory budget (`slot_bytes`); beyond it the oldest are dropped.

Shared prefixes: the documents of a workspace start their prompts with the same head. When
another slot's cache shares at least `SHARED_PREFIX_MIN` more leading tokens with a request
than the slot's own cache does, `extend` adopts that prefix instead of computing it: by
reference where the runtime allows (llama.cpp's unified cells, views of torch tensors, the one
static cache's positions), and says how many tokens it took that way (`last_adopted`). Callers
do nothing for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from quickdraft import prefill_progress


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
    (torch) and `decoding.llamacpp.LlamaCppRunner` (llama.cpp); `engine.make_runner` makes the
    one a model needs. decoding defines this contract; models/ only loads what runs on it."""

    device: torch.device
    vocab_size: int
    prefill_chunk: int
    tokens: list[int]
    """The tokens whose keys and values the cache holds, in order."""
    slot: str | None
    """The cache in use (a document), None for the default one."""
    last_adopted: int
    """How many of the last `extend`'s reused tokens came from another slot's cache, beyond
    what the slot's own cache held (0: it adopted nothing)."""

    def select(self, slot: str | None) -> None: ...

    def reset(self) -> None: ...

    def reset_all(self) -> None: ...

    def keep(self, n: int) -> None: ...

    def forward(
        self, new_tokens: Sequence[int], *, last_only: bool = False, prompt: Sequence[int] = ()
    ) -> torch.Tensor: ...

    def stopping_at(
        self, cancel: threading.Event | None
    ) -> contextlib.AbstractContextManager[None]:
        """Within it, a forward that is running stops part way once `cancel` is set (torch:
        at the next decoder layer of a decode or verify forward, prefill chunks running whole;
        llama.cpp: between graph nodes, prefill chunks too) and raises
        `ForwardCancelled`, the cache as it was before that forward. Where a runtime cannot
        stop part way, forwards run whole and the caller's checks between them stop it."""
        ...

    supports_tree: bool
    """Whether `forward_tree` and `keep_tree_path` (ModelRunner's) are there and exact."""

    folds_prompt: bool
    """Whether `extend` may leave a short uncached tail of the prompt (`leave`) for the first
    decode forward to compute, as `forward` and `forward_tree` take it (`prompt`: ModelRunner's
    with row-wise attention, exactly as a prefill would); elsewhere `leave` is ignored."""

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        leave: int = 0,
    ) -> tuple[int, int, torch.Tensor | None]: ...

    def logits_after(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> torch.Tensor | None: ...


SHARED_PREFIX_MIN = 16
"""Another slot's cache is adopted when it shares at least this many more leading tokens with
a request than the slot's own cache does: a shorter gain is not worth dropping the own cache."""


def refuse_prompt_rows(prompt: Sequence[int]) -> None:
    """A runner that does not fold (`Runner.folds_prompt` False) is never given prompt rows."""
    if prompt:
        raise RuntimeError("this runner prefills every prompt token: it takes no prompt rows")


class ForwardCancelled(Exception):
    """A forward stopped part way because its request was cancelled (`Runner.stopping_at`):
    the runner's cache is as it was before the forward. The engine turns it into the stop
    reason "cancelled"; it never leaves decoding."""


def best_shared_prefix(
    tokens: Sequence[int], own: int, others: Iterable[tuple[Any, Sequence[int], int]]
) -> tuple[int, Any] | None:
    """Among other slots' caches, given as (key, the tokens it holds, how many leading ones of
    them may be reused), the one sharing the longest prefix with `tokens`: (its length, its key),
    or None unless it beats `own` (what the slot's own cache offers) by `SHARED_PREFIX_MIN`."""
    best: tuple[int, Any] | None = None
    for key, held, usable in others:
        if usable < own + SHARED_PREFIX_MIN:
            continue
        shared = min(common_prefix_length(held, tokens), usable)
        if shared >= own + SHARED_PREFIX_MIN and (best is None or shared > best[0]):
            best = (shared, key)
    return best


def stopped(cancel: threading.Event | None, deadline: float | None) -> bool:
    """Whether `cancel` is set or `deadline` (time.monotonic()) has passed."""
    return (cancel is not None and cancel.is_set()) or (
        deadline is not None and time.monotonic() >= deadline
    )


def extend_in_chunks(
    runner: Runner,
    tokens: Sequence[int],
    forward_chunk: Callable[[Sequence[int]], torch.Tensor | None],
    *,
    reused: int | None = None,
    cancel: threading.Event | None = None,
    deadline: float | None = None,
) -> tuple[int, int, torch.Tensor | None]:
    """Every runner's `extend`: keep the first `reused` cached tokens (None: the longest prefix
    the cache shares with `tokens`), then compute the rest by `forward_chunk` (a prefill
    forward, returning the chunk's last logits, or None when a cancel stopped it part way),
    checking `cancel` and `deadline` before each chunk. A prefill of more than one chunk reports
    its progress (`quickdraft.prefill_progress`: the server shows a long one).

    A chunk holds at most `runner.prefill_chunk` tokens and, but for the last, ends on a
    multiple of PREFILL_BLOCK (row-wise attention computes prefill rows in aligned blocks,
    cheapest whole). So a warm tail that fits in one chunk is one forward wherever it starts:
    each forward reads all of the weights once (a 293-token tail after 1,400 cached tokens
    was two forwards when chunks ended on multiples of the chunk size). Returns
    (reused, computed, logits after the last token or None if nothing was computed); the cache
    then holds a prefix of `tokens`, all of it unless stopped.
    """
    if reused is None:
        reused = common_prefix_length(runner.tokens, tokens)
    runner.keep(reused)
    logits = None
    position = reused
    to_compute = len(tokens) - reused
    reporting = to_compute > runner.prefill_chunk  # more than one forward: someone may wait
    if reporting:
        prefill_progress.report(0, to_compute)
    while position < len(tokens) and not stopped(cancel, deadline):
        end = min(position + runner.prefill_chunk, len(tokens))
        if end < len(tokens) and end - end % PREFILL_BLOCK > position:
            end -= end % PREFILL_BLOCK
        chunk = tokens[position:end]
        logits = forward_chunk(chunk)
        if logits is None:  # stopped inside the forward: the cache holds what it computed
            position = len(runner.tokens)
            break
        position += len(chunk)
        if reporting:
            prefill_progress.report(position - reused, to_compute)
    return reused, position - reused, logits


def logits_after(
    runner: Runner,
    tokens: Sequence[int],
    extend: Callable[..., tuple[int, int, torch.Tensor | None]],
    *,
    cancel: threading.Event | None = None,
    deadline: float | None = None,
) -> torch.Tensor | None:
    """Every runner's `logits_after`: the logits for the token that follows `tokens`, the cache
    then holding `tokens` (by `extend`, reusing whatever it held). None when `cancel` or
    `deadline` stopped the catch-up first (the cache then holds a prefix of `tokens`)."""
    if common_prefix_length(runner.tokens, tokens) >= len(tokens):
        # Everything is cached but we need the last position's logits: recompute it.
        runner.keep(len(tokens) - 1)
    _, _, logits = extend(tokens, cancel=cancel, deadline=deadline)
    if len(runner.tokens) != len(tokens):
        return None
    return logits


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU): before and after a timed stretch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PREFILL_CHUNK = 128
"""Tokens per prefill forward on a CPU: cancellation is checked between chunks (a chunk's work
is the prefix the next request reuses), so a superseding request waits for at most one chunk.
Accelerators take larger chunks."""


DEFAULT_SLOT_BYTES = 256 << 20


def _new_cache():
    # transformers takes seconds to import: only once a torch model runs.
    from quickdraft.decoding.kv_cache import new_growing_cache

    return new_growing_cache()


def share_dynamic_cache(cache: Any, n: int) -> Any | None:
    """A new DynamicCache holding the first `n` positions of `cache` without copying them: its
    layers' keys and values are views of `cache`'s. Neither cache ever writes into the other's
    memory afterwards: the adopting cache's first forward copies the prefix into buffers of its
    own, and `cache` writes below `n` only into new buffers (decoding/kv_cache.py; a plain
    DynamicLayer concatenates into new tensors at every forward anyway). The computation is
    what is saved. None where the layers are not plain transformers 5 dynamic layers holding
    `n` positions (the caller then computes them)."""
    layers = _plain_layers(cache, "DynamicLayer")
    if layers is None:
        return None
    if any(layer.keys.shape[-2] < n or layer.values.shape[-2] < n for layer in layers):
        return None
    dynamic_layer = type(layers[0])
    shared = _new_cache()
    if getattr(shared, "layers", None) != []:
        return None
    for layer in layers:
        view = dynamic_layer()
        view.lazy_initialization(layer.keys, layer.values)
        view.keys, view.values = layer.keys[..., :n, :], layer.values[..., :n, :]
        shared.layers.append(view)
        if hasattr(layer, "shared"):  # a GrowingLayer: its first n positions are read elsewhere
            layer.shared = max(layer.shared, n)
    return shared


def head_dim(config: Any) -> int:
    """An attention head's dimension: the config's own, else hidden size over heads."""
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def kv_bytes_per_token(config: Any, element_bytes: int) -> int:
    """Keys and values one token takes in every layer's cache."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim(config) * element_bytes


ROWWISE_ATTENTION = "quickdraft_rowwise"
"""The attention implementation (`config._attn_implementation`) of a model that computes
prefill rows its own way (models.quantize.rowwise_attention: batch-invariant whatever the
chunking); the runners tell such a model of every forward whether it is a prefill."""

PREFILL_KWARG = "quickdraft_prefill"
"""A model forward given `quickdraft_prefill=True` (transformers hands extra keyword arguments
down to the attention function) is a prefill forward; False, a decode/verify step; a number n,
a decode/verify step whose first n rows are prompt tokens computed as a prefill computes them
(`ModelRunner.forward`'s `prompt`). The runners say it for every forward of a model with
`ROWWISE_ATTENTION`."""

PREFILL_BLOCK = 32
"""A `ROWWISE_ATTENTION` model's prefill rows attend in one call per aligned block of this many
positions (models.quantize.rowwise_attention), so prefill chunks end on its multiples
(`extend_in_chunks`): a block split between two chunks would be computed in both."""

TREE_KWARG = "quickdraft_tree"
"""A decode forward over a tree of proposals (`ModelRunner.forward_tree`) hands the attention
function, under this keyword, a `TreeKeys`: which cache positions each query row attends to."""


@dataclass(frozen=True)
class TreeKeys:
    """The keys of a tree forward's rows: row i attends to the `base` cached positions, then to
    the tree's nodes on its path (its ancestors, then itself) in order. `tails[i]` holds those
    nodes' cache positions, or None where they are already consecutive (`base .. base+depth`,
    the first branch), so that row reads a slice of the cache as a chain's step would."""

    base: int
    depths: list[int]
    tails: list[torch.Tensor | None]


def _prefill_kwargs(model: torch.nn.Module) -> dict[str, bool]:
    """What tells `model` a forward is a prefill: {} unless its attention is row-wise."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != ROWWISE_ATTENTION:
        return {}
    return {PREFILL_KWARG: True}


class ModelRunner:
    """Runs `model` over new tokens on top of persistent KV caches, one per slot."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        prefill_chunk: int = PREFILL_CHUNK,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        self.prefill_chunk = prefill_chunk
        params = inspect.signature(model.forward).parameters
        # transformers 5 names the argument `cache`, 4.x `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._prefill_kwargs = _prefill_kwargs(model)
        self.cache = self._make_cache()
        self.tokens: list[int] = []
        self.prefilled = 0
        """How many leading `tokens` a prefill computed. With row-wise attention a decode step
        computes a row another way than a prefill chunk; `extend` reuses only these."""
        self.slot: str | None = None
        self.slot_bytes = slot_bytes
        self.last_adopted = 0
        self._parked: OrderedDict[str | None, tuple[Any, list[int], int]] = OrderedDict()
        """Caches of the slots not in use, least recently used first."""
        kv_dtype = getattr(model.config, "dtype", None)  # the activations' dtype
        kv_dtype = kv_dtype if isinstance(kv_dtype, torch.dtype) else torch.float32
        self._token_bytes = kv_bytes_per_token(model.config, torch.finfo(kv_dtype).bits // 8)
        self._layers: list[torch.nn.Module] = _decoder_layers(model)
        """Where a forward may stop part way (`stopping_at`): before each decoder layer."""
        self._stop: threading.Event | None = None
        self._prefilling = False
        """Set during a prefill chunk's forward, which runs whole (see `stopping_at`)."""

    def select(self, slot: str | None) -> None:
        """Use the cache of `slot` (a new, empty one the first time); the one in use is kept,
        within the memory budget, for when its slot comes back."""
        if slot == self.slot:
            return
        self._parked[self.slot] = (self.cache, self.tokens, self.prefilled)
        self._parked.move_to_end(self.slot)
        found = self._parked.pop(slot, None)
        self.cache, self.tokens, self.prefilled = (
            found if found is not None else (self._make_cache(), [], 0)
        )
        self.slot = slot
        while self._parked and self.parked_bytes() > self.slot_bytes:
            self._parked.popitem(last=False)

    def parked_bytes(self) -> int:
        """The memory the caches of the slots not in use hold, what `slot_bytes` bounds: every
        tensor storage once, however many caches share it (an adopted prefix is a view of the
        other slot's tensors), and whole (a cropped cache is a view that keeps all of it). A
        cache without layer objects (transformers 4.x) counts as its tokens' keys and values."""
        storages: dict[int, int] = {}
        counted = 0
        for cache, tokens, _ in self._parked.values():
            layers = getattr(cache, "layers", None)
            if layers is None:
                counted += len(tokens) * self._token_bytes
                continue
            for layer in layers:
                for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
        return counted + sum(storages.values())

    @property
    def slots(self) -> list[str | None]:
        """The slots with a cache, least recently used first, the one in use last."""
        return [*self._parked, self.slot]

    def reset(self) -> None:
        """Forget the cache in use: the next request prefills from scratch."""
        self.cache = self._make_cache()
        self.tokens = []
        self.prefilled = 0

    def reset_all(self) -> None:
        """Forget every slot's cache."""
        self._parked.clear()
        self.reset()

    def _make_cache(self):
        return _new_cache()

    def keep(self, n: int) -> None:
        """Crop the cache to its first `n` tokens."""
        remove = len(self.tokens) - n
        if remove > 0:
            # A negative argument removes that many tokens (transformers 4.x and 5.x agree).
            self.cache.crop(-remove)
            del self.tokens[n:]
        self.prefilled = min(self.prefilled, n)

    @property
    def supports_tree(self) -> bool:
        """Whether `forward_tree` is exact here: with row-wise attention on a growing cache."""
        return bool(self._prefill_kwargs) and hasattr(self.cache, "layers")

    @property
    def folds_prompt(self) -> bool:
        """Whether `forward` and `forward_tree` compute `prompt` rows as a prefill does (with
        row-wise attention: a prefill row is the same whatever forward computes it)."""
        return bool(self._prefill_kwargs)

    @torch.inference_mode()
    def forward_tree(
        self, tokens: Sequence[int], parents: Sequence[int], *, prompt: Sequence[int] = ()
    ) -> torch.Tensor:
        """One forward over a tree of tokens on top of the cache: node 0 (`parents[0] == -1`) is
        the pending token, node i > 0 follows node `parents[i] < i`. Returns (n, V) float32
        logits; row i is what one-token steps along the path from node 0 to node i give for its
        last token, bitwise (row-wise attention gathers each row's keys in the order such a
        step sees them). The cache then holds every node; `keep_tree_path` keeps one path.
        `prompt`: tokens before the tree, computed in the same forward as `forward` does."""
        if not self.supports_tree:
            raise RuntimeError("forward_tree needs a model with row-wise attention")
        if len(tokens) != len(parents) or not tokens:
            raise ValueError(f"a tree of {len(tokens)} tokens with {len(parents)} parents")
        start = len(self.tokens)
        base = start + len(prompt)
        depths: list[int] = []
        tails: list[torch.Tensor | None] = []
        for i, parent in enumerate(parents):
            if parent != -1 if i == 0 else not 0 <= parent < i:
                raise ValueError(
                    f"tree node {i} has parent {parent}: node 0 is the root, parents come first"
                )
            path, node = [], i
            while node != -1:
                path.append(node)
                node = parents[node]
            depths.append(len(path) - 1)
            if path[0] == len(path) - 1:  # nodes 0..depth: consecutive
                tails.append(None)
            else:
                tails.append(torch.tensor([base + n for n in path[::-1]], device=self.device))
        tree = TreeKeys(base, depths, tails)
        input_ids = torch.tensor([[*prompt, *tokens]], dtype=torch.long, device=self.device)
        positions = torch.tensor(
            [[*range(start, base), *(base + d for d in depths)]],
            dtype=torch.long,
            device=self.device,
        )
        out = self._run_model(
            start,
            input_ids=input_ids,
            position_ids=positions,
            **{self._cache_arg: self.cache, "use_cache": True, TREE_KWARG: tree},
            **self._step_kwargs(False, len(prompt)),
            **self._logits_of_last(len(tokens) if prompt else 0),
        )
        self._append(start, prompt, tokens)
        self._tree_base = base
        return out.logits[0, -len(tokens) :].float()

    @torch.inference_mode()
    def keep_tree_path(self, path: Sequence[int]) -> None:
        """After `forward_tree`: keep node 0 and the nodes of `path` (each the child of the one
        before), moved to consecutive positions, and drop the rest of the tree."""
        base = self._tree_base
        rows = [0, *path]
        layers = _plain_layers(self.cache, "DynamicLayer")
        if layers is None:
            raise RuntimeError("keep_tree_path needs a growing (dynamic) cache")
        if rows != list(range(len(rows))):
            source = torch.tensor([base + r for r in rows], device=self.device)
            end = base + len(rows)
            for layer in layers:
                layer.keys[:, :, base:end] = layer.keys.index_select(2, source)
                layer.values[:, :, base:end] = layer.values.index_select(2, source)
        kept = [self.tokens[base + r] for r in rows]
        remove = len(self.tokens) - (base + len(rows))
        if remove > 0:
            self.cache.crop(-remove)
        del self.tokens[base:]
        self.tokens.extend(kept)
        self.prefilled = min(self.prefilled, base)

    @contextlib.contextmanager
    def stopping_at(self, cancel: threading.Event | None) -> Iterator[None]:
        """As `Runner.stopping_at`: a check of `cancel` before every decoder layer of a decode
        or verify forward (a hook each, there only while this holds; a layer is 1/28 of the
        1.5B's step), so a request that must run waits for one layer of the job it stops, not
        for its whole step, whose tokens it would throw away. A prefill chunk runs whole
        (cancel is checked between chunks): what it computes is the prefix the next request
        reuses, and stopping it part way would lose it; with keystrokes closer together than
        a chunk (0.4-1.0 s on 2 cores) a cold prompt would never get prefilled. An outer hold
        is kept as it is."""
        if cancel is None or self._stop is not None or not self._layers:
            yield
            return

        def check(_module: torch.nn.Module, _args: Any) -> None:
            if cancel.is_set() and not self._prefilling:
                raise ForwardCancelled()

        handles = [layer.register_forward_pre_hook(check) for layer in self._layers]
        self._stop = cancel
        try:
            yield
        finally:
            self._stop = None
            for handle in handles:
                handle.remove()

    def _run_model(self, start: int, **kwargs: Any) -> Any:
        """`self.model(**kwargs)` for a forward appending at `start`; stopped part way
        (`stopping_at`), the layers it reached are cut back to `start` and ForwardCancelled
        is raised."""
        try:
            return self.model(**kwargs)
        except ForwardCancelled:
            for layer in getattr(self.cache, "layers", ()):
                held = layer.keys.shape[-2] if getattr(layer, "is_initialized", False) else 0
                if held > start:
                    layer.crop(start - held)
            raise

    def _appended(self, start: int, prefill: bool) -> None:
        if prefill and self.prefilled == start:
            self.prefilled = len(self.tokens)

    def _append(
        self, start: int, prompt: Sequence[int], tokens: Sequence[int], *, prefill: bool = False
    ) -> None:
        """Record a forward's rows, appended at `start`: its `prompt` rows (computed as a
        prefill computes them), then `tokens` (a prefill chunk's when `prefill`)."""
        self.tokens.extend(int(t) for t in prompt)
        self._appended(start, bool(prompt))
        self.tokens.extend(int(t) for t in tokens)
        self._appended(start, prefill)

    def _step_kwargs(self, prefill: bool, prompt_rows: int = 0) -> dict[str, bool | int]:
        """{} for a model that computes every forward alike; else says which kind this is: a
        prefill, or a step whose first `prompt_rows` rows are prompt tokens (PREFILL_KWARG)."""
        if not self._prefill_kwargs:
            return {}
        if prefill:
            return self._prefill_kwargs
        return dict.fromkeys(self._prefill_kwargs, prompt_rows or False)

    def _logits_of_last(self, rows: int) -> dict[str, int]:
        """Asks the model for the logits of its last `rows` rows only, where it can (0: all)."""
        return {"logits_to_keep": rows} if rows and self._has_logits_to_keep else {}

    @torch.inference_mode()
    def forward(
        self,
        new_tokens: Sequence[int],
        *,
        last_only: bool = False,
        prefill: bool = False,
        prompt: Sequence[int] = (),
    ) -> torch.Tensor:
        """Append `new_tokens` to the cache and return their logits as float32. `prefill`:
        a prefill chunk (`extend`), not a decode/verify step. `prompt` (`folds_prompt`):
        prompt tokens a step computes first, in the same forward, exactly as a prefill chunk
        would (the cache then holds them as prefilled, and no logits are returned for them):
        a short uncached tail of the prompt (`extend`'s `leave`) then costs no forward of its
        own.

        Shapes: input_ids (1, n) -> logits (1, n, V) -> returned (n, V), or (1, V) if `last_only`.
        """
        if prefill or not self.folds_prompt:
            refuse_prompt_rows(prompt)
        input_ids = torch.tensor([[*prompt, *new_tokens]], dtype=torch.long, device=self.device)
        kwargs = {
            self._cache_arg: self.cache,
            "use_cache": True,
            **self._step_kwargs(prefill, len(prompt)),
            **self._logits_of_last(1 if last_only else len(new_tokens) if prompt else 0),
        }
        start = len(self.tokens)
        self._prefilling = prefill
        try:
            out = self._run_model(start, input_ids=input_ids, **kwargs)
        finally:
            self._prefilling = False
        self._append(start, prompt, new_tokens, prefill=prefill)
        logits = out.logits[0]
        return logits[-1:].float() if last_only else logits[-len(new_tokens) :].float()

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        leave: int = 0,
    ) -> tuple[int, int, torch.Tensor | None]:
        """Make the cache hold exactly `tokens`, computing only what is not cached yet.

        Returns (reused, computed, logits after the last token or None if nothing was computed).
        Long tails are computed in chunks, checking `cancel` and `deadline` between chunks; a
        stopped extend leaves the cache valid, holding a prefix of `tokens`. With row-wise
        attention only what a prefill computed is reused (decode steps compute a row another
        way), so the cache then holds bitwise what a cold prefill of `tokens` would.

        `leave` (`folds_prompt` runners): where at most that many tokens are not cached, they
        are left for the next forward's `prompt`, the cache holding the rest.
        """
        return self._extend(
            tokens, cancel=cancel, deadline=deadline, reuse_steps=False, leave=leave
        )

    def _extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        reuse_steps: bool,
        leave: int = 0,
    ) -> tuple[int, int, torch.Tensor | None]:
        reused = min(
            common_prefix_length(self.tokens, tokens),
            self._usable(self.tokens, self.prefilled, reuse_steps),
        )
        self.last_adopted = 0
        found = best_shared_prefix(
            tokens,
            reused,
            (
                (slot, held, self._usable(held, prefilled, reuse_steps))
                for slot, held, prefilled in self._donors()
            ),
        )
        if found is not None and self._adopt(found[1], found[0]):
            self.last_adopted = found[0] - reused
            reused = found[0]
        if self.folds_prompt and len(tokens) - reused <= leave:
            tokens = tokens[:reused]
        return extend_in_chunks(
            self, tokens, self._prefill_forward, reused=reused, cancel=cancel, deadline=deadline
        )

    def _usable(self, held: Sequence[int], prefilled: int, reuse_steps: bool) -> int:
        """How many leading tokens of a cache holding `held` an `extend` may keep: all, or with
        row-wise attention (and not `reuse_steps`) only what a prefill computed."""
        if self._prefill_kwargs and not reuse_steps:
            return min(len(held), prefilled)
        return len(held)

    def _donors(self) -> Iterable[tuple[str | None, list[int], int]]:
        """The other slots' caches a prefix may be adopted from: (slot, tokens, prefilled)."""
        return ((slot, held, prefilled) for slot, (_, held, prefilled) in self._parked.items())

    def _adopt(self, slot: str | None, n: int) -> bool:
        """Make the cache in use hold the first `n` tokens of parked `slot`'s, sharing its
        tensors (see `share_dynamic_cache`); False where its cache cannot be shared."""
        cache, held, prefilled = self._parked[slot]
        shared = share_dynamic_cache(cache, n)
        if shared is None:
            return False
        self.cache, self.tokens, self.prefilled = shared, list(held[:n]), min(prefilled, n)
        self._parked.move_to_end(slot)  # a prefix others use is worth keeping
        return True

    def _prefill_forward(self, chunk: Sequence[int]) -> torch.Tensor:
        return self.forward(chunk, last_only=True, prefill=True)[-1]

    def logits_after(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> torch.Tensor | None:
        """Logits for the token that follows `tokens`; the cache then holds `tokens`, reusing
        whatever it held (the draft model's use: its proposals need no exactness). Computed
        in chunks like `extend`; None when `cancel` or `deadline` stopped it first."""
        extend = functools.partial(self._extend, reuse_steps=True)
        return logits_after(self, tokens, extend, cancel=cancel, deadline=deadline)


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

    supports_tree = False
    """Tree forwards need the growing cache's reordering (`keep_tree_path`); this one stays a
    chain."""
    folds_prompt = False
    """Its compiled steps have fixed kinds of rows: the prompt is prefilled as it always was."""

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
        # Forwards run whole (stopped between them): a compiled step cannot stop part way, and
        # static layers count the positions written, which a part-way stop would leave unequal.
        self._layers = []
        self.compiled = compile_steps
        self._step = model.forward
        if compile_steps:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            if compile_backend != "inductor":
                mode = None  # modes are inductor's
            # The target and the draft model share one code object (their class's forward),
            # hence one dynamo cache: room for a graph per bucket for each.
            limit = 2 * len(STEP_BUCKETS) + 2
            config = torch._dynamo.config
            name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, name, max(getattr(config, name), limit))
            for module in model.modules():
                # What a module's compiled path reads but its eager one does not, made now (an
                # int8 linear's oneDNN weights where the lean kernel serves eager calls).
                prepare = getattr(module, "before_compile", None)
                if prepare is not None:
                    prepare()
            compiled = torch.compile(
                model.forward, backend=compile_backend, mode=mode, fullgraph=True, dynamic=False
            )
            self._step = compiled
            if compile_backend == "inductor" and _has_packed_int8(model):
                # Inductor lowers oneDNN's int8 linear only with its packed weights frozen into
                # the graph as constants; the setting must hold while dynamo traces, too.
                def frozen_step(**kwargs):
                    import torch._inductor.config as inductor_config  # heavy: compiling only

                    with inductor_config.patch(freezing=True):
                        return compiled(**kwargs)

                self._step = frozen_step

    def select(self, slot: str | None) -> None:
        """One preallocated cache (a compiled step is bound to its tensors): another slot
        starts it over, the keys and values of the slot it leaves staying in place as the one
        donor a shared prefix may be adopted from (until a forward overwrites them)."""
        if slot != self.slot:
            if self.tokens:
                self._donor = (self.slot, list(self.tokens), self.prefilled)
            self.tokens = []
            self.prefilled = 0
            self.slot = slot

    def reset_all(self) -> None:
        self._donor = None
        self.reset()

    def _make_cache(self):
        from transformers import StaticCache  # seconds to import: only once a torch model runs

        self._written = 0  # positions the cache has written, padding included
        self._allocated = self.capacity
        # (slot, tokens, prefilled) of the slot last in use, whose keys and values the cache
        # still holds at the positions of `tokens` (cut where a forward has written since); a
        # new cache holds nobody's.
        self._donor: tuple[str | None, list[int], int] | None = None
        return StaticCache(config=self.model.config, max_cache_len=self.capacity)

    def reset(self) -> None:
        """Forget everything, keeping the same cache tensors: a compiled step (a CUDA graph)
        is bound to their addresses, and new ones would mean compiling again."""
        if self._allocated != self.capacity:
            super().reset()
            return
        self.tokens = []
        self.prefilled = 0
        self._rewind(0)

    def _donors(self) -> Iterable[tuple[str | None, list[int], int]]:
        return [self._donor] if self._donor is not None else []

    def _adopt(self, slot: str | None, n: int) -> bool:
        """Take the first `n` positions the donor left in the cache: nothing to copy."""
        assert self._donor is not None and self._donor[0] == slot
        _, held, prefilled = self._donor
        if self._written < n and not _advance_static_cache(self.cache, n):
            return False
        self.tokens, self.prefilled = list(held[:n]), min(prefilled, n)
        self._written = max(self._written, n)
        self._rewind(n)
        return True

    def keep(self, n: int) -> None:
        del self.tokens[n:]
        self.prefilled = min(self.prefilled, n)
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
        """A cache of twice the capacity (or more) holding the same keys and values: copied
        where transformers' static layers allow it, else recomputed by a prefill (which, with
        row-wise attention, computes the rows of earlier decode steps another way)."""
        old, tokens, prefilled = self.cache, list(self.tokens), self.prefilled
        self._donor = None  # a new cache: the donor's positions are not copied
        while self.capacity < needed:
            self.capacity *= 2
        self.reset()
        if not tokens:
            return
        if _copy_static_cache(old, self.cache, len(tokens)):
            self.tokens, self.prefilled, self._written = tokens, prefilled, len(tokens)
        else:
            self.extend(tokens)

    @torch.inference_mode()
    def forward(
        self,
        new_tokens: Sequence[int],
        *,
        last_only: bool = False,
        prefill: bool = False,
        prompt: Sequence[int] = (),
    ) -> torch.Tensor:
        """As ModelRunner.forward, without `prompt` rows; shapes: input_ids (1, bucket) ->
        logits (n, V) or (1, V)."""
        refuse_prompt_rows(prompt)
        n = len(new_tokens)
        start = len(self.tokens)
        self._rewind(start)  # drop the previous step's padding
        if self._donor is not None:  # this forward writes over the donor's positions from start
            del self._donor[1][start:]
            if not self._donor[1]:
                self._donor = None
        bucket = next((b for b in STEP_BUCKETS if b >= n), None)
        # A compiled step: any step, or a prefill chunk of exactly a bucket's size (a draft
        # model catching up), except that row-wise prefill rows are computed eagerly, in
        # aligned blocks (see quantize.rowwise_attention).
        stepped = (
            bucket is not None
            and (not last_only or n == bucket)
            and not (prefill and self._prefill_kwargs)
        )
        width = bucket if stepped else n
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
        kwargs.update(self._step_kwargs(prefill))
        if stepped:
            out = self._step(input_ids=input_ids, **kwargs)
        else:  # prefill chunks and oversized steps: eager, any shape
            if last_only and self._has_logits_to_keep:
                kwargs["logits_to_keep"] = 1
            out = self.model(input_ids=input_ids, **kwargs)
        self._written = start + width
        self.tokens.extend(int(t) for t in new_tokens)
        self._appended(start, prefill)
        logits = out.logits[0]
        logits = logits[-1:] if last_only else logits[:n]
        # A CUDA graph reuses its output buffer on the next replay: hand out a copy.
        return logits.float().clone()


def _has_packed_int8(model: torch.nn.Module) -> bool:
    return getattr(model, "_quickdraft_int8", {}).get("backend") in ("onednn", "onednn7")


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (`model.model.layers`), in order; [] for
    a model not laid out so (its forwards then run whole)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def _plain_layers(cache: Any, kind: str) -> list[Any] | None:
    """The layers of a transformers 5 cache when all are plain `kind` layers
    (`transformers.cache_utils.DynamicLayer`, `StaticLayer`) and allocated; else None."""
    try:
        from transformers import cache_utils
    except ImportError:
        return None
    layer_type = getattr(cache_utils, kind, None)  # transformers 4.x: no layer objects
    layers = getattr(cache, "layers", None)
    if layer_type is None or not layers:
        return None
    kinds: tuple[type, ...] = (layer_type,)
    if kind == "DynamicLayer":
        from quickdraft.decoding.kv_cache import GrowingLayer

        kinds = (layer_type, GrowingLayer)
    for layer in layers:
        if type(layer) not in kinds or not getattr(layer, "is_initialized", False):
            return None
    return list(layers)


def _static_layers(cache: Any) -> list[Any] | None:
    """The layers of a transformers 5 StaticCache, all plain and allocated; else None."""
    return _plain_layers(cache, "StaticLayer")


def _advance_static_cache(cache: Any, n: int) -> bool:
    """Make every layer of a transformers 5 StaticCache write its next keys and values at
    position n, taking the positions before it (still in memory after a rewind) as held;
    False where the layers are not plain static layers of that version."""
    layers = _static_layers(cache)
    if layers is None:
        return False
    with torch.inference_mode():  # the count was made in inference mode
        for layer in layers:
            layer.cumulative_length.fill_(n)
    return True


def _copy_static_cache(old: Any, new: Any, n: int) -> bool:
    """Copy the first n positions of every layer of a transformers 5 StaticCache into another
    (larger) one; False where the layers are not plain static layers of that version."""
    try:
        from transformers.cache_utils import StaticLayer  # transformers 5 only
    except ImportError:  # transformers 4.x: no layer objects
        return False
    old_layers, new_layers = getattr(old, "layers", None), getattr(new, "layers", None)
    if not old_layers or not new_layers or len(old_layers) != len(new_layers):
        return False
    for source, target in zip(old_layers, new_layers, strict=True):
        if type(source) is not StaticLayer or type(target) is not StaticLayer:
            return False
        if not getattr(source, "is_initialized", False):
            return False
    for source, target in zip(old_layers, new_layers, strict=True):
        target.lazy_initialization(source.keys[:, :, :1], source.values[:, :, :1])
        target.keys[:, :, :n] = source.keys[:, :, :n]
        target.values[:, :, :n] = source.values[:, :, :n]
        target.cumulative_length.fill_(n)
    return True

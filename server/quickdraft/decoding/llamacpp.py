"""llama.cpp as the engine's runtime: a KV cache per slot over a GGUF model, and its forwards.

`LlamaCppRunner` gives the engine the same contract as the torch `ModelRunner` (runner.Runner)
over any model with the `LlamaCppWeights` contract below (`models.llamacpp.LlamaCppModel`
loads a GGUF through llama-cpp-python's low-level API, `pip install -e '.[llama]'`):

    extend(tokens)     longest-prefix reuse: keep the cached prefix, compute the rest in chunks;
                       a longer prefix in another slot's sequence is adopted by reference
                       (llama_memory_seq_cp: the unified cache's cells then belong to both)
    forward([t0..tk])  one llama_decode of k+1 tokens, logits of every position -> (k+1, V)
    keep(n)            crop the KV cache to its first n tokens (llama_memory_seq_rm)
    select(slot)       one sequence per document in one unified KV cache, least recently used
                       dropped when it is full
    cancel             checked between chunks and, through llama.cpp's abort callback,
                       between the graph's nodes inside a forward

so n-gram drafting, the draft model (a second GGUF with its own context), the cost model, stop
rules and stats run unchanged on it.

llama.cpp's batched kernels are not batch-invariant: a k-token forward's logits differ in the
last bits from k one-token steps (up to ~0.4 on the Qwen2.5-Coder 1.5B), so a near tie can flip
and a speculative strategy can differ from plain decoding on this runtime. The bench measures
how often (docs/performance.md).

This module also owns the library itself (`library()`: imported on first use, its log routed to
Python's logging), which model loading (models/llamacpp.py) shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy
import torch

from quickdraft.decoding.runner import (
    PREFILL_CHUNK,
    ForwardCancelled,
    best_shared_prefix,
    common_prefix_length,
    extend_in_chunks,
    logits_after,
)
from quickdraft.errors import ModelError

log = logging.getLogger(__name__)

MAX_SLOTS = 32
"""Sequences (documents' caches) one context holds. Each document may use three (its own, its
prefetch's, its next edit's); the unified cells, not this count, bound the memory: a context
out of cells drops the least recently used sequence."""
MIN_CONTEXT = 4096
"""A context holds at least this many tokens, whatever the memory budget."""
INSTALL_HINT = "pip install -e '.[llama]'"
"""The command that adds llama.cpp to a quickdraft checkout (README, "Install")."""


@runtime_checkable
class LlamaCppWeights(Protocol):
    """What the runner needs of a GGUF model loaded in llama.cpp (models.llamacpp.LlamaCppModel
    is one): its handle, and enough of its shape to size a context."""

    handle: Any
    """The `llama_model *` every context over it shares."""
    threads: int
    vocab_size: int
    n_ctx: int
    """Tokens a context should hold at least (before the slots' memory budget)."""
    n_ctx_train: int
    kv_bytes_per_token: int


def available() -> bool:
    """Whether llama-cpp-python can be imported here."""
    try:
        import llama_cpp  # noqa: F401  (optional: installed with quickdraft[llama])
    except (ImportError, OSError):
        return False
    return True


def version() -> str | None:
    try:
        import llama_cpp  # optional: installed with quickdraft[llama]
    except (ImportError, OSError):
        return None
    return str(getattr(llama_cpp, "__version__", "unknown"))


_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
"""ggml_log_level (0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continues the last line) ->
Python's: llama.cpp's info is chatter (every tensor it loads), so it goes to DEBUG."""
_log_callback = None
_warned: set[str] = set()
"""The kinds of llama.cpp warning already logged at WARNING (the rest of each kind: DEBUG)."""
_ABORTING = threading.Event()
"""Set while a forward is being aborted on purpose (its request was cancelled)."""
_library = None


def log_llama_cpp(level: int, message: str) -> None:
    """One line of llama.cpp's log into Python's logging at its own level. A warning is logged
    at WARNING once per kind (`control-looking token: 128247 '</s>'` comes once per special
    token at every load), the rest of its kind at DEBUG."""
    message = message.rstrip()
    if not message:
        return
    python_level = _LOG_LEVELS.get(level, logging.DEBUG)  # a continuation: detail, at DEBUG
    if python_level == logging.WARNING:
        kind = re.sub(r"'[^']*'|\d+", "#", message)
        if kind in _warned:
            python_level = logging.DEBUG
        else:
            _warned.add(kind)
    log.log(python_level, "llama.cpp: %s", message)


def library():
    """llama-cpp-python's module, its backend initialised once with its log (which otherwise
    floods stderr with info lines that editors show as errors) routed to Python's logging,
    warnings and errors only. (Models load on one thread: the language server's worker, or
    the CLI's.) Raises ModelError where it is not installed."""
    global _library, _log_callback
    if _library is not None:
        return _library
    try:
        import llama_cpp  # optional: installed with quickdraft[llama], builds for minutes
    except (ImportError, OSError) as exc:
        raise ModelError(
            f"the llama.cpp runtime needs llama-cpp-python: {INSTALL_HINT} "
            f"(builds llama.cpp, 12-30 minutes on 2 cores, once) ({exc})"
        ) from exc

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def forward_log(level: int, text: bytes, _data: Any) -> None:
        if _ABORTING.is_set() or not text:
            return  # a cancelled forward: llama.cpp reports the abort as failures
        log_llama_cpp(level, text.decode("utf-8", "replace"))

    _log_callback = forward_log  # keep a reference: llama.cpp holds the pointer
    llama_cpp.llama_log_set(forward_log, None)
    llama_cpp.llama_backend_init()
    _library = llama_cpp
    return llama_cpp


class LlamaCppRunner:
    """One llama.cpp context over a loaded GGUF model: a sequence (a KV cache) per slot, with the
    exact tokens each holds; the engine's `Runner` contract (see the module docstring)."""

    supports_tree = False
    """llama.cpp's verify forwards are not batch-invariant, and wide ones cost several steps on
    the CPUs it wins on: proposals stay a chain."""

    def __init__(
        self,
        model: LlamaCppWeights,
        *,
        n_ctx: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        slot_bytes: int | None = None,
    ) -> None:
        lib = library()
        self.lib = lib
        self.model = model
        self.device = torch.device("cpu")
        self.vocab_size = model.vocab_size
        self.prefill_chunk = prefill_chunk
        if n_ctx is None:
            extra = (slot_bytes or 0) // max(model.kv_bytes_per_token, 1)
            n_ctx = min(max(model.n_ctx + extra, MIN_CONTEXT), max(model.n_ctx_train, MIN_CONTEXT))
        self.n_ctx = n_ctx
        params = lib.llama_context_default_params()
        params.n_ctx = self.n_ctx
        params.n_batch = max(prefill_chunk, 64)
        params.n_ubatch = params.n_batch
        params.n_seq_max = MAX_SLOTS
        params.kv_unified = True  # the slots share the context's cells
        params.n_threads = model.threads
        params.n_threads_batch = model.threads
        # Every position of a verify forward needs its logits (the default allows one).
        params.n_outputs_max = 0
        params.n_outputs_max_per_seq = 0
        params.no_perf = True
        self._ctx = lib.llama_init_from_model(model.handle, params)
        if not self._ctx:
            raise ModelError(f"llama.cpp could not create a context of {self.n_ctx} tokens")
        self._memory = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(params.n_batch, 0, 1)
        self._batch_capacity = params.n_batch
        self._cancel: threading.Event | None = None

        @lib.ggml_abort_callback
        def should_abort(_data: Any) -> bool:
            cancel = self._cancel
            if cancel is not None and cancel.is_set():
                _ABORTING.set()
                return True
            return False

        self._abort_callback = should_abort  # referenced: llama.cpp keeps the pointer
        lib.llama_set_abort_callback(self._ctx, should_abort, None)
        self.slot: str | None = None
        self.last_adopted = 0
        self._seq = 0
        self._slots: OrderedDict[str | None, tuple[int, list[int]]] = OrderedDict()
        """slot -> (sequence id, tokens), least recently used first (the one in use last)."""
        self._slots[None] = (0, [])
        self.tokens: list[int] = self._slots[None][1]

    # --- the caches ------------------------------------------------------------------------

    def select(self, slot: str | None) -> None:
        """Use the sequence of `slot` (a free one, or the least recently used one emptied,
        the first time)."""
        if slot == self.slot:
            return
        found = self._slots.pop(slot, None)
        if found is None:
            used = {seq for seq, _ in self._slots.values()}
            free = [seq for seq in range(MAX_SLOTS) if seq not in used]
            if free:
                seq = free[0]
            else:
                oldest = next(iter(self._slots))
                seq, _ = self._slots.pop(oldest)
                self.lib.llama_memory_seq_rm(self._memory, seq, 0, -1)
            found = (seq, [])
        self._slots[slot] = found
        self.slot = slot
        self._seq, self.tokens = found

    @property
    def slots(self) -> list[str | None]:
        """The slots with a sequence, least recently used first, the one in use last."""
        return [slot for slot in self._slots if slot != self.slot] + [self.slot]

    def _drop_oldest_other(self) -> bool:
        """Free the cells of the least recently used slot that is not in use."""
        for slot in self._slots:
            if slot != self.slot:
                seq, _ = self._slots.pop(slot)
                self.lib.llama_memory_seq_rm(self._memory, seq, 0, -1)
                return True
        return False

    def reset(self) -> None:
        self.lib.llama_memory_seq_rm(self._memory, self._seq, 0, -1)
        del self.tokens[:]

    def reset_all(self) -> None:
        self.lib.llama_memory_clear(self._memory, True)
        self._slots.clear()
        self.slot = None
        self._seq = 0
        self._slots[None] = (0, [])
        self.tokens = self._slots[None][1]

    def keep(self, n: int) -> None:
        if len(self.tokens) > n:
            self.lib.llama_memory_seq_rm(self._memory, self._seq, n, -1)
            del self.tokens[n:]

    def _resync(self) -> None:
        """After an aborted or failed decode: trust llama.cpp's memory for what it holds."""
        held = int(self.lib.llama_memory_seq_pos_max(self._memory, self._seq)) + 1
        held = max(0, min(held, len(self.tokens)))
        self.lib.llama_memory_seq_rm(self._memory, self._seq, held, -1)
        del self.tokens[held:]

    # --- forwards -------------------------------------------------------------------------

    def forward(self, new_tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Append `new_tokens` to the cache and return their logits as float32 (n, V), or the
        last position's (1, V) if `last_only`. Raises ModelError when llama.cpp fails; a
        cancelled forward (see `extend`) raises `ForwardCancelled`."""
        n = len(new_tokens)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if n > self._batch_capacity:
            # Larger steps than a batch holds: in chunks, the logits of every chunk kept.
            parts = [
                self.forward(new_tokens[i : i + self._batch_capacity], last_only=last_only)
                for i in range(0, n, self._batch_capacity)
            ]
            return parts[-1] if last_only else torch.cat(parts)
        start = len(self.tokens)
        if start + n > self.n_ctx:
            raise ModelError(
                f"the llama.cpp context holds {self.n_ctx} tokens; {start + n} were asked for"
            )
        batch = self._batch
        batch.n_tokens = n
        for i, token in enumerate(new_tokens):
            batch.token[i] = int(token)
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = self._seq
            batch.logits[i] = 1 if (not last_only or i == n - 1) else 0
        while True:
            try:
                status = self.lib.llama_decode(self._ctx, batch)
            finally:
                _ABORTING.clear()
            # 1: no room in the KV cache for the batch; other documents' caches make room.
            if status != 1 or not self._drop_oldest_other():
                break
        if status != 0:
            self.tokens.extend(int(t) for t in new_tokens)
            self._resync()
            if status == 2:
                raise ForwardCancelled()
            raise ModelError(f"llama_decode failed with status {status}")
        self.tokens.extend(int(t) for t in new_tokens)
        rows = 1 if last_only else n
        # Shapes: llama.cpp's output buffer (rows, V) float32 -> a torch copy (rows, V); the
        # buffer is overwritten by the next decode.
        pointer = self.lib.llama_get_logits(self._ctx)
        array = numpy.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size))
        return torch.from_numpy(array.copy())

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> tuple[int, int, torch.Tensor | None]:
        """Make the cache hold exactly `tokens`, computing only what is not cached yet.

        As `ModelRunner.extend`; a cancel also stops the forward that is running (llama.cpp
        checks it between graph nodes), leaving the cache holding a prefix of `tokens`.
        """
        with self.stopping_at(cancel):
            reused = self._adopt_shared_prefix(tokens)
            return extend_in_chunks(
                self, tokens, self._prefill_forward, reused=reused, cancel=cancel, deadline=deadline
            )

    @contextlib.contextmanager
    def stopping_at(self, cancel: threading.Event | None) -> Iterator[None]:
        """As `Runner.stopping_at`: llama.cpp's abort callback reads `cancel` between the
        graph's nodes. An outer hold is kept as it is."""
        if cancel is None or self._cancel is not None:
            yield
            return
        self._cancel = cancel
        try:
            yield
        finally:
            self._cancel = None

    def _adopt_shared_prefix(self, tokens: Sequence[int]) -> int:
        """The tokens `extend` keeps: the slot's own cached prefix of `tokens`, or a longer one
        another slot's sequence holds (by `SHARED_PREFIX_MIN` at least), which this sequence
        then shares: its own cells are dropped and the other's first cells given its id too
        (kv_unified: one set of cells, no copy). Removing a sequence from a cell later (`keep`,
        `reset`, eviction) leaves the cell to the other sequences it belongs to."""
        own = common_prefix_length(self.tokens, tokens)
        self.last_adopted = 0
        others = (
            (slot, held, len(held)) for slot, (_, held) in self._slots.items() if slot != self.slot
        )
        found = best_shared_prefix(tokens, own, others)
        if found is None:
            return own
        shared, slot = found
        seq, held = self._slots[slot]
        self.lib.llama_memory_seq_rm(self._memory, self._seq, 0, -1)
        self.lib.llama_memory_seq_cp(self._memory, seq, self._seq, 0, shared)
        self.tokens[:] = held[:shared]  # in place: `_slots` holds this list
        # A prefix others use is worth keeping; the slot in use stays last.
        self._slots.move_to_end(slot)
        self._slots.move_to_end(self.slot)
        self.last_adopted = shared - own
        return shared

    def _prefill_forward(self, chunk: Sequence[int]) -> torch.Tensor | None:
        """The last logits of one prefill chunk; None when a cancel stopped it part way."""
        try:
            return self.forward(chunk, last_only=True)[-1]
        except ForwardCancelled:
            return None

    def logits_after(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> torch.Tensor | None:
        """As `ModelRunner.logits_after`."""
        return logits_after(self, tokens, self.extend, cancel=cancel, deadline=deadline)

    def close(self) -> None:
        if self._ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()

"""llama.cpp as the engine's runtime: a KV cache per slot over a GGUF model, and its forwards.

`LlamaCppRunner` gives the engine the same contract as the torch `ModelRunner` (runner.Runner)
over any model with the `LlamaCppWeights` contract below (`models.llamacpp.LlamaCppModel`
loads a GGUF through llama-cpp-python's low-level API, `pip install -e '.[llama]'`):

    extend(tokens)     longest-prefix reuse: keep the cached prefix, compute the rest in chunks;
                       a longer prefix in another slot's sequence is adopted by reference
                       (llama_memory_seq_cp: the unified cache's cells then belong to both)
    forward([t0..tk])  one llama_decode of k+1 tokens, logits of every position -> (k+1, V)
    keep(n)            crop the KV cache to its first n tokens (llama_memory_seq_rm)
    select(slot)       one sequence per document in one unified KV cache; the slots not in
                       use past `RESIDENT_TOKENS` of their own are parked in host memory
                       (llama_state_seq_get_data) and restored when selected, the cells
                       left repacked at the front; past the memory budget, dropped
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
    DEFAULT_SLOT_BYTES,
    PREFILL_CHUNK,
    SHARED_PREFIX_MIN,
    ForwardCancelled,
    best_shared_prefix,
    common_prefix_length,
    extend_in_chunks,
    logits_after,
    refuse_prompt_rows,
)
from quickdraft.errors import ModelError

log = logging.getLogger(__name__)

MAX_SLOTS = 32
"""Sequences (documents' caches) one context holds. Each document may use several (its own,
its prefetch's, its next edit's); `RESIDENT_TOKENS`, not this count, bounds the context's cells
the slots not in use hold."""
MIN_CONTEXT = 4096
"""A context holds at least this many tokens, whatever the memory budget."""
RESIDENT_TOKENS = 512
"""Tokens other documents' slots may hold in the context's cells beyond their common prefix
with the request in hand; past it the least recently used are parked in host memory, restored
when selected, and the cells left repacked at the front. A llama.cpp forward attends over every
cell up to the last one used, whoever's it is. Measured on a Zen 2 (AVX2, 2 threads), one step
of a 1,500-token document: the draft (Q4_0 0.5B) 29 ms alone in the first cells, 35 / 38 /
39 ms with 1,000 / 2,500 / 6,000 used or freed cells before it, 38 ms with 2,500 after it;
the target (Q4_K_M 1.5B) 66 ms alone, 80 ms with 2,500 before it. After 8 other documents of
1,500 tokens: the draft 42 ms and the target 84 ms with every cache in the context, 29 and 67 ms
parked. Coming back to a parked document took 18 ms (draft) and 48 ms (target), a prefill of its
tokens 10-30 s."""
REPACK_TAIL = 128
"""A repack takes a slot's prefix by reference from a slot put back before it when at most this
many of its tokens are left to compute again (a prefetch's or a next edit's continuation)."""
INSTALL_HINT = "pip install -e '.[llama]'"
"""The command that adds llama.cpp to a quickdraft checkout (README, "Install")."""


def slot_document(slot: str | None) -> str | None:
    """The document a slot belongs to: slots are named `<uri>` or `<uri>#<purpose>`
    (`#prefetch`, `#edit`, `#edit-head`; a file URI writes its own `#` as `%23`)."""
    return None if slot is None else slot.split("#", 1)[0]


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
    folds_prompt = False
    """For the same reason a prompt token is always prefilled: a decode batch would compute
    it otherwise."""

    def __init__(
        self,
        model: LlamaCppWeights,
        *,
        n_ctx: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        slot_bytes: int | None = None,
        resident_tokens: int = RESIDENT_TOKENS,
    ) -> None:
        """`n_ctx`: the context's size, fixed (None: sized below). `slot_bytes`: the memory
        the caches of slots not in use may take (None: `DEFAULT_SLOT_BYTES`), in the context's
        cells (`resident_tokens` of them) and parked in host memory.

        Without `n_ctx` the context holds one sequence of `model.n_ctx` tokens and the resident
        ones, and grows (once per doubling, its sequences kept) for a longer sequence up to what
        the budget would hold: its cells' memory is allocated whole when it is made."""
        lib = library()
        self.lib = lib
        self.model = model
        self.device = torch.device("cpu")
        self.vocab_size = model.vocab_size
        self.prefill_chunk = prefill_chunk
        self.resident_tokens = resident_tokens
        budget = DEFAULT_SLOT_BYTES if slot_bytes is None else slot_bytes
        token_bytes = max(model.kv_bytes_per_token, 1)
        if n_ctx is None:
            self._max_ctx = min(
                max(model.n_ctx + budget // token_bytes, MIN_CONTEXT),
                max(model.n_ctx_train, MIN_CONTEXT),
            )
            n_ctx = min(max(model.n_ctx, MIN_CONTEXT) + resident_tokens, self._max_ctx)
        else:
            self._max_ctx = n_ctx
        self.parked_budget = max(budget - resident_tokens * model.kv_bytes_per_token, 0)
        """Host memory the parked caches may take; beyond it the least recently used go."""
        self._parked: OrderedDict[str | None, tuple[Any, list[int]]] = OrderedDict()
        """slot -> (its sequence's state, as llama_state_seq_get_data wrote it; its tokens),
        for slots whose cells were freed, least recently used first."""
        self._repack_due = False
        """A slot was parked or restored: the next `extend` repacks the context."""
        self.n_ctx = n_ctx
        self._batch_capacity = max(prefill_chunk, 64)
        self._batch = lib.llama_batch_init(self._batch_capacity, 0, 1)
        self._cancel: threading.Event | None = None
        self._ctx = None
        self._open_context(n_ctx)
        self.slot: str | None = None
        self.last_adopted = 0
        self._seq = 0
        self._slots: OrderedDict[str | None, tuple[int, list[int]]] = OrderedDict()
        """slot -> (sequence id, tokens), least recently used first (the one in use last): the
        slots whose cells are in the context."""
        self._slots[None] = (0, [])
        self.tokens: list[int] = self._slots[None][1]

    def _open_context(self, n_ctx: int) -> None:
        """A llama.cpp context of `n_ctx` cells over the model, with the abort callback."""
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = self._batch_capacity
        params.n_ubatch = params.n_batch
        params.n_seq_max = MAX_SLOTS
        params.kv_unified = True  # the slots share the context's cells
        params.n_threads = self.model.threads
        params.n_threads_batch = self.model.threads
        # Every position of a verify forward needs its logits (the default allows one).
        params.n_outputs_max = 0
        params.n_outputs_max_per_seq = 0
        params.no_perf = True
        self._ctx = lib.llama_init_from_model(self.model.handle, params)
        if not self._ctx:
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} tokens")
        self.n_ctx = n_ctx
        self._memory = lib.llama_get_memory(self._ctx)

        @lib.ggml_abort_callback
        def should_abort(_data: Any) -> bool:
            cancel = self._cancel
            if cancel is not None and cancel.is_set():
                _ABORTING.set()
                return True
            return False

        self._abort_callback = should_abort  # referenced: llama.cpp keeps the pointer
        lib.llama_set_abort_callback(self._ctx, should_abort, None)

    # --- the caches ------------------------------------------------------------------------

    def select(self, slot: str | None) -> None:
        """Use the sequence of `slot`: its cells if they are in the context, its parked state
        restored into a free sequence, or an empty one the first time. (`extend` then parks
        what is past `resident_tokens` and repacks.)"""
        if slot == self.slot:
            return
        found = self._slots.pop(slot, None)
        if found is None:
            seq = self._free_sequence()
            parked = self._parked.pop(slot, None)
            found = (seq, self._restore(seq, parked) if parked is not None else [])
        self._slots[slot] = found
        self.slot = slot
        self._seq, self.tokens = found

    def _make_room(self, tokens: Sequence[int]) -> bool:
        """Before the slot in use computes toward `tokens` (its prefix adopted already): park
        other documents' slots, least recently used first, while they hold more than
        `resident_tokens` beyond their common prefix with `tokens` (a prefix adopted from or by
        this slot shares its cells); the document's own slots (its prefetch's, its next edit's)
        stay, as they take turns with it at every keystroke. Then, when any slot was parked or
        restored since the last time, `_repack`. Whether it repacked."""
        while self._resident_others(tokens) > self.resident_tokens and self._park_oldest_other(
            other_documents=True
        ):
            pass
        if not self._repack_due:
            return False
        self._repack()
        self._repack_due = False
        return True

    @property
    def slots(self) -> list[str | None]:
        """The slots with a cache (parked ones too), least recently used first, the one in use
        last."""
        resident = [slot for slot in self._slots if slot != self.slot]
        return [*self._parked, *resident, self.slot]

    def parked_bytes(self) -> int:
        """Host memory the parked caches hold (`parked_budget` bounds it), as
        `ModelRunner.parked_bytes`."""
        return sum(len(state) for state, _ in self._parked.values())

    def _resident_others(self, tokens: Sequence[int]) -> int:
        """Tokens other documents' slots in the context hold beyond their common prefix with
        `tokens`."""
        document = slot_document(self.slot)
        return sum(
            len(held) - common_prefix_length(held, tokens)
            for slot, (_, held) in self._slots.items()
            if slot_document(slot) != document
        )

    def _repack(self) -> None:
        """Move the slots in the context to its first cells, the one in use first: llama.cpp's
        forwards attend over every cell up to the last one used (on a Zen 2, a 1.5B step
        took 66 ms with its 1,500 tokens in the first cells and 80 ms behind 2,500 free ones),
        and parking leaves holes. Each slot is saved, the context emptied, and each put back;
        a slot that shares all but `REPACK_TAIL` of its tokens with one put back before it
        takes that prefix by reference (its tail is computed again when it is next used)."""
        lib = self.lib
        order = [self.slot, *(s for s in reversed(self._slots) if s != self.slot)]
        states = {slot: self._state(self._slots[slot][0]) for slot in order}
        lib.llama_memory_clear(self._memory, False)  # llama.cpp allocates from cell 0 again
        placed: list[tuple[int, list[int]]] = []
        for slot in order:
            seq, tokens = self._slots[slot]
            state = states[slot]
            donor = max(
                ((common_prefix_length(held, tokens), held_seq) for held_seq, held in placed),
                default=(0, -1),
            )
            if donor[0] >= max(len(tokens) - REPACK_TAIL, SHARED_PREFIX_MIN):
                lib.llama_memory_seq_cp(self._memory, donor[1], seq, 0, donor[0])
                del tokens[donor[0] :]
            elif state is None or not lib.llama_state_seq_set_data(
                self._ctx, state, len(state), seq
            ):
                lib.llama_memory_seq_rm(self._memory, seq, 0, -1)
                del tokens[:]
            placed.append((seq, tokens))

    def _state(self, seq: int) -> Any:
        """The sequence's cells as llama_state_seq_get_data writes them; None when it has none
        (or llama.cpp wrote fewer bytes than it said)."""
        size = int(self.lib.llama_state_seq_get_size(self._ctx, seq))
        if size <= 0 or self.lib.llama_memory_seq_pos_max(self._memory, seq) < 0:
            return None
        state = (ctypes.c_uint8 * size)()
        if int(self.lib.llama_state_seq_get_data(self._ctx, state, size, seq)) != size:
            return None
        return state

    def _free_sequence(self) -> int:
        """A sequence id no slot in the context uses (the least recently used one's, parked, when
        all are taken)."""
        used = {seq for seq, _ in self._slots.values()}
        free = [seq for seq in range(MAX_SLOTS) if seq not in used]
        if not free:
            self._park_oldest_other()
            return self._free_sequence()
        return free[0]

    def _park_oldest_other(self, *, other_documents: bool = False) -> bool:
        """Park the least recently used slot in the context that is not in use (of another
        document than it, with `other_documents`); False when there is none."""
        document = slot_document(self.slot)
        for slot in self._slots:
            if slot != self.slot and not (other_documents and slot_document(slot) == document):
                self._park(slot)
                return True
        return False

    def _park(self, slot: str | None) -> None:
        """Move `slot`'s cells out of the context into host memory (its tokens with them), then
        drop the least recently used parked caches beyond `parked_budget`. Cells the sequence
        shares with another (an adopted prefix) stay the other's."""
        seq, tokens = self._slots.pop(slot)
        self._repack_due = True
        state = self._state(seq) if tokens else None
        if state is not None and len(state) <= self.parked_budget:
            self._parked[slot] = (state, tokens)
        self.lib.llama_memory_seq_rm(self._memory, seq, 0, -1)
        while self.parked_bytes() > self.parked_budget:
            self._parked.popitem(last=False)

    def _restore(self, seq: int, parked: tuple[Any, list[int]]) -> list[int]:
        """Put a parked state into the empty sequence `seq` and give its tokens; with no room
        for it (the other slots' cells are parked first), nothing: the slot starts empty."""
        state, tokens = parked
        self._repack_due = True
        while not self.lib.llama_state_seq_set_data(self._ctx, state, len(state), seq):
            self.lib.llama_memory_seq_rm(self._memory, seq, 0, -1)
            if not self._park_oldest_other():
                log.debug("a parked cache found no room in the context: computed again")
                return []
        return tokens

    def reset(self) -> None:
        self.lib.llama_memory_seq_rm(self._memory, self._seq, 0, -1)
        del self.tokens[:]

    def reset_all(self) -> None:
        self.lib.llama_memory_clear(self._memory, True)
        self._slots.clear()
        self._parked.clear()
        self._repack_due = False
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

    def forward(
        self, new_tokens: Sequence[int], *, last_only: bool = False, prompt: Sequence[int] = ()
    ) -> torch.Tensor:
        """Append `new_tokens` to the cache and return their logits as float32 (n, V), or the
        last position's (1, V) if `last_only` (no `prompt` rows: `folds_prompt`). Raises
        ModelError when llama.cpp fails; a cancelled forward (see `extend`) raises
        `ForwardCancelled`."""
        refuse_prompt_rows(prompt)
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
            self._grow(start + n)
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
            if status != 1 or not self._park_oldest_other():
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

    def _grow(self, needed: int) -> None:
        """A context that holds a sequence of `needed` tokens (twice the size at least, up to
        the budget's), made in place of this one: the other slots are parked, the one in use
        moved across. Raises ModelError past the budget's size."""
        if needed > self._max_ctx:
            raise ModelError(
                f"the llama.cpp context holds at most {self._max_ctx} tokens here (the model's"
                f" training length or cache.memory_mb); {needed} were asked for"
            )
        size = min(max(needed + self.resident_tokens, 2 * self.n_ctx), self._max_ctx)
        log.info("llama.cpp context: %s -> %s tokens for a longer sequence", self.n_ctx, size)
        while self._park_oldest_other():
            pass
        lib = self.lib
        state = self._state(self._seq) if self.tokens else None
        lib.llama_free(self._ctx)
        self._ctx = None
        self._open_context(size)
        if self.tokens and not (
            state is not None
            and lib.llama_state_seq_set_data(self._ctx, state, len(state), self._seq)
        ):
            del self.tokens[:]
            raise ModelError(f"llama.cpp could not move a sequence into a context of {size}")

    def extend(
        self,
        tokens: Sequence[int],
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        leave: int = 0,
    ) -> tuple[int, int, torch.Tensor | None]:
        """Make the cache hold exactly `tokens`, computing only what is not cached yet.

        As `ModelRunner.extend` (`leave` is ignored: this runner does not fold); a cancel also
        stops the forward that is running (llama.cpp checks it between graph nodes), leaving the
        cache holding a prefix of `tokens`.
        """
        with self.stopping_at(cancel):
            reused = self._adopt_shared_prefix(tokens)
            if self._make_room(tokens):
                reused = min(reused, len(self.tokens))
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
        self._parked.clear()
        if self._ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()

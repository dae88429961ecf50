"""llama.cpp as the engine's runtime: the GGUF file itself, mmapped once, no conversion.

`LlamaCppModel` loads a GGUF through llama-cpp-python's low-level API (`pip install
'quickdraft[llama]'`); `LlamaCppRunner` gives the engine the same contract as the torch
`ModelRunner`:

    extend(tokens)     longest-prefix reuse: keep the cached prefix, compute the rest in chunks
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

Some builds crash in an "extra buffer type" (weights repacked for AMX) on some machines. Which
settings work, and what a forward costs, is measured once per machine in a child process
(`probe`), where a crash costs nothing but a retry without the extra buffers.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy
import torch

from quickdraft.decoding.runner import common_prefix_length
from quickdraft.errors import ModelError

log = logging.getLogger(__name__)

PREFILL_CHUNK = 128
"""Tokens per llama_decode while prefilling: a superseding request waits at most one chunk."""
MAX_SLOTS = 8
"""Sequences (documents' caches) one context holds."""
MIN_CONTEXT = 4096
"""A context holds at least this many tokens, whatever the memory budget."""


def available() -> bool:
    """Whether llama-cpp-python can be imported here."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def version() -> str | None:
    try:
        import llama_cpp
    except (ImportError, OSError):
        return None
    return str(getattr(llama_cpp, "__version__", "unknown"))


def _lib():
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        raise ModelError(
            "the llama.cpp runtime needs llama-cpp-python: pip install 'quickdraft[llama]' "
            f"(builds llama.cpp, 12-30 minutes on 2 cores, once) ({exc})"
        ) from exc
    return llama_cpp


_LOG_LEVEL_WARN = 3  # ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont
_log_callback = None
_ABORTING = threading.Event()
"""Set while a forward is being aborted on purpose (its request was cancelled)."""
_backend_ready = False


def _init_backend() -> None:
    """Initialise llama.cpp once, routing its log (which otherwise floods stderr with
    info lines that editors show as errors) to Python's logging, warnings and errors only.
    (Models load on one thread: the language server's worker, or the CLI's.)"""
    global _backend_ready, _log_callback
    if _backend_ready:
        return
    lib = _lib()

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def forward_log(level: int, text: bytes, _data: Any) -> None:
        if _ABORTING.is_set():
            return  # a cancelled forward: llama.cpp reports the abort as failures
        if level in (_LOG_LEVEL_WARN, _LOG_LEVEL_WARN + 1) and text:
            message = text.decode("utf-8", "replace").rstrip()
            if message:
                log.log(logging.WARNING if level == 3 else logging.ERROR, "llama.cpp: %s", message)

    _log_callback = forward_log  # keep a reference: llama.cpp holds the pointer
    lib.llama_log_set(forward_log, None)
    lib.llama_backend_init()
    _backend_ready = True


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
        lib = _lib()
        _init_backend()
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
            _lib().llama_model_free(self._handle)
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


class LlamaCppRunner:
    """One llama.cpp context over a `LlamaCppModel`: a sequence (a KV cache) per slot, with the
    exact tokens each holds; the engine's `ModelRunner` contract (see the module docstring)."""

    def __init__(
        self,
        model: LlamaCppModel,
        *,
        n_ctx: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        slot_bytes: int | None = None,
    ) -> None:
        lib = _lib()
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
        self._abort = threading.Event()
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
        reused = common_prefix_length(self.tokens, tokens)
        self.keep(reused)
        logits = None
        position = reused
        self._cancel = cancel
        try:
            while position < len(tokens):
                if (cancel is not None and cancel.is_set()) or (
                    deadline is not None and time.monotonic() >= deadline
                ):
                    break
                chunk = tokens[position : position + self.prefill_chunk]
                try:
                    logits = self.forward(chunk, last_only=True)[-1]
                except ForwardCancelled:
                    position = len(self.tokens)
                    logits = None
                    break
                position += len(chunk)
        finally:
            self._cancel = None
        return reused, position - reused, logits

    def logits_after(self, tokens: Sequence[int]) -> torch.Tensor:
        """Logits for the token that follows `tokens`; the cache then holds `tokens`."""
        if common_prefix_length(self.tokens, tokens) >= len(tokens):
            self.keep(len(tokens) - 1)
        _, _, logits = self.extend(tokens)
        assert logits is not None
        return logits

    def close(self) -> None:
        if self._ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()


class ForwardCancelled(Exception):
    """llama.cpp stopped a forward because its request was cancelled."""


# --- the probe: settings that work here, and what a forward costs --------------------------


@dataclass
class ProbeResult:
    """What a child process measured of one GGUF model on this machine."""

    extra_bufts: bool
    target_ms: dict[int, float]
    """Forward time (ms) by new tokens, over a `context`-token cache."""
    prefill_tokens_per_s: float
    context: int
    threads: int
    load_seconds: float
    busy: bool = False
    crashed_with_extra_bufts: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_ms"] = {str(k): v for k, v in self.target_ms.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        data = dict(data)
        data["target_ms"] = {int(k): float(v) for k, v in data["target_ms"].items()}
        return cls(**data)


PROBE_SIZES = (1, 2, 4, 8, 16)


def _measure(path: Path, threads: int, extra_bufts: bool, context: int) -> dict[str, Any]:
    """In the probe process: load, prefill `context` tokens, time forwards of PROBE_SIZES."""
    from quickdraft.models.cpu_kernels import OtherLoad

    started = time.perf_counter()
    model = LlamaCppModel(Path(path), threads=threads, extra_bufts=extra_bufts, n_ctx=context + 64)
    runner = LlamaCppRunner(model, n_ctx=context + 64)
    load_seconds = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    high = max(2, min(model.vocab_size, 30000))
    tokens = torch.randint(1, high, (context + 20,), generator=generator).tolist()
    runner.forward(tokens[:8], last_only=True)  # warm-up
    runner.reset()
    # One load figure for the whole probe: /proc/stat counts in 10 ms ticks, too coarse for
    # a share taken over a single forward of a few milliseconds.
    target_ms: dict[int, float] = {}
    with OtherLoad() as load:
        t0 = time.perf_counter()
        runner.extend(tokens[:context])
        prefill = time.perf_counter() - t0
        for n in PROBE_SIZES:
            best = float("inf")
            for _ in range(3):
                runner.keep(context)
                t0 = time.perf_counter()
                logits = runner.forward(tokens[context : context + n])
                best = min(best, time.perf_counter() - t0)
                if not torch.isfinite(logits).all():
                    raise ModelError("llama.cpp returned non-finite logits")
            target_ms[n] = round(best * 1000, 2)
    for smaller, larger in zip(PROBE_SIZES, PROBE_SIZES[1:], strict=False):
        target_ms[larger] = max(target_ms[larger], target_ms[smaller])
    busy = load.share is not None and load.share > 0.2
    return ProbeResult(
        extra_bufts=extra_bufts,
        target_ms=target_ms,
        prefill_tokens_per_s=round(context / prefill, 1),
        context=context,
        threads=threads,
        load_seconds=round(load_seconds, 2),
        busy=busy,
    ).to_dict()


def _probe_key(path: Path, threads: int, context: int) -> str:
    from quickdraft.machine import cpu_flags, cpu_model

    stat = path.stat()
    parts = [
        "1",
        cpu_model(),
        ",".join(sorted(cpu_flags())),
        version() or "",
        path.name,
        str(stat.st_size),
        str(threads),
        str(context),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def probe(
    path: Path,
    threads: int,
    *,
    context: int = 256,
    home: Path | None = None,
    use_cache: bool = True,
    timeout_s: float = 240.0,
) -> ProbeResult:
    """Load `path` in a child process and measure it (once per machine, then cached).

    A crash with llama.cpp's extra buffer types is retried without them. Raises ModelError
    when the model cannot run at all.
    """
    from quickdraft.models import store

    path = Path(path)
    cache = (
        (home or store.quickdraft_home())
        / "llamacpp"
        / f"{_probe_key(path, threads, context)}.json"
    )
    if use_cache and cache.is_file():
        try:
            return ProbeResult.from_dict(json.loads(cache.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            log.warning("ignoring unreadable llama.cpp probe %s", cache)
    crashed = False
    errors = []
    for extra_bufts in (True, False):
        command = [
            sys.executable,
            "-m",
            "quickdraft.decoding.llamacpp",
            str(path),
            "--threads",
            str(threads),
            "--context",
            str(context),
        ]
        if not extra_bufts:
            command.append("--no-extra-bufts")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, env=env
            )
        except subprocess.TimeoutExpired:
            errors.append(f"timed out after {timeout_s:.0f} s")
            continue
        if done.returncode == 0:
            try:
                result = ProbeResult.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                errors.append(f"unreadable output ({exc})")
                continue
            result.crashed_with_extra_bufts = crashed
            if use_cache and not result.busy:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(result.to_dict(), indent=2))
            return result
        tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
        reason = (
            f"crashed (signal {-done.returncode})"
            if done.returncode < 0
            else f"failed (exit {done.returncode}): {tail[0]}"
        )
        errors.append(("with" if extra_bufts else "without") + f" extra buffers {reason}")
        crashed = crashed or (extra_bufts and done.returncode < 0)
    raise ModelError(f"llama.cpp cannot run {path.name} here: " + "; ".join(errors))


def _probe_main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="measure a GGUF model in llama.cpp (internal)")
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--no-extra-bufts", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = _measure(args.path, args.threads, not args.no_extra_bufts, args.context)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover - run by `probe` in a child process
    sys.exit(_probe_main())

"""The model worker: one thread owns the models, everything touching them runs there, in order.

The event loop never does model work. It submits jobs (`ModelWorker.submit`) and awaits the
returned future (`asyncio.wrap_future`). Jobs run one at a time in submission order, so a
document change submitted before a completion is seen by that completion.

Work ahead of the user (idle warm-up, prefetch, next edits decided ahead) is submitted as
*background* jobs (`submit_background`; `first`: ahead of those queued): they run only when no
other job waits, and a job that must run for the user (`submit(..., preempt=True)`: a
completion request, a model load) stops the background job that is running: its cancel event
is set, and a decode step stops at its next decoder layer, a prefill chunk when it is done (its
work is the prefix the next request reuses; llama.cpp stops both between its graph's nodes;
`Runner.stopping_at`). `preempt_background` stops it without a job, or only when it is one of
the jobs named (a next edit decided ahead stops a warm-up, never a prefetch).

`ModelHost` is the state the worker owns: the Completer (which owns the n-gram index) and the
documents it has been told about, so a model reload can hand them to the new Completer.

Threads: the event loop owns the document store and the typed-ahead cache; the worker owns
the ModelHost and everything in it. They meet only in the worker's queues: the jobs (locked
here), and the values jobs take when they run (the pending document updates, server.py; the
warm-up targets, work_ahead.py; each locked there).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quickdraft.config import QuickdraftConfig
from quickdraft.errors import ModelError, QuickdraftError
from quickdraft.generation import CompletionRequest, EngineState, NextEditRequest

if TYPE_CHECKING:
    from quickdraft.completer import Completer, Completion
    from quickdraft.next_edit import DecidedEdit, NextEdit

logger = logging.getLogger(__name__)

CompleterLoader = Callable[[QuickdraftConfig, Callable[[str], None] | None], "Completer"]
"""Builds a Completer for a configuration (loads its models), telling each step to the
progress callback. Runs on the worker thread."""


def load_completer(
    config: QuickdraftConfig, progress: Callable[[str], None] | None = None
) -> Completer:
    """The real loader: `backends.load_completer` (models, then step costs, cached per
    machine)."""
    # Imported here, on the worker thread: torch and the models' code load after the server
    # has answered `initialize`, so the editor shows "loading" at once.
    from quickdraft.backends import load_completer as load

    return load(config, progress=progress)


def describe_error(exc: BaseException) -> str:
    """One line for a person: deliberate errors as they are, others with their type."""
    if isinstance(exc, QuickdraftError):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class ModelWorker:
    """A single thread running submitted callables: foreground jobs in submission order, then
    background jobs while nothing else waits."""

    def __init__(self, name: str = "quickdraft-model"):
        self._foreground: deque[tuple[Future, Callable, tuple, dict]] = deque()
        self._background: deque[tuple[Future, Callable, tuple, dict, threading.Event]] = deque()
        self._ready = threading.Condition()
        self._running_background: threading.Event | None = None
        self._running_future: Future | None = None
        """The background job running (its future), with its cancel event above."""
        self.preemptions = 0
        """Background jobs stopped for a job that had to run (tests count them)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable, /, *args: Any, preempt: bool = False, **kwargs: Any) -> Future:
        """Run `fn(*args, **kwargs)` on the worker, after the foreground jobs before it.
        `preempt`: stop a running background job for it. Cancelling the future before the job
        starts skips it; a running job is stopped through its own cancel event."""
        future: Future = Future()
        if self._stopped:
            future.set_exception(RuntimeError("the model worker has stopped"))
            return future
        with self._ready:
            self._foreground.append((future, fn, args, kwargs))
            if preempt and self._running_background is not None:
                if not self._running_background.is_set():
                    self.preemptions += 1
                self._running_background.set()
            self._ready.notify()
        return future

    def submit_background(
        self, fn: Callable, /, *args: Any, first: bool = False, **kwargs: Any
    ) -> Future:
        """Run `fn(*args, cancel=event, **kwargs)` when the worker has nothing else to do
        (`first`: before the background jobs already queued); the event is set when a
        preempting job arrives (or the future is cancelled)."""
        future: Future = Future()
        if self._stopped:
            future.set_exception(RuntimeError("the model worker has stopped"))
            return future
        cancel = threading.Event()
        future.add_done_callback(lambda done: cancel.set() if done.cancelled() else None)
        with self._ready:
            job = (future, fn, args, kwargs, cancel)
            if first:
                self._background.appendleft(job)
            else:
                self._background.append(job)
            self._ready.notify()
        return future

    def preempt_background(self, *only: Future) -> None:
        """Stop the background job that is running (it sees its cancel event within one
        forward); queued ones stay queued. For when the person has moved on (didFocus).
        `only`: stop it only when it is one of these jobs."""
        with self._ready:
            running = self._running_background
            if running is None or running.is_set():
                return
            if only and not any(future is self._running_future for future in only):
                return
            self.preemptions += 1
            running.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stopped = True
        with self._ready:
            if self._running_background is not None:
                self._running_background.set()
            self._ready.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _next(self) -> tuple[Future, Callable, tuple, dict, threading.Event | None] | None:
        with self._ready:
            while not self._stopped and not self._foreground and not self._background:
                self._ready.wait()
            if self._foreground:  # also after stop: what was submitted before it still runs
                future, fn, args, kwargs = self._foreground.popleft()
                self._running_background = None
                self._running_future = None
                return future, fn, args, kwargs, None
            if self._stopped:
                for future, *_ in self._background:
                    future.cancel()
                self._background.clear()
                return None
            future, fn, args, kwargs, cancel = self._background.popleft()
            self._running_background = cancel
            self._running_future = future
            return future, fn, args, dict(kwargs, cancel=cancel), cancel

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            future, fn, args, kwargs, cancel = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                if cancel is not None:
                    with self._ready:
                        self._running_background = None
                        self._running_future = None


@dataclass(frozen=True)
class Loaded:
    """What a finished load tells the event loop, as values (`ModelHost.load`'s result): the
    event loop keeps it (`server.serving`) and never reads the ModelHost itself."""

    summary: str
    """One line: what runs, where, with which draft."""
    config: QuickdraftConfig
    """The settings the models were loaded with (a failed reload reverts to its models)."""
    models: dict[str, Any]
    """`Models.describe()`: what was loaded."""
    compute: dict[str, Any]
    """How the models run and why (`Backend.compute`), for `$/quickdraft/stats`."""
    works_ahead: bool
    """Whether warm-up, prefetch and alternatives pay here (`Backend.works_ahead`)."""
    engine_status: EngineState | None
    """A serving engine's state, which the server follows; None for this machine's models."""
    loaded_at: float
    """time.monotonic() when the models became ready (waiting for them is not a request's
    latency)."""


class ModelHost:
    """What the worker thread owns. Call its methods only through `ModelWorker.submit`."""

    def __init__(self, loader: CompleterLoader):
        self._loader = loader
        self.completer: Completer | None = None
        self.load_error: str | None = None
        self.root: str | None = None
        """The workspace folder (prompts show paths relative to it)."""
        self._documents: dict[str, tuple[str, str]] = {}

    # --- models ----------------------------------------------------------------------

    def load(
        self, config: QuickdraftConfig, progress: Callable[[str], None] | None = None
    ) -> Loaded:
        """Load the models for `config` and build a Completer; return what the event loop
        needs to know of them.

        On failure the previous Completer (if any) stays in service and the error is raised
        with a message meant for a person.
        """
        try:
            completer = self._loader(config, progress)
        except Exception as exc:
            message = describe_error(exc)
            if self.completer is None:
                self.load_error = message
            logger.exception("loading models failed")
            raise ModelError(f"could not load models: {message}") from exc
        completer.root = self.root
        for uri, (text, language_id) in self._documents.items():
            try:
                completer.set_document(uri, text, language_id)
            except Exception:  # a document the new models cannot index is no reason to fail
                logger.exception("set_document failed for %s after reload", uri)
        previous, self.completer = self.completer, completer
        self.load_error = None
        if previous is not None:
            previous.close()  # a remote engine's client: its connections and probe thread
        return Loaded(
            summary=self.describe(),
            config=config,
            models=completer.models.describe(),
            compute=completer.compute,
            works_ahead=completer.works_ahead,
            engine_status=completer.engine_status,
            loaded_at=time.monotonic(),
        )

    def describe(self) -> str:
        """One line: what runs, where, with which draft."""
        if self.completer is None:
            return "no models"
        return self.completer.describe()

    def set_root(self, root: str) -> None:
        self.root = root
        if self.completer is not None:
            self.completer.root = root

    def update_config(self, config: QuickdraftConfig) -> None:
        if self.completer is not None:
            self.completer.update_config(config)

    def require_completer(self) -> Completer:
        if self.completer is None:
            reason = self.load_error or "models are not loaded yet"
            raise ModelError(f"no models available: {reason}")
        return self.completer

    # --- documents -------------------------------------------------------------------

    def set_document(self, uri: str, text: str, language_id: str) -> None:
        self._documents[uri] = (text, language_id)
        if self.completer is not None:
            self.completer.set_document(uri, text, language_id)

    def close_document(self, uri: str) -> None:
        known = self._documents.pop(uri, None)
        if known is not None and self.completer is not None:
            self.completer.close_document(uri)

    # --- completion ------------------------------------------------------------------

    def warm(
        self, request: CompletionRequest, cancel: threading.Event, *, file_level: bool = False
    ) -> int:
        """Extend the document's caches toward a request there (idle warm-up); stops when
        `cancel` is set. Returns the target tokens computed. `file_level`: the cursor is not
        known, only the part of the prompt no cursor changes is computed."""
        if self.completer is None or cancel.is_set():
            return 0
        return self.completer.warm(request, cancel, file_level=file_level)

    def complete(
        self, request: CompletionRequest, cancel: threading.Event, strategy: str | None = None
    ) -> Completion | None:
        """Run one completion (typed-ahead answers never get here: the service answers them
        on the event loop)."""
        completer = self.require_completer()
        if cancel.is_set():  # superseded while queued: not even the prompt is built
            return None
        return completer.complete(request, cancel=cancel, strategy=strategy)

    def alternatives(
        self, request: CompletionRequest, count: int, cancel: threading.Event
    ) -> list[Completion]:
        """Up to `count` alternatives to the suggestion at `request`'s place
        (`Completer.alternatives`). When the model's last answer for the document was for
        another place (the suggestion there came from work done ahead), it answers this place
        first, from the document's cache."""
        completer = self.require_completer()
        if cancel.is_set():
            return []
        if not completer.has_answered(request):
            completer.complete(request, cancel=cancel)
        return completer.alternatives(request, count, cancel=cancel)

    def suggest_edit(
        self,
        request: NextEditRequest,
        cancel: threading.Event,
        decided: DecidedEdit | None = None,
    ) -> NextEdit | None:
        """Run one next-edit request over the Completer's backend and open documents (the
        pipeline's own sources, `backends.edit_sources`), with the rules' decision made ahead
        for this version when there is one; None when it was superseded while queued."""
        completer = self.require_completer()
        if cancel.is_set():
            return None
        # Imported here, on the worker thread, as `load_completer` is (torch loads after the
        # server has answered `initialize`); models are loaded by now.
        from quickdraft.backends import edit_sources
        from quickdraft.next_edit import suggest

        return suggest(edit_sources(completer), request, cancel=cancel, decided=decided)

    def decide_edit(self, request: NextEditRequest, cancel: threading.Event) -> DecidedEdit | None:
        """The rules' decision for the document as `request` has it, made ahead of a request
        (work ahead after a change); None only when `cancel` stopped it."""
        completer = self.require_completer()
        if cancel.is_set():
            return None
        from quickdraft.backends import edit_sources
        from quickdraft.next_edit import decide_rules

        return decide_rules(edit_sources(completer), request, cancel=cancel, ahead=True)

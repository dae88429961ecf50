"""The model worker: one thread owns the models, everything touching them runs there, in order.

The event loop never does model work. It submits jobs (`ModelWorker.submit`) and awaits the
returned future (`asyncio.wrap_future`). Jobs run one at a time in submission order, so a
document change submitted before a completion is seen by that completion.

`ModelHost` is the state the worker owns: the Completer (which owns the n-gram index) and the
documents it has been told about, so a model reload can hand them to the new Completer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from quickdraft.config import QuickdraftConfig
from quickdraft.errors import ModelError, QuickdraftError

logger = logging.getLogger(__name__)

CompleterLoader = Callable[[QuickdraftConfig, Callable[[str], None] | None], Any]
"""Builds a Completer for a configuration (loads its models), telling each step to the
progress callback. Runs on the worker thread."""


def load_completer(config: QuickdraftConfig, progress: Callable[[str], None] | None = None) -> Any:
    """The real loader: `Completer.load` (models, then step costs, cached per machine)."""
    from quickdraft.completer import Completer

    return Completer.load(config, progress=progress)


def describe_error(exc: BaseException) -> str:
    """One line for a person: deliberate errors as they are, others with their type."""
    if isinstance(exc, QuickdraftError):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class ModelWorker:
    """A single thread running submitted callables in order."""

    def __init__(self, name: str = "quickdraft-model"):
        self._queue: queue.SimpleQueue[tuple[Future, Callable, tuple, dict] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run `fn(*args, **kwargs)` on the worker. Cancelling the future before the job
        starts skips it; a running job is stopped through its own cancel event."""
        future: Future = Future()
        if self._stopped:
            future.set_exception(RuntimeError("the model worker has stopped"))
            return future
        self._queue.put((future, fn, args, kwargs))
        return future

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stopped = True
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                future.set_exception(exc)
            else:
                future.set_result(result)


class ModelHost:
    """What the worker thread owns. Call its methods only through `ModelWorker.submit`."""

    def __init__(self, loader: CompleterLoader):
        self._loader = loader
        self.completer: Any = None
        self.config: QuickdraftConfig | None = None
        self.load_error: str | None = None
        self.loaded_at: float | None = None
        """time.monotonic() when the current models became ready."""
        self._documents: dict[str, tuple[str, str]] = {}

    # --- models ----------------------------------------------------------------------

    def load(self, config: QuickdraftConfig, progress: Callable[[str], None] | None = None) -> str:
        """Load the models for `config` and build a Completer; return a one-line summary.

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
        for uri, (text, language_id) in self._documents.items():
            try:
                completer.set_document(uri, text, language_id)
            except Exception:  # a document the new models cannot index is no reason to fail
                logger.exception("set_document failed for %s after reload", uri)
        previous, self.completer = self.completer, completer
        self.config = config
        self.load_error = None
        self.loaded_at = time.monotonic()
        if previous is not None:
            previous.close()  # a remote engine's client: its connections and probe thread
        return self.describe()

    def describe(self) -> str:
        """One line: what runs, where, with which draft."""
        if self.completer is None:
            return "no models"
        return self.completer.describe()

    def update_config(self, config: QuickdraftConfig) -> None:
        self.config = config
        if self.completer is not None:
            self.completer.update_config(config)

    def require_completer(self) -> Any:
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

    def complete(self, request: Any, cancel: threading.Event, strategy: str | None = None) -> Any:
        """Run one completion (typed-ahead answers never get here: the service answers them
        on the event loop)."""
        completer = self.require_completer()
        if cancel.is_set():  # superseded while queued: not even the prompt is built
            return None
        return completer.complete(request, cancel=cancel, strategy=strategy)

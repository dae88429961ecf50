"""What the server tells the editor about its state: `$/quickdraft/status`, LSP work-done
progress while the models load, and while a request waits longer than a second.

    $/quickdraft/status  {"state": "loading" | "ready" | "error" | "unavailable",
                          "message": one line for a person, "backend": "local" | "openai",
                          "models": what runs (LoadedModels.describe()), once ready}

"loading" lasts from the start until the first completion can be served (models loading,
converting, measuring); "ready" says completions can be served; "error" that none can be (the
message says why); "unavailable" that the remote engine is failing. Loading also shows as a
work-done progress (`window/workDoneProgress/create`, then `$/progress` begin/report/end) in
clients that support it, so every wait says what it is doing. So does a request the model has
not answered after a second (`WaitProgress`: a cold file's first suggestion reads thousands of
tokens): "reading app.py: 1,280 of 5,800 tokens", then "writing a suggestion for app.py".

Nothing is sent before the client's `initialized` (the LSP rule for server-initiated
messages): what happens before is held and sent then. Everything here runs on the event loop;
`LoadProgress.step` may be called from the model worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from lsprotocol import types

from quickdraft import prefill_progress
from quickdraft.lsp.server_api import ServerApi

logger = logging.getLogger(__name__)

T = TypeVar("T")

STATUS_NOTIFICATION = "$/quickdraft/status"
STATES = ("loading", "ready", "error", "unavailable")


class StatusReporter:
    """The server's current state, sent to the client whenever it changes."""

    def __init__(self, server: ServerApi):
        self.server = server
        self.state = "loading"
        self.message = "starting"
        self.models: dict | None = None
        self.client_ready = False

    def set(self, state: str, message: str, models: dict | None = None) -> None:
        assert state in STATES, state
        changed = (state, message) != (self.state, self.message) or models is not None
        self.state, self.message = state, message
        if models is not None:
            self.models = models
        if changed and self.client_ready:
            self._send()

    def client_initialized(self) -> None:
        self.client_ready = True
        self._send()

    def _send(self) -> None:
        backend = self.server.config.current.model.backend
        try:
            params = {"state": self.state, "message": self.message, "backend": backend}
            if self.models is not None and self.state != "loading":
                params["models"] = self.models
            self.server.protocol.notify(STATUS_NOTIFICATION, params)
        except Exception:  # no transport (unit tests) or the client went away
            logger.debug("could not send %s", STATUS_NOTIFICATION, exc_info=True)


class ClientProgress:
    """One work-done progress at the client (`window/workDoneProgress/create`, then `$/progress`
    begin, reports, end), where the client supports it; nothing where it does not.

    `show` asks the client for the token and begins once it accepts, with the message as it is
    then; `report` before that only updates the message; `end` before the client accepted ends
    it all the same (nothing is begun after). Runs on the event loop.
    """

    def __init__(
        self, server: ServerApi, loop: asyncio.AbstractEventLoop, token: str, message: str = ""
    ):
        self.server = server
        self.loop = loop
        self.token = token
        self.message = message
        """What the progress says (or will say once begun)."""
        self.begun = False
        self.ended = False
        self._asked = False

    def supported(self) -> bool:
        try:
            window = self.server.client_capabilities.window
        except AttributeError:
            return False
        return bool(window and window.work_done_progress)

    def show(self, message: str) -> None:
        self.message = message
        if self._asked or self.ended or not self.supported():
            return
        self._asked = True

        def created(future) -> None:
            if future.cancelled() or future.exception() is not None:
                logger.debug("workDoneProgress/create refused: %s", future)
                return
            self.loop.call_soon_threadsafe(self._begin)

        try:
            self.server.work_done_progress.create(self.token).add_done_callback(created)
        except Exception:  # pragma: no cover - transport gone
            logger.debug("could not create a progress token", exc_info=True)

    def _begin(self) -> None:
        if self.ended:
            return
        self.begun = True
        self.server.work_done_progress.begin(
            self.token,
            types.WorkDoneProgressBegin(
                title="quickdraft", message=self.message, cancellable=False
            ),
        )

    def report(self, message: str) -> None:
        if message == self.message:
            return
        self.message = message
        if self.begun and not self.ended:
            self.server.work_done_progress.report(
                self.token, types.WorkDoneProgressReport(message=message)
            )

    def end(self, message: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if self.begun:
            self.server.work_done_progress.end(
                self.token, types.WorkDoneProgressEnd(message=message)
            )


class LoadProgress:
    """One model load, as the client sees it: a status per step and a work-done progress.

    `step(message)` is the loader's progress callback (called on the worker thread).
    """

    def __init__(
        self,
        server: ServerApi,
        reporter: StatusReporter,
        loop: asyncio.AbstractEventLoop,
        generation: int,
    ):
        self.server = server
        self.reporter = reporter
        self.loop = loop
        self.progress = ClientProgress(
            server, loop, f"quickdraft-load-{generation}", "loading models"
        )

    # --- worker thread ---------------------------------------------------------------------

    def step(self, message: str) -> None:
        self.loop.call_soon_threadsafe(self._step, message)

    # --- event loop ------------------------------------------------------------------------

    def start(self) -> None:
        """Announce the load: status now (held until `initialized`), progress once the client
        can take it."""
        self.reporter.set("loading", self.progress.message)
        if self.reporter.client_ready:
            self.client_initialized()

    def client_initialized(self) -> None:
        """The client finished its handshake: the progress may be shown now."""
        self.progress.show(self.progress.message)

    def _step(self, message: str) -> None:
        if self.progress.ended:
            return
        self.server.log(f"loading: {message}")
        self.reporter.set("loading", message)
        self.progress.report(message)

    def finish(
        self, ok: bool, message: str, *, status: bool = True, models: dict | None = None
    ) -> None:
        """The load is over: its progress ends, and the status says ready or error (unless
        `status` is False: a remote engine's watcher says whether it is reachable)."""
        self.progress.end(message)
        if status:
            self.reporter.set("ready" if ok else "error", message, models)
        elif models is not None:
            self.reporter.models = models


SHOW_WAIT_AFTER_S = 1.0
"""A request the model has not answered after this long says what it waits for."""
WAIT_REPORT_EVERY_S = 0.5
"""How often a shown wait's message is brought up to date (a prefill chunk takes longer)."""


def file_name(uri: str) -> str:
    """The last part of a document's URI, as a person names the file (`app.py`)."""
    path = unquote(urlparse(uri).path) or uri
    return posixpath.basename(path.rstrip("/")) or uri


class WaitProgress:
    """A request's wait, as the client sees it: nothing for its first second (most answers come
    sooner), then a work-done progress saying what the model does for it, until the answer.

    The worker thread runs the request's job through `run`, which notes that it started and
    how far its prefills have got (`prefilling`, a `quickdraft.prefill_progress` listener):
    plain stores, read by the event loop every WAIT_REPORT_EVERY_S. The message is "waiting
    for the model to finish other work" while queued, "reading <file>: <n> of <m> tokens"
    during a prefill of more than one chunk, else "<doing> for <file>" ("writing a suggestion";
    a next edit is "preparing": the rules' candidate is checked by the model, or written).
    """

    def __init__(
        self,
        server: ServerApi,
        loop: asyncio.AbstractEventLoop,
        name: str,
        uri: str,
        *,
        doing: str = "writing a suggestion",
    ):
        self.server = server
        self.loop = loop
        self.file = file_name(uri)
        self.doing = doing
        self.progress = ClientProgress(
            server, loop, f"quickdraft-wait-{name}-{time.monotonic_ns()}"
        )
        self._running = False
        self._reading: tuple[int, int] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # --- worker thread ---------------------------------------------------------------------

    def run(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)`, the request's job, run as this wait's: it has started, and its
        prefills report here."""
        self._running = True
        with prefill_progress.listening(self.prefilling):
            return work(*args)

    def prefilling(self, computed: int, total: int) -> None:
        """A prefill listener: `computed` of `total` new tokens are in the cache."""
        self._running = True
        self._reading = (computed, total)

    # --- event loop ------------------------------------------------------------------------

    def start(self, *, running: bool = False) -> WaitProgress:
        """The request is waiting from now (`running`: its job is not queued behind others)."""
        self._running = self._running or running
        self._timer = self.loop.call_later(SHOW_WAIT_AFTER_S, self._show)
        return self

    def message(self) -> str:
        if not self._running:
            return "waiting for the model to finish other work"
        reading = self._reading
        if reading is not None and reading[0] < reading[1]:
            return f"reading {self.file}: {reading[0]:,} of {reading[1]:,} tokens"
        return f"{self.doing} for {self.file}"

    def _show(self) -> None:
        if self.progress.ended:
            return
        if not self.progress.supported():
            return  # nothing to show it in: no updates to poll for
        if self.server.serving is None:  # the models' load is the wait, and says so itself
            self._timer = self.loop.call_later(WAIT_REPORT_EVERY_S, self._show)
            return
        self.progress.show(self.message())
        self._timer = self.loop.call_later(WAIT_REPORT_EVERY_S, self._update)

    def _update(self) -> None:
        if self.progress.ended:
            return
        self.progress.report(self.message())
        self._timer = self.loop.call_later(WAIT_REPORT_EVERY_S, self._update)

    def finish(self) -> None:
        """The request is answered (or gave up): its progress, if shown, ends."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.progress.end()

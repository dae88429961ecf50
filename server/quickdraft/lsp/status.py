"""What the server tells the editor about its state: `$/quickdraft/status`, and LSP work-done
progress while the models load.

    $/quickdraft/status  {"state": "loading" | "ready" | "error" | "unavailable",
                          "message": one line for a person, "backend": "local" | "openai",
                          "models": what runs (LoadedModels.describe()), once ready}

"loading" lasts from the start until the first completion can be served (models loading,
converting, measuring); "ready" says completions can be served; "error" that none can be (the
message says why); "unavailable" that the remote engine is failing. Loading also shows as a
work-done progress (`window/workDoneProgress/create`, then `$/progress` begin/report/end) in
clients that support it, so every wait says what it is doing.

Nothing is sent before the client's `initialized` (the LSP rule for server-initiated
messages): what happens before is held and sent then. Everything here runs on the event loop;
`LoadProgress.step` may be called from the model worker thread.
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from quickdraft.lsp.server_api import ServerApi

logger = logging.getLogger(__name__)

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
        self.token = f"quickdraft-load-{generation}"
        self.message = "loading models"
        self._progress = False  # a work-done progress was begun at the client
        self._finished = False

    # --- worker thread ---------------------------------------------------------------------

    def step(self, message: str) -> None:
        self.loop.call_soon_threadsafe(self._step, message)

    # --- event loop ------------------------------------------------------------------------

    def start(self) -> None:
        """Announce the load: status now (held until `initialized`), progress once the client
        can take it."""
        self.reporter.set("loading", self.message)
        if self.reporter.client_ready:
            self.client_initialized()

    def client_initialized(self) -> None:
        """The client finished its handshake: create the progress token, then begin."""
        if self._finished or self._progress or not self._supports_progress():
            return

        def created(future) -> None:
            if future.cancelled() or future.exception() is not None:
                logger.debug("workDoneProgress/create refused: %s", future)
                return
            self.loop.call_soon_threadsafe(self._begin)

        try:
            self.server.work_done_progress.create(self.token).add_done_callback(created)
        except Exception:  # pragma: no cover - transport gone
            logger.debug("could not create a progress token", exc_info=True)

    def _supports_progress(self) -> bool:
        try:
            window = self.server.client_capabilities.window
        except AttributeError:
            return False
        return bool(window and window.work_done_progress)

    def _begin(self) -> None:
        if self._finished:
            return
        self._progress = True
        self.server.work_done_progress.begin(
            self.token,
            types.WorkDoneProgressBegin(
                title="quickdraft", message=self.message, cancellable=False
            ),
        )

    def _step(self, message: str) -> None:
        if self._finished:
            return
        self.message = message
        self.server.log(f"loading: {message}")
        self.reporter.set("loading", message)
        if self._progress:
            self.server.work_done_progress.report(
                self.token, types.WorkDoneProgressReport(message=message)
            )

    def finish(
        self, ok: bool, message: str, *, status: bool = True, models: dict | None = None
    ) -> None:
        """The load is over: its progress ends, and the status says ready or error (unless
        `status` is False: a remote engine's watcher says whether it is reachable)."""
        self._finished = True
        if status:
            self.reporter.set("ready" if ok else "error", message, models)
        elif models is not None:
            self.reporter.models = models
        if self._progress:
            self._progress = False
            self.server.work_done_progress.end(
                self.token, types.WorkDoneProgressEnd(message=message)
            )

"""Loading the models on the worker, and keeping the running ones when a reload fails.

`ModelLoading.load` submits the load (it preempts work ahead) and tells the client each step
(status.py: `$/quickdraft/status`, work-done progress, log). Its outcome is handled on the event
loop: loaded, the typed-ahead cache is cleared (its suggestions came from other models), a
remote engine's state is watched, and the open documents are warmed; failed, the latest reload
reverts the model settings to the models still serving, and a first load leaves the server
without completions, saying why.
"""

from __future__ import annotations

import asyncio

from quickdraft.config import QuickdraftConfig
from quickdraft.lsp.server_api import ServerApi
from quickdraft.lsp.status import LoadProgress, StatusReporter
from quickdraft.lsp.typed_ahead import TypedAheadCache
from quickdraft.lsp.work_ahead import WorkAhead
from quickdraft.lsp.worker import Loaded
from quickdraft.models.presets import describe_plan


class ModelLoading:
    """The server's model loads: the one in progress, and which one is the latest."""

    def __init__(
        self,
        server: ServerApi,
        status: StatusReporter,
        typed_ahead: TypedAheadCache,
        work_ahead: WorkAhead,
    ):
        self.server = server
        self.status = status
        self.typed_ahead = typed_ahead
        self.work_ahead = work_ahead
        self.loading: LoadProgress | None = None
        """The model load in progress, if any."""
        self.generation = 0
        """Counts model loads submitted; only the latest one's failure reverts the settings."""

    def load(self, config: QuickdraftConfig) -> None:
        """Load (or reload) the models on the worker; report each step and the outcome to the
        client (status notification, work-done progress, log)."""
        self.generation += 1
        generation = self.generation
        loop = asyncio.get_running_loop()
        progress = LoadProgress(self.server, self.status, loop, generation)
        self.loading = progress
        self.server.log(f"loading models: {describe_plan(config.model)}")
        progress.start()
        server = self.server
        future = server.worker.submit(server.host.load, config, progress.step, preempt=True)

        def done(fut):
            loop.call_soon_threadsafe(self._loaded, fut, generation, config, progress)

        future.add_done_callback(done)

    def client_initialized(self) -> None:
        """The client finished its handshake: the load's progress may be shown now."""
        if self.loading is not None:
            self.loading.client_initialized()

    def _loaded(
        self, future, generation: int, config: QuickdraftConfig, progress: LoadProgress
    ) -> None:
        server = self.server
        exc = future.exception()
        if exc is None:
            self.typed_ahead.clear()
            loaded: Loaded = future.result()
            server.serving = loaded
            server.log(f"models ready: {loaded.summary}")
            status = loaded.engine_status is None  # a serving engine's state is its own
            progress.finish(True, loaded.summary, status=status, models=loaded.models)
            self._watch_engine(loaded)
            # The documents opened while the models loaded (a fresh engine holds no cache).
            self.work_ahead.warm_open_documents()
            return
        running = server.serving
        if generation == self.generation and running is not None:
            # A reload failed: the previous models keep serving, and the configuration says so;
            # the settings that came with the new models still apply.
            server.config.revert_models(running.config.model)
            server.worker.submit(server.host.update_config, server.config.current)
            progress.finish(True, f"ready (the new models failed to load: {exc})")
        else:
            progress.finish(False, f"no completions: {exc}")
        server.show(f"quickdraft: {exc}", "error")

    # --- a remote engine's state -------------------------------------------------------

    def _watch_engine(self, loaded: Loaded) -> None:
        """Tell the client the remote engine's state now and at every change (not per request:
        one `showMessage` per failure state; each failed request is logged by the service)."""
        status = loaded.engine_status
        if status is None:
            return
        loop = asyncio.get_running_loop()

        def changed(state: str, message: str) -> None:  # any thread
            loop.call_soon_threadsafe(self._engine_state, loaded, state, message)

        state, message = status.subscribe(changed)
        self._engine_state(loaded, state, message)

    def _engine_state(self, loaded: Loaded, state: str, message: str) -> None:
        if loaded is not self.server.serving:
            return  # replaced by a reload meanwhile
        self.status.set(state, message)
        if state == "unavailable":
            self.server.show(
                f"quickdraft: {message}; completions resume when it answers", "warning"
            )
        else:
            self.server.log(f"quickdraft: {message}")

"""The pygls server: state, protocol fixes, and the wiring of handlers to features.

`create_server(defaults)` builds a ready server; `quickdraft serve` (lsp/cli.py) starts it.

Two things pygls 2.1 does not do, done here in `QuickdraftProtocol`:

* A request whose params fail to deserialize is dropped without a reply (pygls raises from
  `structure_message`, the JSON object hook, and the read loop only logs it), so the client
  would wait forever. We turn it into an `InvalidParams` error response naming what is wrong.
* Requests after `shutdown` are dropped without a reply; they get `InvalidRequest`.

Document sync bypasses pygls' own workspace: `documents.DocumentStore` is the one copy.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder
from pygls.exceptions import FeatureRequestError, JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import MsgId
from pygls.protocol.language_server import lsp_method

from quickdraft import __version__
from quickdraft.config import QuickdraftConfig
from quickdraft.errors import PositionError
from quickdraft.lsp import handlers
from quickdraft.lsp.configuration import ConfigChange, ConfigurationManager
from quickdraft.lsp.documents import UTF16, DocumentStore
from quickdraft.lsp.service import CompletionService, NextEditService
from quickdraft.lsp.status import LoadProgress, StatusReporter
from quickdraft.lsp.worker import (
    CompleterLoader,
    ModelHost,
    ModelWorker,
    describe_error,
    load_completer,
)
from quickdraft.models.presets import describe_plan

logger = logging.getLogger(__name__)


_LOG_LEVELS = {
    "error": types.MessageType.Error,
    "warning": types.MessageType.Warning,
    "info": types.MessageType.Info,
    "log": types.MessageType.Log,
}

_PYTHON_LEVELS = {
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "log": logging.DEBUG,
}
"""The Python log's level for each of the client's: every line at the level it is sent at."""


@attrs.define
class MalformedRequest:
    """A request whose params did not deserialize; answered with InvalidParams."""

    id: MsgId
    method: str
    jsonrpc: str
    detail: str


def _describe_structure_error(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    if isinstance(cause, cattrs.ClassValidationError):
        try:
            return "; ".join(cattrs.transform_error(cause))
        except Exception:  # pragma: no cover - transform_error is best effort
            pass
    return str(cause) or type(cause).__name__


class QuickdraftProtocol(LanguageServerProtocol):
    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        # pygls builds the capabilities from the registered features; the requests outside
        # the LSP specification (copilotInlineEdit) are advertised under `experimental`.
        result = yield from super().lsp_initialize(params)
        experimental = getattr(self._server, "experimental", None)
        if experimental:
            known = result.capabilities.experimental
            result.capabilities.experimental = {**(known or {}), **experimental}
        return result

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            msg_id = data.get("id")
            method = data.get("method")
            is_request = "jsonrpc" in data and "error" not in data and "result" not in data
            if is_request and isinstance(msg_id, (str, int)) and isinstance(method, str):
                return MalformedRequest(
                    id=msg_id,
                    method=method,
                    jsonrpc=str(data.get("jsonrpc")),
                    detail=_describe_structure_error(exc),
                )
            if isinstance(method, str) and msg_id is None:  # a notification: no one to answer
                raise JsonRpcInvalidParams(
                    f"ignored a {method} notification with invalid params: "
                    f"{_describe_structure_error(exc)}"
                ) from exc
            raise

    def handle_message(self, message):
        if (
            self._shutdown
            and getattr(message, "method", "") != types.EXIT
            and hasattr(message, "id")
            and hasattr(message, "method")
        ):
            self._send_response(
                message.id,
                error=types.ResponseError(
                    code=types.ErrorCodes.InvalidRequest,
                    message=f"{message.method}: the server is shutting down",
                ),
            )
            return
        if isinstance(message, MalformedRequest):
            self._answer_malformed(message)
            return
        super().handle_message(message)

    def _answer_malformed(self, message: MalformedRequest) -> None:
        known = message.method in self.fm.features or message.method in self.fm.builtin_features
        if known:
            code = types.ErrorCodes.InvalidParams
            text = f"Invalid params for {message.method}: {message.detail}"
        else:
            code = types.ErrorCodes.MethodNotFound
            text = f"Method Not Found: {message.method}"
        logger.warning("request %s: %s", message.id, text)
        self._send_response(message.id, error=types.ResponseError(code=code, message=text))

    # Document sync goes to our own store only (see documents.py); pygls' workspace copy
    # would double the memory and raise on changes to documents it does not know.
    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield handler, (params,), None


class QuickdraftServer(LanguageServer):
    def __init__(self, defaults: QuickdraftConfig, loader: CompleterLoader = load_completer):
        super().__init__(
            "quickdraft",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=QuickdraftProtocol,
        )
        self.config = ConfigurationManager(defaults)
        self.documents = DocumentStore(UTF16)
        self.worker = ModelWorker()
        self.host = ModelHost(loader)
        self.completions = CompletionService(self)
        self.next_edits = NextEditService(self)
        self.experimental: dict[str, Any] = {}
        """`capabilities.experimental` at `initialize` (the handlers of features outside the
        specification add theirs)."""
        self.status = StatusReporter(self)
        self.loading: LoadProgress | None = None
        """The model load in progress, if any."""
        self._pending_sync: set[str] = set()
        self._warm_targets: OrderedDict[str, tuple[str, int, int, int, str, bool]] = OrderedDict()
        """uri -> (text, offset, line, column, language, file level only) of each document's
        next warm-up, in the order they are warmed."""
        self._warming = False
        """A warm-up job is queued or running on the worker (one at a time)."""
        self.focused: str | None = None
        """The document of the last `textDocument/didFocus`."""
        self._sync_lock = threading.Lock()
        """Guards `_pending_sync` and `_warm_targets`: the event loop and the worker meet there."""
        self.models_generation = 0
        """Counts model loads submitted; only the latest one's failure reverts the settings."""

    # --- messages to the client -------------------------------------------------------

    def log(self, message: str, level: str = "info") -> None:
        """`window/logMessage` and the Python log, both at `level`."""
        logger.log(_PYTHON_LEVELS[level], "%s", message)
        try:
            self.window_log_message(
                types.LogMessageParams(type=_LOG_LEVELS[level], message=message)
            )
        except Exception:  # no transport yet (unit tests) or the client went away
            logger.debug("could not send logMessage", exc_info=True)

    def show(self, message: str, level: str = "error") -> None:
        """`window/showMessage` (and the Python log, at `level`)."""
        logger.log(_PYTHON_LEVELS[level], "%s", message)
        try:
            self.window_show_message(
                types.ShowMessageParams(type=_LOG_LEVELS[level], message=message)
            )
        except Exception:
            logger.debug("could not send showMessage", exc_info=True)

    def report_server_error(self, error: Exception, source) -> None:
        # Failures outside a request (a notification's handler, an unreadable message) are shown;
        # request errors already went back as the request's answer.
        if source == FeatureRequestError:
            return
        if isinstance(error, JsonRpcException):
            self.show(f"quickdraft: {error.message}")
        else:
            self.show(f"quickdraft: internal error: {type(error).__name__}: {error}")

    # --- position encoding ------------------------------------------------------------

    def choose_encoding(self, capabilities: types.ClientCapabilities) -> str:
        encoding = ServerCapabilitiesBuilder.choose_position_encoding(capabilities)
        self.documents.encoding = str(getattr(encoding, "value", encoding))
        return self.documents.encoding

    # --- documents --------------------------------------------------------------------

    def sync_document(self, uri: str, *, opened: bool = False) -> None:
        """Tell the Completer (on the worker) about `uri`'s current text, coalescing bursts of
        changes into one update that reads the latest text when it runs; then, when the worker
        is idle, warm the document's caches toward a request at the edit. An edited document
        is warmed first; one just `opened` after those already waiting, so that files opened
        together are warmed in the order they were opened (the client's didFocus says which
        one is in front)."""
        with self._sync_lock:
            if uri in self._pending_sync:
                return
            self._pending_sync.add(uri)
        self.worker.submit(self._flush_sync, uri)
        self.schedule_warm(uri, first=not opened)

    def schedule_warm(self, uri: str, *, first: bool = True) -> None:
        """Idle warm-up (cache.warmup): extend `uri`'s KV caches toward the prompt its next
        request will likely send, at the cursor last seen there (an edit, a didFocus position,
        a request), or, when none is known, its file-level part. One target per document, the
        latest; documents are warmed one at a time while the worker is idle, `first` ones
        (the focused or edited document) ahead of the rest, and a real request stops the
        warm-up that is running within one forward."""
        document = self.documents.get(uri)
        config = self.config.current
        # A serving engine keeps no caches of ours to warm (RemoteBackend.warm does nothing):
        # building and tokenizing the prompt for it would be work for nothing.
        if document is None or not config.cache.warmup or config.model.backend != "local":
            return
        at = document.cursor_at
        if at is not None and at <= len(document.text):
            line, column = document.line_column(at)
            target = (document.text, at, line, column, document.language_id, False)
        else:
            target = (document.text, 0, 0, 0, document.language_id, True)
        with self._sync_lock:
            self._warm_targets[uri] = target
            self._warm_targets.move_to_end(uri, last=not first)
        self._next_warm()

    def focus(self, uri: str, position: tuple[int, int] | None) -> None:
        """`textDocument/didFocus`: the person now looks at `uri` (at `position`, LSP units,
        when the client says): it is warmed first."""
        document = self.documents.get(uri)
        if document is None:
            self.log(f"didFocus for {uri}, which is not open; ignored", "warning")
            return
        if position is not None:
            line, character = position
            try:
                column = document.to_codepoint(line, character, strict=True)
            except PositionError as exc:
                self.log(f"didFocus for {uri}: {exc}; warming its file-level part", "warning")
            else:
                document.cursor_at = document.line_starts[line] + column
        if self.focused != uri:
            # Work ahead for the file left behind waits: the worker warms this one first.
            self.completions.drop_prefetches(keep=uri)
            self.worker.preempt_background()
        self.focused = uri
        self.schedule_warm(uri, first=True)

    def _next_warm(self) -> None:
        """Start the next document's warm-up unless one is queued or running."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a server driven by hand (unit tests): no work ahead
            return
        with self._sync_lock:
            if self._warming or not self._warm_targets:
                return
            self._warming = True
        future = self.worker.submit_background(self._warm_next)

        def warmed(done) -> None:
            loop.call_soon_threadsafe(self._warmed, done)

        future.add_done_callback(warmed)

    def _warmed(self, done) -> None:  # event loop
        with self._sync_lock:
            self._warming = False
        if done.cancelled() or self.worker.stopped:
            return
        if done.exception() is not None:
            # Left queued: the next edit or focus starts warming again.
            self.log(f"warm-up failed: {describe_error(done.exception())}", "warning")
            return
        uri, computed, where = done.result()
        if computed:
            self.log(f"warm-up: {computed} tokens of {uri} computed ahead ({where})", "log")
        self._next_warm()

    def _warm_next(self, cancel) -> tuple[str | None, int, str]:  # worker thread, background
        # completer imports torch (seconds): the server answers `initialize` before that.
        from quickdraft.completer import CompletionRequest

        with self._sync_lock:
            if not self._warm_targets:
                return None, 0, ""
            uri, target = self._warm_targets.popitem(last=False)
        text, offset, line, column, language_id, file_level = target
        where = "its file-level part" if file_level else f"at line {line + 1}"
        if self.host.completer is None:
            return uri, 0, where
        request = CompletionRequest(uri, text, line, column, language_id, offset=offset)
        computed = self.host.warm(request, cancel, file_level=file_level)
        if cancel.is_set():  # a request or a focus elsewhere came first: go on later
            with self._sync_lock:
                if uri not in self._warm_targets:
                    self._warm_targets[uri] = target
                    # first again, unless the person has moved to another document
                    self._warm_targets.move_to_end(uri, last=self.focused not in (None, uri))
        return uri, computed, where

    def _flush_sync(self, uri: str) -> None:  # worker thread
        with self._sync_lock:
            self._pending_sync.discard(uri)
        document = self.documents.get(uri)
        if document is None:
            return
        text, language_id = document.text, document.language_id
        max_bytes = self.config.current.context.max_document_bytes
        if document.unusable_reason(max_bytes) is not None:
            self.host.close_document(uri)  # keep it out of the n-gram index
            return
        self.host.set_document(uri, text, language_id)

    def forget_document(self, uri: str) -> None:
        with self._sync_lock:
            self._warm_targets.pop(uri, None)  # a closed document is not warmed
        if self.focused == uri:
            self.focused = None
        self.completions.forget(uri)
        self.next_edits.cancel(uri)
        self.worker.submit(self.host.close_document, uri)

    # --- configuration and models -----------------------------------------------------

    def apply_config_change(self, change: ConfigChange) -> None:
        """Hand a new configuration to the worker: reload models when they changed."""
        self.configure_history(change.config)
        if change.changed:
            self.completions.typed_ahead.clear()  # suggestions made under other settings
        if change.models_changed:
            self.load_models(change.config)
        elif change.changed:
            self.worker.submit(self.host.update_config, change.config)
            self.log("configuration updated")

    def configure_history(self, config: QuickdraftConfig) -> None:
        """The edit history's bounds (edits.history_hunks, edits.history_bytes)."""
        self.documents.history.configure(config.edits.history_hunks, config.edits.history_bytes)

    def load_models(self, config: QuickdraftConfig) -> None:
        """Load (or reload) the models on the worker; report each step and the outcome to the
        client (status notification, work-done progress, log)."""
        self.configure_history(config)

        self.models_generation += 1
        generation = self.models_generation
        loop = asyncio.get_running_loop()
        progress = LoadProgress(self, loop, generation)
        self.loading = progress
        self.log(f"loading models: {describe_plan(config.model)}")
        progress.start()
        future = self.worker.submit(self.host.load, config, progress.step, preempt=True)

        def done(fut):
            loop.call_soon_threadsafe(self._models_loaded, fut, generation, config, progress)

        future.add_done_callback(done)

    def client_initialized(self) -> None:
        """The client finished its handshake: what was held for it may be sent now."""
        self.status.client_initialized()
        if self.loading is not None:
            self.loading.client_initialized()

    def _models_loaded(
        self, future, generation: int, config: QuickdraftConfig, progress: LoadProgress
    ) -> None:
        exc = future.exception()
        if exc is None:
            self.completions.typed_ahead.clear()
            summary = future.result()
            self.log(f"models ready: {summary}")
            completer = self.host.completer
            remote = getattr(completer.backend, "engine_status", None) is not None
            models = completer.models.describe() if completer is not None else None
            progress.finish(True, summary, status=not remote, models=models)
            self._watch_engine(self.host.completer)
            # The documents opened while the models loaded: warm them now, the focused one
            # first (a fresh engine holds no cache).
            for uri in self.documents.uris():
                if uri != self.focused:
                    self.schedule_warm(uri, first=False)
            if self.focused is not None:
                self.schedule_warm(self.focused, first=True)
            return
        running = self.host.config
        if generation == self.models_generation and running is not None:
            # A reload failed: the previous models keep serving, and the configuration says so;
            # the settings that came with the new models still apply.
            self.config.revert_models(running.model)
            self.worker.submit(self.host.update_config, self.config.current)
            progress.finish(True, f"ready (the new models failed to load: {exc})")
        else:
            progress.finish(False, f"no completions: {exc}")
        self.show(f"quickdraft: {exc}", "error")

    # --- a remote engine's state -------------------------------------------------------

    def _watch_engine(self, completer: Any) -> None:
        """Tell the client the remote engine's state now and at every change (not per request:
        one `showMessage` per failure state; each failed request is logged by the service)."""
        status = getattr(completer.backend, "engine_status", None)
        if status is None:
            return
        loop = asyncio.get_running_loop()

        def changed(state: str, message: str) -> None:  # any thread
            loop.call_soon_threadsafe(self._engine_state, completer, state, message)

        state, message = status.subscribe(changed)
        self._engine_state(completer, state, message)

    def _engine_state(self, completer: Any, state: str, message: str) -> None:
        if completer is not self.host.completer:
            return  # replaced by a reload meanwhile
        self.status.set(state, message)
        if state == "unavailable":
            self.show(f"quickdraft: {message}; completions resume when it answers", "warning")
        else:
            self.log(f"quickdraft: {message}")

    def stop(self) -> None:
        self.worker.stop()

    @property
    def was_shut_down(self) -> bool:
        """True once the client sent `shutdown` (the LSP exit status is 0 then, else 1)."""
        return bool(self.protocol._shutdown)

    def shutdown(self) -> None:
        # pygls waits for its thread pool here, whose stdin reader is blocked until the client
        # closes our stdin, which a client waiting for us to exit never does. Don't wait.
        if self._stop_event is not None:
            self._stop_event.set()
        if self._thread_pool:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)
        if self._server:
            self._server.close()


def create_server(
    defaults: QuickdraftConfig, loader: CompleterLoader = load_completer
) -> QuickdraftServer:
    """A server with every feature registered, models loaded with `loader` after initialize."""
    server = QuickdraftServer(defaults, loader)
    handlers.register_all(server)
    return server

"""The pygls server: protocol fixes, messages to the client, document sync, and its parts.

`assembly.create_server(defaults)` builds a ready server (every feature's handlers registered);
`quickdraft serve` (lsp/cli.py) starts it. `QuickdraftServer` is composed of parts, each handed
the server (as `server_api.ServerApi`): the completion and next-edit services (service.py), the
work ahead of the user, warm-up and prefetch (work_ahead.py), the model loading and its revert
(model_loading.py), the status (status.py).

Three things pygls 2.1 does not do, done here in `QuickdraftProtocol`:

* A request whose params fail to deserialize is dropped without a reply (pygls raises from
  `structure_message`, the JSON object hook, and the read loop only logs it), so the client
  would wait forever. We turn it into an `InvalidParams` error response naming what is wrong.
* Requests after `shutdown` are dropped without a reply; they get `InvalidRequest`.
* A message that cannot be read (not JSON, JSON but not a JSON-RPC object, an id that is
  neither a string nor a number) is shown to the user by what is wrong with it (pygls says
  "Internal Error" or an AttributeError); none has an id to answer. A request whose "jsonrpc"
  is not "2.0" gets `InvalidRequest` (pygls drops it, and the client would wait forever).

Document sync bypasses pygls' own workspace: `documents.DocumentStore` is the one copy; the
worker is told each document's text as it was when the update ran (`sync_document`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder
from pygls.exceptions import (
    FeatureRequestError,
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
)
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import MsgId
from pygls.protocol.language_server import lsp_method

from quickdraft import __version__
from quickdraft.config import QuickdraftConfig
from quickdraft.lsp.configuration import ConfigChange, ConfigurationManager
from quickdraft.lsp.documents import UTF16, Document, DocumentStore
from quickdraft.lsp.model_loading import ModelLoading
from quickdraft.lsp.service import CompletionService, NextEditService
from quickdraft.lsp.status import StatusReporter
from quickdraft.lsp.typed_ahead import TypedAheadCache
from quickdraft.lsp.work_ahead import WorkAhead
from quickdraft.lsp.worker import CompleterLoader, Loaded, ModelHost, ModelWorker, load_completer
from quickdraft.text import unusable_reason

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


def _unreadable(data: dict[str, Any], exc: BaseException) -> str:
    """What is wrong with a JSON-RPC object that is neither a request, a notification nor a
    response the server can read (the client cannot be answered: its id is unusable)."""
    msg_id = data.get("id")
    if "method" in data and not isinstance(msg_id, (str, int)):
        return f"a {data['method']!r} request whose id is neither a string nor a number"
    if "method" not in data and not ({"result", "error"} & data.keys()):
        return "a message with neither a method nor a result"
    return f"a message it could not read: {_describe_structure_error(exc)}"


def _json_shape(message: object) -> str:
    if isinstance(message, dict):
        return 'an object without "jsonrpc": "2.0"'
    if isinstance(message, list):
        return "a JSON array (batches are not part of LSP)"
    return f"the JSON value {json.dumps(message)}"[:120]


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
            raise JsonRpcInvalidRequest(f"ignored {_unreadable(data, exc)}") from exc

    def handle_message(self, message):
        if not hasattr(message, "jsonrpc"):  # the body was JSON, but not a JSON-RPC object
            raise JsonRpcInvalidRequest(f"ignored a message that is {_json_shape(message)}")
        request = hasattr(message, "id") and hasattr(message, "method")
        if message.jsonrpc != self.VERSION:  # pygls drops it silently: a request would hang
            what = f'a message with "jsonrpc": {json.dumps(message.jsonrpc)}, not "2.0"'
            if not request:
                raise JsonRpcInvalidRequest(f"ignored {what}")
            self._answer_error(
                message, types.ErrorCodes.InvalidRequest, f"{message.method}: {what}"
            )
            return
        if self._shutdown and request and message.method != types.EXIT:
            text = f"{message.method}: the server is shutting down"
            self._answer_error(message, types.ErrorCodes.InvalidRequest, text)
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
        self._answer_error(message, code, text)

    def _answer_error(self, request: Any, code: types.ErrorCodes, text: str) -> None:
        """The error response to `request` (any message with an id)."""
        self._send_response(request.id, error=types.ResponseError(code=code, message=text))

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
        self.serving: Loaded | None = None
        """The models serving, as their load told the event loop (`ModelLoading` sets it)."""
        typed_ahead = TypedAheadCache()
        self.work_ahead = WorkAhead(self, typed_ahead)
        self.completions = CompletionService(self, typed_ahead, self.work_ahead)
        self.next_edits = NextEditService(self, self.work_ahead)
        self.experimental: dict[str, Any] = {}
        """`capabilities.experimental` at `initialize` (the handlers of features outside the
        specification add theirs)."""
        self.status = StatusReporter(self)
        self.model_loading = ModelLoading(self, self.status, typed_ahead, self.work_ahead)
        self._pending_sync: dict[str, tuple[str, str, int]] = {}
        """uri -> (text, language, context.max_document_bytes) of each document whose update
        is queued on the worker and not started: the latest, read on the event loop."""
        self._sync_lock = threading.Lock()
        """Guards `_pending_sync`: the event loop hands the latest text over, the worker's job
        takes it when it runs (`_flush_sync`). The threads meet nowhere else here."""

    @property
    def works_ahead(self) -> bool:
        return self.serving is not None and self.serving.works_ahead

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
        elif isinstance(error, json.JSONDecodeError):
            self.show(f"quickdraft: ignored a message that is not JSON: {error}")
        else:
            self.show(f"quickdraft: internal error: {type(error).__name__}: {error}")

    # --- position encoding ------------------------------------------------------------

    def choose_encoding(self, capabilities: types.ClientCapabilities) -> str:
        encoding = ServerCapabilitiesBuilder.choose_position_encoding(capabilities)
        self.documents.encoding = str(getattr(encoding, "value", encoding))
        return self.documents.encoding

    # --- documents --------------------------------------------------------------------

    def sync_document(self, document: Document, *, opened: bool = False) -> None:
        """Tell the Completer (on the worker) about `document`'s current text, coalescing bursts
        of changes into one update that carries the latest text when it runs; then, when the
        worker is idle, warm the document's caches toward a request at the edit. An edited
        document is warmed first; one just `opened` after those already waiting, so that files
        opened together are warmed in the order they were opened (the client's didFocus says
        which one is in front). A change also has the document's next edit decided ahead
        (work_ahead.py)."""
        uri = document.uri
        snapshot = (
            document.text,
            document.language_id,
            self.config.current.context.max_document_bytes,
        )
        with self._sync_lock:
            queued = uri in self._pending_sync
            self._pending_sync[uri] = snapshot
        if not opened:
            self.work_ahead.decide_edit(uri)
        if queued:
            return
        self.worker.submit(self._flush_sync, uri)
        self.work_ahead.schedule_warm(uri, first=not opened)

    def _flush_sync(self, uri: str) -> None:  # worker thread
        with self._sync_lock:
            snapshot = self._pending_sync.pop(uri, None)
        if snapshot is None:  # closed since
            return
        text, language_id, max_bytes = snapshot
        if unusable_reason(text, max_bytes) is not None:
            self.host.close_document(uri)  # keep it out of the n-gram index
            return
        self.host.set_document(uri, text, language_id)

    def forget_document(self, uri: str) -> None:
        with self._sync_lock:
            self._pending_sync.pop(uri, None)  # a closed document is not synced
        self.work_ahead.forget(uri)
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
        """Load (or reload) the models for `config` (ModelLoading.load), the edit history
        bounded as it says."""
        self.configure_history(config)
        self.model_loading.load(config)

    def client_initialized(self) -> None:
        """The client finished its handshake: what was held for it may be sent now."""
        self.status.client_initialized()
        self.model_loading.client_initialized()

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

"""`textDocument/didOpen|didChange|didClose`: the document store and the Completer in step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer


def did_open(ls: QuickdraftServer, params: types.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    document = ls.documents.open(item.uri, item.text, item.language_id, item.version)
    ls.completions.forget(item.uri)
    ls.sync_document(document, opened=True)


def did_change(ls: QuickdraftServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    if uri not in ls.documents:
        ls.log(f"didChange for {uri}, which is not open; ignored", "warning")
        return
    changes = []
    for change in params.content_changes:
        range_ = getattr(change, "range", None)
        if range_ is None:
            changes.append((change.text, None))
        else:
            changes.append(
                (
                    change.text,
                    (
                        range_.start.line,
                        range_.start.character,
                        range_.end.line,
                        range_.end.character,
                    ),
                )
            )
    document = ls.documents.change(uri, changes, params.text_document.version)
    # A next edit asked for the older version would be dropped by the editor anyway; stopped
    # now, it frees the model for this keystroke's completion (the likelihood veto takes a
    # prefill of seconds on a slow CPU).
    ls.next_edits.cancel(uri)
    ls.sync_document(document)


def did_close(ls: QuickdraftServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.documents.close(uri)
    ls.forget_document(uri)


def register(server: QuickdraftServer) -> None:
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(did_close)

"""`textDocument/inlineCompletion` (LSP 3.18): the suggestion as ghost text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer

FEATURE = "inlineCompletion"


async def inline_completion(
    ls: QuickdraftServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    answer = await ls.completions.complete(
        params.text_document.uri,
        params.position,
        feature=FEATURE,
        request_id=ls.protocol.msg_id,
    )
    if answer is None:
        return types.InlineCompletionList(items=[])
    item = types.InlineCompletionItem(
        insert_text=answer.text,
        range=types.Range(start=answer.start, end=answer.end),
    )
    return types.InlineCompletionList(items=[item])


def register(server: QuickdraftServer) -> None:
    # pygls advertises `inlineCompletionProvider` only when options are given.
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        inline_completion
    )

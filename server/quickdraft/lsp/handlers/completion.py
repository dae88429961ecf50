"""`textDocument/completion`: the same suggestions as menu items, for clients without inline
completion (and for menus on demand in clients that have both). An inline completion and a
completion request for the same position share one generation (see service.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer
    from quickdraft.lsp.service import Answer

FEATURE = "completion"
SOURCE = "quickdraft"
LABEL_CHARS = 60


def completion_item(answer: Answer, index: int = 0) -> types.CompletionItem:
    """The answer's `index`th suggestion as an item whose textEdit replaces a single-line range
    containing the cursor (every answer starts at the cursor: CompletionService.complete)."""
    text, start = answer.items[index].text, answer.start
    end = answer.end if answer.end.line == answer.cursor.line else answer.cursor
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    label = lines[0] if lines else "(whitespace)"
    if len(label) > LABEL_CHARS:
        label = label[: LABEL_CHARS - 1] + "…"
    if len(lines) > 1:
        label += " …"
    return types.CompletionItem(
        label=label,
        label_details=types.CompletionItemLabelDetails(description=SOURCE),
        kind=types.CompletionItemKind.Text,
        detail=f"{SOURCE} completion",
        documentation=text,
        sort_text=str(index),
        filter_text=text,
        preselect=index == 0,
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=types.Range(start=start, end=end), new_text=text),
        data={"source": SOURCE},
    )


async def completion(ls: QuickdraftServer, params: types.CompletionParams) -> types.CompletionList:
    answer = await ls.completions.complete(
        params.text_document.uri,
        params.position,
        feature=FEATURE,
        request_id=ls.protocol.msg_id,
    )
    if answer is None:
        return types.CompletionList(is_incomplete=True, items=[])
    # Incomplete: the client asks again as the user types, which typed-ahead answers at once.
    items = [completion_item(answer, index) for index in range(len(answer.items))]
    return types.CompletionList(is_incomplete=True, items=items)


def register(server: QuickdraftServer) -> None:
    server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())(completion)

"""`textDocument/copilotInlineEdit` (the Copilot language server's next-edit request) and
`textDocument/didShowInlineEdit`.

Request params `{textDocument: {uri, version}, position}`; result `{edits: [{text, range,
textDocument: {uri, version}}]}`: the edits that turn the document, at the version asked
about, into what the model predicts next (lsp/service.py `NextEditService`; none when the
version is not the document's, nothing should change, or the model's answer is refused).
Params of the wrong shape (no uri, no integer version, no position of two non-negative
integers) get InvalidParams. The server advertises the request as
`capabilities.experimental.inlineEdit: true`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pygls.exceptions import JsonRpcInvalidParams

from quickdraft.lsp.params import param

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer

INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit"
FEATURE = "inlineEdit"
CAPABILITY = {"inlineEdit": True}
"""What `initialize` adds under `capabilities.experimental`."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_params(params: Any) -> tuple[str, int, tuple[int, int]]:
    """(uri, version, (line, character)) of a copilotInlineEdit request; JsonRpcInvalidParams
    naming what is missing or wrong otherwise."""
    document = param(params, "textDocument")
    uri = param(document, "uri")
    if not isinstance(uri, str) or not uri:
        raise JsonRpcInvalidParams(f"{INLINE_EDIT} needs textDocument.uri")
    version = param(document, "version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise JsonRpcInvalidParams(
            f"{INLINE_EDIT} needs textDocument.version (an integer), got {version!r}"
        )
    position = param(params, "position")
    line, character = param(position, "line"), param(position, "character")
    if not (_whole(line) and _whole(character)):
        raise JsonRpcInvalidParams(
            f"{INLINE_EDIT} needs position {{line, character}}: two non-negative integers, "
            f"got {position!r}"
        )
    return uri, version, (line, character)


async def inline_edit(ls: QuickdraftServer, params: Any) -> dict[str, Any]:
    uri, version, position = read_params(params)
    edits = await ls.next_edits.suggest(
        uri, version, position, request_id=ls.protocol.msg_id, feature=FEATURE
    )
    return {"edits": edits}


def did_show_inline_edit(ls: QuickdraftServer, params: Any) -> None:
    item = param(params, "item")
    document = param(item, "textDocument")
    ls.log(f"{DID_SHOW_INLINE_EDIT}: shown in {param(document, 'uri') or 'a document'}", "log")


def register(server: QuickdraftServer) -> None:
    server.feature(INLINE_EDIT)(inline_edit)
    server.feature(DID_SHOW_INLINE_EDIT)(did_show_inline_edit)
    server.experimental.update(CAPABILITY)

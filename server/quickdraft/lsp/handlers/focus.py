"""`textDocument/didFocus`: the document the person now looks at (the Copilot language server's
notification, `{textDocument: {uri}}`), and, as quickdraft's clients add, where the cursor is
(`position`, LSP units). The server warms that document first (work_ahead.WorkAhead.focus)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quickdraft.lsp.params import param

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer

DID_FOCUS = "textDocument/didFocus"


def read_focus(params: Any) -> tuple[str, tuple[int, int] | None]:
    """(uri, (line, character) or None) of a didFocus notification; ValueError when the uri is
    missing or the position is not two non-negative integers."""
    uri = param(param(params, "textDocument"), "uri") or param(params, "uri")
    if not isinstance(uri, str) or not uri:
        raise ValueError("didFocus needs textDocument.uri")
    position = param(params, "position")
    if position is None:
        return uri, None
    line, character = param(position, "line"), param(position, "character")
    if not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (line, character)
    ):
        raise ValueError(f"didFocus position must be two non-negative integers, got {position!r}")
    return uri, (line, character)


def did_focus(ls: QuickdraftServer, params: Any) -> None:
    try:
        uri, position = read_focus(params)
    except ValueError as exc:
        ls.log(f"{exc}; ignored", "warning")
        return
    ls.work_ahead.focus(uri, position)


def register(server: QuickdraftServer) -> None:
    server.feature(DID_FOCUS)(did_focus)

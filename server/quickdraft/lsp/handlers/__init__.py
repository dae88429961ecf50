"""One module per LSP feature; `register_all` wires them onto a server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.lsp.handlers import (
    completion,
    configuration,
    focus,
    inline_completion,
    inline_edit,
    lifecycle,
    sync,
)

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer


def register_all(server: QuickdraftServer) -> None:
    for module in (
        lifecycle,
        sync,
        focus,
        configuration,
        inline_completion,
        completion,
        inline_edit,
    ):
        module.register(server)

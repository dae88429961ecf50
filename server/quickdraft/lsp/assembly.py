"""The server assembled: `create_server`, a `QuickdraftServer` with every feature's handlers.

Above both server.py and handlers/: the handlers take the server they are registered on, and
the server knows none of them.
"""

from __future__ import annotations

from quickdraft.config import QuickdraftConfig
from quickdraft.lsp import handlers
from quickdraft.lsp.server import QuickdraftServer
from quickdraft.lsp.worker import CompleterLoader, load_completer


def create_server(
    defaults: QuickdraftConfig, loader: CompleterLoader = load_completer
) -> QuickdraftServer:
    """A server with every feature registered, models loaded with `loader` after initialize."""
    server = QuickdraftServer(defaults, loader)
    handlers.register_all(server)
    return server

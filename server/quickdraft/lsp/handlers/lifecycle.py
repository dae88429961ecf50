"""`initialize`, `initialized`, `shutdown`, `exit`: settings, position encoding, model loading."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types

from quickdraft.errors import ConfigError
from quickdraft.lsp.handlers.configuration import pull_configuration

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer


def initialize(ls: QuickdraftServer, params: types.InitializeParams) -> None:
    ls.choose_encoding(params.capabilities)
    folders = params.workspace_folders or []
    root = folders[0].uri if folders else (params.root_uri or params.root_path)
    if root:
        ls.worker.submit(ls.host.set_root, root)  # prompts show paths relative to it
    try:
        ls.config.apply_initialization_options(params.initialization_options)
    except ConfigError as exc:
        ls.show(f"quickdraft: invalid configuration, using defaults: {exc}", "error")
    # Models load on the worker while the client finishes its handshake; completion requests
    # queue behind the load.
    ls.load_models(ls.config.current)


async def initialized(ls: QuickdraftServer, params: types.InitializedParams) -> None:
    ls.client_initialized()  # status and loading progress, held until now
    await pull_configuration(ls)


def shutdown(ls: QuickdraftServer, params: None) -> None:
    for uri in ls.documents.uris():
        ls.completions.forget(uri)


def exit_(ls: QuickdraftServer, params: None) -> None:
    for uri in ls.documents.uris():
        ls.completions.forget(uri)  # a running generation stops at its next step
    ls.stop()


def register(server: QuickdraftServer) -> None:
    server.feature(types.INITIALIZE)(initialize)
    server.feature(types.INITIALIZED)(initialized)
    server.feature(types.SHUTDOWN)(shutdown)
    server.feature(types.EXIT)(exit_)

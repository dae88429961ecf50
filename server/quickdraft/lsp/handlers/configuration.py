"""`workspace/didChangeConfiguration` and the `workspace/configuration` pull (section
"quickdraft"). Invalid settings: a `window/showMessage` saying what is wrong, previous kept."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from quickdraft.errors import ConfigError
from quickdraft.lsp.configuration import SECTION

if TYPE_CHECKING:
    from quickdraft.lsp.server import QuickdraftServer

PULL_TIMEOUT_S = 5.0


def supports_pull(ls: QuickdraftServer) -> bool:
    try:
        workspace = ls.client_capabilities.workspace
    except AttributeError:
        return False
    return bool(workspace and workspace.configuration)


def apply_settings(ls: QuickdraftServer, payload: Any, *, strict: bool, origin: str) -> bool:
    """Validate and apply; False when `payload` held no quickdraft settings."""
    try:
        change = ls.config.apply_settings(payload, strict=strict)
    except ConfigError as exc:
        ls.show(f"quickdraft: invalid configuration ({origin}), keeping the previous one: {exc}")
        return True
    if change is None:
        return False
    ls.apply_config_change(change)
    return True


async def pull_configuration(ls: QuickdraftServer) -> None:
    """Ask the client for section "quickdraft" (when it can answer) and apply it."""
    if not supports_pull(ls):
        return
    params = types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
    try:
        # Shielded: an answer arriving after the timeout must find its future still pending
        # (pygls raises on a cancelled one), and is then simply dropped.
        pending = asyncio.ensure_future(ls.workspace_configuration_async(params))
        result = await asyncio.wait_for(asyncio.shield(pending), PULL_TIMEOUT_S)
    except Exception as exc:  # a client that fails or never answers keeps what we have
        ls.log(f"workspace/configuration failed: {exc!r}", "warning")
        return
    value = result[0] if result else None
    apply_settings(ls, {SECTION: value}, strict=True, origin="workspace/configuration")


async def did_change_configuration(
    ls: QuickdraftServer, params: types.DidChangeConfigurationParams
) -> None:
    if apply_settings(ls, params.settings, strict=False, origin="didChangeConfiguration"):
        return
    # No settings of ours in the notification (the pull model): ask for them.
    await pull_configuration(ls)


def register(server: QuickdraftServer) -> None:
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(did_change_configuration)

"""Shared fixtures for the end-to-end tests: tiny model directories and LSP sessions."""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import make_test_lsp_client

STATS = "$/quickdraft/stats"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """A directory with `target/` and `draft/`: tiny random-init models sharing a tokenizer."""
    from quickdraft.testing import save_tiny_pair

    directory = tmp_path_factory.mktemp("tiny")
    save_tiny_pair(directory)
    return directory


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    return env


def client_capabilities(
    *, inline: bool = True, pull: bool = False, encodings: list[str] | None = None
) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        general=types.GeneralClientCapabilities(
            position_encodings=encodings or [types.PositionEncodingKind.Utf16]
        ),
        text_document=types.TextDocumentClientCapabilities(
            synchronization=types.TextDocumentSyncClientCapabilities(),
            completion=types.CompletionClientCapabilities(
                completion_item=types.ClientCompletionItemOptions(
                    label_details_support=True, snippet_support=False
                )
            ),
            inline_completion=types.InlineCompletionClientCapabilities() if inline else None,
        ),
        workspace=types.WorkspaceClientCapabilities(
            configuration=pull,
            did_change_configuration=types.DidChangeConfigurationClientCapabilities(),
        ),
        window=types.WindowClientCapabilities(
            show_message=types.ShowMessageRequestClientCapabilities()
        ),
    )


@asynccontextmanager
async def lsp_session(
    command: list[str],
    *,
    init_options=None,
    inline: bool = True,
    pull_configuration=None,
    encodings: list[str] | None = None,
):
    """Start `command`, initialize it, yield the client; shut down cleanly afterwards.

    `pull_configuration`: when given, the client answers `workspace/configuration` with it.
    Stats notifications are collected in `client.stats`.
    """
    client = make_test_lsp_client()
    client.stats = []

    @client.feature(STATS)
    def _stats(params):
        client.stats.append(params)

    if pull_configuration is not None:
        client.set_configuration(pull_configuration)
    await client.start_io(*command, env=server_env())
    try:
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=client_capabilities(
                    inline=inline, pull=pull_configuration is not None, encodings=encodings
                ),
                initialization_options=init_options,
            )
        )
        client.initialize_result = result
        yield client
    finally:
        # Also after a failed assertion: a server never told to exit is never waited for.
        with suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
        if client._server is not None and client._server.returncode is None:
            client._server.kill()
        await client.stop()


@pytest.fixture
def session():
    return lsp_session


@pytest.fixture
def python() -> str:
    return sys.executable

"""Shared fixtures for the end-to-end tests: tiny model directories and LSP sessions."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from concurrent.futures import Future
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.protocol.json_rpc import JsonRPCRequestMessage
from pytest_lsp import make_test_lsp_client

STATS = "$/quickdraft/stats"
STATUS = "$/quickdraft/status"


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
            show_message=types.ShowMessageRequestClientCapabilities(),
            work_done_progress=True,
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
    Stats notifications are collected in `client.stats`, status notifications in
    `client.statuses` (as plain dicts), work-done progress in `client.progress_reports`.
    """
    client = make_test_lsp_client()
    client.stats = []
    client.statuses = []

    @client.feature(STATS)
    def _stats(params):
        client.stats.append(params)

    @client.feature(STATUS)
    def _status(params):
        client.statuses.append(plain(params))

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


# --- helpers for the tests ------------------------------------------------------------------


def items_of(result) -> list:
    if result is None:
        return []
    return list(getattr(result, "items", result))


def open_doc(client, uri: str, text: str, language_id: str = "python", version: int = 1):
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id=language_id, version=version, text=text
            )
        )
    )


def edit(client, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str):
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=start[0], character=start[1]),
                        end=types.Position(line=end[0], character=end[1]),
                    ),
                    text=text,
                )
            ],
        )
    )


async def inline(
    client,
    uri: str,
    line: int,
    character: int,
    trigger: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Automatic,
):
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(trigger_kind=trigger),
        )
    )


async def complete(client, uri: str, line: int, character: int):
    return await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
        )
    )


async def inline_text(client, uri: str, line: int, character: int) -> str | None:
    items = items_of(await inline(client, uri, line, character))
    return items[0].insert_text if items else None


def rng(item) -> tuple[int, int, int, int]:
    r = item.range if hasattr(item, "range") else item.text_edit.range
    return (r.start.line, r.start.character, r.end.line, r.end.character)


async def raw_request(client, method: str, params):
    """Send a request exactly as given (no client-side type checks); await the answer."""
    msg_id = f"raw-{uuid.uuid4()}"
    future: Future = Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data(
        JsonRPCRequestMessage(id=msg_id, method=method, jsonrpc="2.0", params=params)
    )
    return await asyncio.wait_for(asyncio.wrap_future(future), 10)


async def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)  # pacing: polls the predicate (the state waited for)


def plain(value):
    """Notification params as plain dicts (pygls turns unknown objects into named tuples)."""
    if hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def shown(client, level=types.MessageType.Error) -> list[str]:
    return [m.message for m in client.messages if m.type == level]


@pytest.fixture
def session():
    return lsp_session


# --- a real serving engine (the remote backend's tests) -------------------------------------

ENGINE_KEY_ENV = "QUICKDRAFT_TEST_ENGINE_KEY"
"""The variable `quickdraft serve --api-key-env` reads the engine's key from in these tests."""


@pytest.fixture(scope="session")
def engine_key() -> str:
    """A fresh API key, in the environment the tests and their `quickdraft serve` run in."""
    import secrets

    key = f"qd-secret-{secrets.token_hex(12)}"
    os.environ[ENGINE_KEY_ENV] = key
    yield key
    os.environ.pop(ENGINE_KEY_ENV, None)


@pytest.fixture(scope="session")
def llama_engine(tmp_path_factory, engine_key):
    """llama.cpp's OpenAI-compatible server on the 0.5B GGUF, wanting `engine_key`, on a free
    loopback port for the whole session (see llamacpp_engine.py)."""
    from llamacpp_engine import LlamaEngine, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    engine = LlamaEngine(log, api_key=engine_key).start()
    yield engine
    engine.stop()

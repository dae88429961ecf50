"""End to end with a real engine: LSP client -> `quickdraft serve --backend openai` -> llama.cpp's
OpenAI-compatible server on the 0.5B GGUF (llamacpp_engine.py) -> completion.

* The suggestion is what the engine answers for the very prompt quickdraft builds, sent to it
  directly, after the same post-processing.
* A cancellation storm: 8 requests, 7 cancelled; the last is answered, and the engine's log
  shows it stopped generating for every stream quickdraft closed.
* The engine down when the server starts, killed mid-session and restarted: one message per
  failure state, empty answers meanwhile, `$/quickdraft/status` following, completions back.
* The API key appears in no log line and no message.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import pytest_asyncio
from conftest import (
    ENGINE_KEY_ENV,
    edit,
    inline,
    items_of,
    lsp_session,
    open_doc,
    plain,
    wait_for,
)
from llamacpp_engine import (
    PRESET,
    LlamaEngine,
    direct_completion,
    free_port,
    unavailable_reason,
)
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

MAX_TOKENS = 12
STORM_MAX_TOKENS = 48


def serve_command(url: str, log_file, *flags: str, key_env: str = ENGINE_KEY_ENV) -> list[str]:
    return [
        sys.executable,
        "-m",
        "quickdraft.cli",
        "serve",
        "--backend",
        "openai",
        "--url",
        url,
        "--api-key-env",
        key_env,
        "--preset",
        PRESET,
        "--max-tokens",
        str(MAX_TOKENS),
        "--log-level",
        "debug",
        *(["--log-file", str(log_file)] if log_file is not None else []),
        *flags,
    ]


def close(client, uri: str) -> None:
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


def warnings_shown(client) -> list[str]:
    return [m.message for m in client.messages if m.type == types.MessageType.Warning]


def logged(client) -> list[str]:
    return [m.message for m in client.log_messages]


def engine_states(client) -> list[dict]:
    """The statuses after loading: what the remote engine's watcher said."""
    return [s for s in client.statuses if s["state"] != "loading"]


def engine_state(client) -> str | None:
    states = engine_states(client)
    return states[-1]["state"] if states else None


@pytest.fixture(scope="module")
def server_log(tmp_path_factory):
    """The server's stderr, where its Python log goes (no --log-file)."""
    return tmp_path_factory.mktemp("serve") / "serve.stderr"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(llama_engine, server_log):
    # sh runs `serve` with its stderr in server_log ($0), everything else as it was.
    command = ["sh", "-c", 'exec "$@" 2>"$0"', str(server_log)]
    async with lsp_session([*command, *serve_command(llama_engine.url, None)]) as client:
        await wait_for(lambda: engine_state(client) is not None, 120)
        yield client


@pytest.fixture(scope="module")
def reference(llama_engine, engine_key):
    """The pipeline `quickdraft serve` runs, built here from the same flags (prompts only)."""
    from quickdraft.cli import build_parser
    from quickdraft.cli_args import config_dict_from_args
    from quickdraft.completer import Completer
    from quickdraft.config import load_config
    from quickdraft.remote import load_remote_backend

    args = build_parser().parse_args(serve_command(llama_engine.url, None)[3:])
    config = load_config(config_dict_from_args(args))
    completer = Completer(load_remote_backend(config, check=False), config)
    yield completer
    completer.close()


def direct_answer(engine, reference, uri: str, text: str, line: int, col: int) -> str:
    """Build the prompt as the server does, send it to the engine ourselves, post-process."""
    from quickdraft.generation import CompletionRequest

    for other in list(reference.documents):
        reference.close_document(other)
    reference.set_document(uri, text, "python")
    prepared = reference.prepare(CompletionRequest(uri, text, line, col, "python"))
    raw = direct_completion(
        engine,
        prepared.prompt.text,
        prepared.max_new_tokens,
        reference.backend.generator.stop_strings,
    )
    return prepared.finish_text(raw)[1]


async def test_the_suggestion_is_what_the_engine_answers_for_the_same_prompt(
    client, llama_engine, engine_key, reference
):
    ready = dict(client.statuses[-1])
    models = ready.pop("models")  # what runs, for the status item (describe())
    assert ready == {
        "state": "ready",
        "message": f"the completion engine at {llama_engine.url} is ready",
        "backend": "openai",
    }
    assert models["backend"] == "openai" and models["engine"]["model"] == "qwen2.5-coder-0.5b"
    uri = "file:///work/fib.py"
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return \n"
    want = direct_answer(llama_engine, reference, uri, text, 3, 11)
    assert want  # the engine does say something here
    open_doc(client, uri, text)
    try:
        [item] = items_of(await inline(client, uri, 3, 11))
        assert item.insert_text == want
        await wait_for(lambda: client.stats)
        stats = plain(client.stats[-1])
        assert stats["tokens"] > 0 and stats["cached"] is False
        assert stats["engine"]["strategy"] == "remote"
    finally:
        close(client, uri)


async def test_a_cancellation_storm_leaves_the_engine_idle(client, llama_engine):
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"quickdraft": {"decoding": {"maxNewTokens": STORM_MAX_TOKENS}}}
        )
    )
    uri = "file:///work/storm.py"
    lines = [f"def scale_{i}(values, factor):\n    return [value * \n" for i in range(8)]
    open_doc(client, uri, "".join(lines))
    first_number = len(llama_engine.completions()) + 1

    def request(i: int):
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=2 * (7 - i) + 1, character=20),  # the last: line 1
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic
            ),
        )
        return asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=f"storm-{i}"
            )
        )

    try:
        pending = [request(0)]
        # The first one is streaming from the engine before the others come.
        await wait_for(lambda: first_number in llama_engine.completions(), 120)
        pending += [request(i) for i in range(1, 8)]
        for i in range(7):
            client.cancel_request(types.CancelParams(id=f"storm-{i}"))
        answers = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 120)
        for answer in answers[:7]:  # cancelled, or superseded by the next keystroke
            assert isinstance(answer, JsonRpcRequestCancelled) or items_of(answer) == []
        assert items_of(answers[7]) and items_of(answers[7])[0].insert_text

        records = llama_engine.completions()
        storm = [records[n] for n in sorted(records) if n >= first_number]
        assert 1 <= len(storm) <= 8
        for record in storm[:-1]:  # every stream closed early: the engine stopped there
            assert record.chunks < STORM_MAX_TOKENS and not record.produced_after_next_started
        assert not storm[0].completed
    finally:
        close(client, uri)
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"quickdraft": {}})
        )


async def test_the_key_is_in_no_log_line_and_no_message(client, server_log, engine_key):
    """Not on the server's stderr (its debug log: the requests to the engine included), nor in
    what it told the client; test_a_wrong_key_is_reported_once_and_never_shown checks a
    --log-file."""
    assert os.environ[ENGINE_KEY_ENV] == engine_key
    text = server_log.read_text(encoding="utf-8")
    assert "completion engine" in text and "inlineCompletion" in text  # the log is the real one
    assert engine_key not in text
    for message in [*logged(client), *(m.message for m in client.messages)]:
        assert engine_key not in message


async def test_a_wrong_key_is_reported_once_and_never_shown(llama_engine, engine_key, tmp_path):
    os.environ["QUICKDRAFT_TEST_WRONG_KEY"] = "qd-wrong-key-for-the-test"
    log = tmp_path / "serve.log"
    command = serve_command(llama_engine.url, log, key_env="QUICKDRAFT_TEST_WRONG_KEY")
    try:
        async with lsp_session(command) as client:
            await wait_for(lambda: warnings_shown(client), 120)
            uri = "file:///work/wrong.py"
            open_doc(client, uri, "x = 1\n")
            for _ in range(2):
                assert items_of(await inline(client, uri, 0, 5)) == []
            [message] = warnings_shown(client)
            assert "HTTP 401" in message and "$QUICKDRAFT_TEST_WRONG_KEY" in message
            assert engine_state(client) == "unavailable"
            await wait_for(lambda: sum("HTTP 401" in m for m in logged(client)) >= 2)
            everything = [log.read_text(encoding="utf-8"), *logged(client), message]
            for line in everything:
                assert "qd-wrong-key-for-the-test" not in line and engine_key not in line
    finally:
        os.environ.pop("QUICKDRAFT_TEST_WRONG_KEY", None)


async def test_an_engine_down_at_start_killed_and_restarted(engine_key, tmp_path):
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    engine = LlamaEngine(tmp_path / "engine.log", port=free_port(), api_key=engine_key)
    uri = "file:///work/down.py"
    text = "def area(width, height):\n    return \n"
    try:
        async with lsp_session(serve_command(engine.url, tmp_path / "serve.log")) as client:
            # `serve` starts and says what is wrong.
            await wait_for(lambda: warnings_shown(client), 120)
            assert "cannot reach the completion engine at" in warnings_shown(client)[0]
            assert "Connection refused" in warnings_shown(client)[0]
            assert client.statuses[-1]["state"] == "unavailable"
            assert client.statuses[-1]["backend"] == "openai"
            open_doc(client, uri, text)
            assert items_of(await inline(client, uri, 1, 11)) == []

            await asyncio.to_thread(engine.start)
            await wait_for(lambda: engine_state(client) == "ready", 60)  # the probe saw it
            assert items_of(await inline(client, uri, 1, 11))

            engine.kill()
            for n in range(3):  # every request answered, empty, and logged; one message
                other = f"file:///work/down_{n}.py"  # (new text: no typed-ahead answer)
                open_doc(client, other, f"def area_{n}(width, height):\n    return \n")
                assert items_of(await inline(client, other, 1, 11)) == []
                close(client, other)
            assert engine_state(client) == "unavailable"
            assert len(warnings_shown(client)) == 2
            failures = [m for m in logged(client) if "inlineCompletion: " in m and "engine" in m]
            assert len(failures) >= 4

            await asyncio.to_thread(engine.start)
            await wait_for(lambda: engine_state(client) == "ready", 60)
            edit(client, uri, 2, (1, 11), (1, 11), " ")
            assert items_of(await inline(client, uri, 1, 12))
            assert len(warnings_shown(client)) == 2
            assert [s["state"] for s in engine_states(client)] == [
                "unavailable",
                "ready",
                "unavailable",
                "ready",
            ]
    finally:
        engine.stop()

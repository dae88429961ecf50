"""`quickdraft serve` end to end with real (tiny, random-init) models and the real Completer.

The server's answers are checked against a `Completer` built in this process from the same
models (greedy float64 decoding is deterministic), so the tests see that the server converted
positions (UTF-16 with emoji and CJK) and kept documents and settings exactly as it should.
The protocol details are covered with a fake Completer in test_lsp_protocol.py.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time

import pytest
import pytest_asyncio
from conftest import (
    complete,
    edit,
    inline,
    items_of,
    lsp_session,
    open_doc,
    plain,
    raw_request,
    rng,
    shown,
    wait_for,
)
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcMethodNotFound, JsonRpcRequestCancelled

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]


def serve_command(models, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "quickdraft.cli",
        "serve",
        "--target",
        str(models / "target"),
        "--draft",
        str(models / "draft"),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--no-calibrate",
        "--max-tokens",
        "16",
        # Random tiny models are unsure of every token: no confidence floor, or nothing shows.
        "--min-confidence",
        "0",
        *flags,
    ]


@pytest.fixture(scope="module")
def reference(tiny_models):
    """The Completer `quickdraft serve` runs, built here: what the server must answer."""
    from quickdraft.cli import build_parser
    from quickdraft.cli_args import config_dict_from_args
    from quickdraft.config import load_config
    from quickdraft.models.loading import load_models
    from quickdraft.testing import local_completer

    args = build_parser().parse_args(serve_command(tiny_models)[3:])
    config = load_config(config_dict_from_args(args))
    return local_completer(load_models(config.model), config)


def expected(
    reference, uri: str, text: str, line: int, character: int, language="python", others=()
):
    """What the server answers at (line, character) of `uri`, with the `others` (uri, text)
    open before it, in that order, as the client opened them: every open file's top is in
    the prompt's head."""
    from quickdraft.generation import CompletionRequest

    for other in list(reference.documents):
        reference.close_document(other)
    for other, other_text in others:
        reference.set_document(other, other_text, language)
    reference.set_document(uri, text, language)
    request = CompletionRequest(uri, text, line, character, language)
    return reference.complete(request).text


FUNCTIONS = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(20))
"""A document of 20 small functions (about 400 tokens): room for a cache to matter."""


async def models_ready(client) -> None:
    await wait_for(lambda: any("models ready" in m.message for m in client.log_messages), 120)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_models):
    async with lsp_session(serve_command(tiny_models)) as client:
        await models_ready(client)
        yield client


def close(client, *uris: str) -> None:
    for uri in uris:
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )


def configure(client, settings: dict) -> None:
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"quickdraft": settings})
    )


async def test_capability_advertised(client):
    caps = client.initialize_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.position_encoding == types.PositionEncodingKind.Utf16


async def test_inline_completion_matches_the_completer_at_a_utf16_position(client, reference):
    uri = "file:///work/emoji.py"
    text = "x = '😀中' + y\n"  # the cursor before "y": 11 code points, 12 UTF-16 units
    want = expected(reference, uri, text, 0, 11)
    assert want  # the tiny model does say something here
    open_doc(client, uri, text)
    try:
        [item] = items_of(await inline(client, uri, 0, 12))
        assert item.insert_text == want
        assert rng(item) == (0, 12, 0, 12)
        await wait_for(lambda: any(plain(s)["uri"] == uri for s in client.stats))
        stats = [plain(s) for s in client.stats if plain(s)["uri"] == uri][-1]
        assert stats["tokens"] > 0 and stats["tokensPerForward"] > 0
        assert stats["prefillTokens"] + stats["reusedTokens"] > 0
        assert stats["cached"] is False and stats["latencyMs"] > 0
    finally:
        close(client, uri)


async def test_edits_then_completion_see_the_new_text(client, reference):
    uri = "file:///work/edit.py"
    open_doc(client, uri, "def f(a, b):\n    return 1\n")
    try:
        # Replace "1" with "a + 😀" (UTF-16 range), then complete after the emoji.
        edit(client, uri, 2, (1, 11), (1, 12), "a + '😀'")
        text = "def f(a, b):\n    return a + '😀'\n"
        want = expected(reference, uri, text, 1, 17)  # after the emoji: 17 code points
        [item] = items_of(await inline(client, uri, 1, 18))  # ... 18 UTF-16 units
        assert item.insert_text == want
        assert rng(item) == (1, 18, 1, 18)
    finally:
        close(client, uri)


async def test_configuration_applies_per_language(client, reference):
    uri, rust = "file:///work/conf.py", "file:///work/conf.rs"
    open_doc(client, uri, "x = '😀中' + ")
    open_doc(client, rust, "let x = ", language_id="rust")
    try:
        configure(client, {"languages": {"python": {"enabled": False}}})
        assert items_of(await inline(client, uri, 0, 12)) == []
        await inline(client, rust, 0, 8)  # rust still runs the model
        await wait_for(lambda: any(plain(s)["uri"] == rust for s in client.stats))

        configure(client, {"languages": {"python": {"maxNewTokens": 2}}})
        before = len(client.stats)
        await inline(client, uri, 0, 12)
        await wait_for(lambda: len(client.stats) > before)
        assert 0 < plain(client.stats[-1])["tokens"] <= 2
    finally:
        configure(client, {})
        close(client, uri, rust)


async def test_bad_input_gets_answers_and_the_server_keeps_serving(client, reference):
    uri, blob, big = "file:///work/ok.py", "file:///work/blob.py", "file:///work/big.py"
    open_doc(client, uri, "x = '😀中' + ")
    try:
        with pytest.raises(JsonRpcInvalidParams):
            await raw_request(
                client,
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                {"textDocument": {"uri": uri}, "position": {"line": 0}},
            )
        with pytest.raises(JsonRpcMethodNotFound):
            await raw_request(client, "quickdraft/unknown", {"x": 1})
        assert items_of(await inline(client, "file:///work/never-opened.py", 0, 0)) == []
        assert items_of(await inline(client, uri, 3, 0)) == []
        assert items_of(await inline(client, uri, 0, 13)) == []
        open_doc(client, blob, "data = b'\x00\x01'\n")
        assert items_of(await inline(client, blob, 1, 0)) == []
        configure(client, {"context": {"maxDocumentBytes": 4096}})
        open_doc(client, big, "#" * 5000 + "\nx = ")
        assert items_of(await inline(client, big, 1, 4)) == []
        configure(client, {"decoding": {"temperature": "hot"}})
        await wait_for(lambda: any("decoding.temperature" in m for m in shown(client)))
        # Still serving: the model ran for this request and answered what the pipeline gives
        # (possibly nothing: a random tiny model may write only control characters).
        before = len(client.stats)
        answer = [item.insert_text for item in items_of(await inline(client, uri, 0, 12))]
        await wait_for(lambda: len(client.stats) > before)
        assert plain(client.stats[-1])["source"] == "model"
        want = expected(reference, uri, "x = '😀中' + ", 0, 11)  # 12 in UTF-16
        assert answer == ([want] if want else [])
    finally:
        configure(client, {})
        close(client, uri, blob, big)


async def test_completion_fallback_for_a_client_without_inline_completion(tiny_models, reference):
    uri = "file:///work/fallback.py"
    # A random tiny model writes nothing usable after some prompts: take the first (fixed
    # order) where the server must answer something.
    candidates = ["s = '中文' + ", "total = '中' + str(", "values = ['中文', "]
    # (BMP characters only: code points and UTF-16 units count alike)
    text, want = next((t, w) for t in candidates if (w := expected(reference, uri, t, 0, len(t))))
    character = len(text)
    async with lsp_session(serve_command(tiny_models), inline=False) as client:
        open_doc(client, uri, text)
        [item] = items_of(await complete(client, uri, 0, character))
        assert item.text_edit.new_text == want
        assert rng(item) == (0, character, 0, character)
        assert "quickdraft" in item.detail


@pytest.fixture(scope="module")
def endless_models(tiny_models, tmp_path_factory):
    """The tiny pair, unable to end a line or a document: generation runs to max tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tmp_path_factory.mktemp("endless")
    for name in ("target", "draft"):
        tokenizer = AutoTokenizer.from_pretrained(tiny_models / name)
        model = AutoModelForCausalLM.from_pretrained(tiny_models / name, dtype=torch.float64)
        # The merge and the special tokens, line breaks, and the control characters a
        # completion may not hold (they would end it).
        from quickdraft.postprocess import first_unusable

        banned = list(range(256, len(tokenizer))) + tokenizer.convert_tokens_to_ids(["Ċ", "č"])
        banned += [i for i in range(256) if first_unusable(tokenizer.decode([i])) is not None]
        with torch.no_grad():
            model.lm_head.weight[banned] = 0.0
        model.save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def test_cancel_and_supersede_stop_a_long_generation(endless_models):
    command = serve_command(endless_models, "--strategy", "ar", "--max-tokens", "8")
    long_python = {"languages": {"python": {"maxNewTokens": 4000}}}
    async with lsp_session(command, init_options=long_python) as client:
        await models_ready(client)
        uri, short = "file:///work/long.py", "file:///work/short.rs"
        open_doc(client, uri, "x = '😀中' + \n")
        open_doc(client, short, "let x = ", language_id="rust")
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=0, character=12),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic
            ),
        )
        # $/cancelRequest
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="long-1"
            )
        )
        # Cancelled once the worker runs it (the server logs that), not before: it is a running
        # generation that must stop.
        await wait_for(lambda: logged(client, "[long-1] inlineCompletion: generating ("), 60)
        client.cancel_request(types.CancelParams(id="long-1"))
        with pytest.raises(JsonRpcRequestCancelled):
            await asyncio.wait_for(pending, 120)
        assert logged(client, "[long-1] inlineCompletion: cancelled")
        # The worker is free again: the next request is the model's own, 8 tokens at most.
        assert items_of(await inline(client, short, 0, 8))
        [after_cancel] = [plain(s) for s in client.stats]
        assert after_cancel["uri"] == short and after_cancel["source"] == "model"
        assert 0 < after_cancel["tokens"] <= 8

        # A newer request for the same document supersedes the older one.
        started = len(logged(client, "inlineCompletion: generating ("))
        older = asyncio.ensure_future(inline(client, uri, 0, 12))
        await wait_for(lambda: len(logged(client, "inlineCompletion: generating (")) > started, 60)
        edit(client, uri, 2, (1, 0), (1, 0), "y = ")
        configure(client, {"languages": {"python": {"maxNewTokens": 4}}})
        newer = await inline(client, uri, 1, 4)
        assert items_of(await asyncio.wait_for(older, 120)) == []
        assert items_of(newer)
        assert logged(client, "superseded by a newer request")
        # Neither long generation was answered or reported: the two answers are the short ones.
        stats = [plain(s) for s in client.stats]
        assert [(s["uri"], s["source"]) for s in stats] == [(short, "model"), (uri, "model")]
        assert 0 < stats[-1]["tokens"] <= 4


async def test_a_model_that_cannot_load_is_reported_and_the_server_answers(tmp_path):
    command = [sys.executable, "-m", "quickdraft.cli", "serve", "--target", str(tmp_path / "nope")]
    async with lsp_session([*command, "--device", "cpu", "--no-calibrate"]) as client:
        await wait_for(lambda: shown(client), 120)
        assert "could not load models" in shown(client)[0]
        assert "nope" in shown(client)[0]
        uri = "file:///work/a.py"
        open_doc(client, uri, "x = 1")
        assert items_of(await inline(client, uri, 0, 5)) == []


# --- work ahead of the user (issue 12) ----------------------------------------------------------

APPEND = {"context": {"layout": "append"}}


def logged(client, needle: str) -> list[str]:
    return [m.message for m in client.log_messages if needle in m.message]


async def test_accepting_a_suggestion_is_answered_from_prefetched_work(endless_models):
    """The model's answer is prefetched for the text accepting it gives: Tab, then the next
    request costs no model time."""
    async with lsp_session(serve_command(endless_models), init_options=APPEND) as client:
        await models_ready(client)
        uri = "file:///work/accept.py"
        open_doc(client, uri, "total = ")
        [item] = items_of(await inline(client, uri, 0, 8))
        suggestion = item.insert_text
        assert suggestion and "\n" not in suggestion
        await wait_for(lambda: logged(client, "prefetch:"), 60)
        edit(client, uri, 2, (0, 8), (0, 8), suggestion)  # Tab
        before = len(client.stats)
        [after] = items_of(await inline(client, uri, 0, 8 + len(suggestion)))
        await wait_for(lambda: len(client.stats) > before)
        stats = plain(client.stats[-1])
        assert stats["source"] == "prefetch" and stats["cached"] is True
        assert stats["prefillTokens"] == 0 and after.insert_text


async def type_past_the_suggestion(client, uri, line, character, suggestion) -> dict:
    """Type a character `suggestion` does not start with (version 2 of the document), ask
    there, and return the answer's stats: a request the model must answer."""
    typed = next(c for c in "qzQZ" if not suggestion.startswith(c))
    edit(client, uri, 2, (line, character), (line, character), typed)
    before = len(client.stats)
    await inline(client, uri, line, character + 1)
    await wait_for(lambda: len(client.stats) > before)
    return plain(client.stats[-1])


async def test_a_prefetch_leaves_the_documents_cache_to_what_is_typed(endless_models):
    """Prefetching computes a text the user may never type: in a slot of its own, so a
    keystroke that does not accept the suggestion still finds its document's cache."""
    no_warmup = {"context": {"layout": "append"}, "cache": {"warmup": False}}
    async with lsp_session(serve_command(endless_models), init_options=no_warmup) as client:
        await models_ready(client)
        uri = "file:///work/typed.py"
        body = FUNCTIONS
        open_doc(client, uri, body + "value = ")
        line = body.count("\n")
        [first] = items_of(await inline(client, uri, line, 8))
        await wait_for(lambda: logged(client, "prefetch:"), 60)
        stats = await type_past_the_suggestion(client, uri, line, 8, first.insert_text)
        assert stats["source"] == "model" and stats["engine"]["slot"] == uri
        assert stats["prefillTokens"] <= 2, stats


async def test_switching_files_and_back_prefills_few_tokens(endless_models):
    async with lsp_session(serve_command(endless_models), init_options=APPEND) as client:
        await models_ready(client)
        here, there = "file:///work/here.py", "file:///work/there.py"
        body = FUNCTIONS
        open_doc(client, here, body + "value = ")
        open_doc(client, there, body.replace("f_", "g_") + "other = ")
        line = body.count("\n")
        [first] = items_of(await inline(client, here, line, 8))
        await inline(client, there, line, 8)
        # Back in the first file: a model request, on the first file's own cache.
        stats = await type_past_the_suggestion(client, here, line, 8, first.insert_text)
        assert stats["source"] == "model" and stats["engine"]["slot"] == here
        assert stats["prefillTokens"] <= 32, stats


async def test_a_file_opened_later_computes_only_its_own_part(endless_models):
    long_body = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(80))
    no_ahead = {**APPEND, "cache": {"warmup": False, "prefetch": False}}
    async with lsp_session(serve_command(endless_models), init_options=no_ahead) as client:
        await models_ready(client)
        here, there = "file:///work/here.py", "file:///work/there.py"
        open_doc(client, here, long_body + "value = ")
        open_doc(client, there, long_body.replace("f_", "g_") + "other = ")
        line = long_body.count("\n")
        await inline(client, here, line, 8)
        await inline(client, there, line, 8)
        await wait_for(lambda: len(client.stats) >= 2)
        first, second = (plain(s) for s in client.stats[-2:])
        assert first["reusedSharedTokens"] == 0 and first["prefillTokens"] > 0
        # The same head (the top of both files): the second file took it from the first's
        # cache and computed only its own part.
        assert second["reusedSharedTokens"] > 0, second
        assert second["prefillTokens"] + second["reusedSharedTokens"] >= second["promptTokens"] - 1
        assert second["prefillTokens"] < first["prefillTokens"]


async def test_an_edit_warms_the_cache_before_the_request(endless_models):
    async with lsp_session(serve_command(endless_models), init_options=APPEND) as client:
        await models_ready(client)
        uri = "file:///work/warm.py"
        body = FUNCTIONS
        open_doc(client, uri, body + "value")
        line = body.count("\n")
        edit(client, uri, 2, (line, 5), (line, 5), " = ")  # no request yet: the worker is idle
        at_edit = f"tokens of {uri} computed ahead (at line {line + 1})"
        await wait_for(lambda: logged(client, at_edit), 60)
        before = len(client.stats)
        await inline(client, uri, line, 8)
        await wait_for(lambda: len(client.stats) > before)
        stats = plain(client.stats[-1])
        assert stats["source"] == "model" and stats["prefillTokens"] <= 2, stats


def focus(client, uri: str, position: tuple[int, int] | None = None) -> None:
    """`textDocument/didFocus`, the Copilot language server's notification, with our cursor."""
    params: dict = {"textDocument": {"uri": uri}}
    if position is not None:
        params["position"] = {"line": position[0], "character": position[1]}
    client.protocol.notify("textDocument/didFocus", params)


async def test_a_focused_document_is_warm_at_its_cursor_before_anything_is_typed(endless_models):
    async with lsp_session(serve_command(endless_models), init_options=APPEND) as client:
        await models_ready(client)
        first, second = "file:///work/first.py", "file:///work/second.py"
        open_doc(client, first, FUNCTIONS + "value = ")
        open_doc(client, second, FUNCTIONS.replace("f_", "g_") + "other = ")
        # Opened, never edited nor asked: only the part no cursor changes is computed.
        await wait_for(
            lambda: logged(client, f"tokens of {second} computed ahead (its file-level part)"), 60
        )
        line = FUNCTIONS.count("\n")
        focus(client, first, (line - 3, 4))  # inside f_19, no typing
        at_focus = f"tokens of {first} computed ahead (at line {line - 2})"
        await wait_for(lambda: logged(client, at_focus), 60)
        before = len(client.stats)
        await inline(client, first, line - 3, 4)
        await wait_for(lambda: len(client.stats) > before)
        stats = plain(client.stats[-1])
        assert stats["source"] == "model" and stats["prefillTokens"] <= 2, stats
        # Bad focus notifications are warnings; the server goes on.
        focus(client, "file:///work/never-opened.py", (0, 0))
        focus(client, first, (10_000, 0))
        client.protocol.notify("textDocument/didFocus", {"textDocument": {}})
        await wait_for(lambda: logged(client, "which is not open; ignored"), 30)
        await wait_for(lambda: logged(client, "didFocus needs textDocument.uri"), 30)
        await wait_for(lambda: logged(client, "warming its file-level part"), 30)
        assert items_of(await inline(client, second, line, 8)) is not None


# --- odd text from the client (issue 14) ---------------------------------------------------------


class RawClient:
    """A bare stdio LSP client that writes message bodies as given bytes (a real client's
    library would refuse to send invalid UTF-8)."""

    def __init__(self, command: list[str]):
        import subprocess

        from conftest import server_env

        # Unbuffered: `answer` waits with select(), which cannot see bytes a buffered reader
        # has already taken from the pipe (a message read ahead would wait for the next one).
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=server_env(),
            bufsize=0,
        )
        self.next_id = 0
        self.notifications: list[dict] = []

    def send(self, body: bytes) -> None:
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def message(self, method: str, params: dict, *, request: bool = False) -> int | None:
        import json

        payload = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            payload["id"] = self.next_id
        # ensure_ascii: a lone surrogate travels as a \\ud800 escape, as JSON allows.
        self.send(json.dumps(payload).encode("ascii"))
        return payload.get("id")

    def _read(self, n: int) -> bytes:
        """Exactly `n` bytes of the server's stdout (an unbuffered read may return fewer)."""
        chunks = []
        while n > 0:
            chunk = self.process.stdout.read(n)
            if not chunk:
                raise AssertionError("the server closed its stdout")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def answer(self, msg_id: int, timeout: float = 120.0) -> dict:
        import json
        import select

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 1.0)
            if not ready:
                continue
            header = b""
            while not header.endswith(b"\r\n\r\n"):
                header += self._read(1)
            length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
            data = json.loads(self._read(length))
            if data.get("id") == msg_id and "method" not in data:
                return data
            if "method" in data and "id" not in data:
                self.notifications.append(data)
        raise AssertionError(f"no answer to request {msg_id}")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


async def test_odd_text_in_one_document_does_not_stop_completions_in_another(
    tiny_models, reference
):
    # A blocking raw-bytes client: run off the event loop the module's tests share.
    await asyncio.to_thread(_odd_text_scenario, tiny_models, reference)


def _odd_text_scenario(tiny_models, reference):
    client = RawClient(serve_command(tiny_models))
    try:
        init = client.message("initialize", {"processId": None, "capabilities": {}}, request=True)
        assert "result" in client.answer(init)
        client.message("initialized", {})

        def open_(uri: str, text: str) -> None:
            item = {"uri": uri, "languageId": "python", "version": 1, "text": text}
            client.message("textDocument/didOpen", {"textDocument": item})

        def ask(uri: str, line: int, character: int) -> dict:
            params = {
                "textDocument": {"uri": uri},
                "position": {"line": line, "character": character},
                "context": {"triggerKind": 2},
            }
            return client.answer(
                client.message("textDocument/inlineCompletion", params, request=True)
            )

        good = "file:///work/good.py"
        odd = [
            ("file:///work/surrogate.py", "name = '\ud800'\nvalue = "),
            ("file:///work/nul.py", "data = '\x00'\n"),
        ]
        for uri, text in odd:
            open_(uri, text)
        open_(good, "total = ")
        expected = expected_items(reference, good, "total = ", 0, 8, others=odd)
        assert items_text(ask(good, 0, 8)) == expected
        # Invalid UTF-8 straight in a didChange body: the edit is applied with U+FFFD.
        bad = (
            b'{"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument":'
            b' {"uri": "file:///work/surrogate.py", "version": 2}, "contentChanges": [{"range":'
            b' {"start": {"line": 1, "character": 8}, "end": {"line": 1, "character": 8}},'
            b' "text": "\xff\xfe x"}]}}'
        )
        client.send(bad)
        # The odd documents themselves are answered too (the NUL one with nothing). The bad
        # bytes became two U+FFFD: the line is "value = \ufffd\ufffd x", and its end is a
        # position the model is asked at (the edit was applied, not dropped).
        answer = ask("file:///work/surrogate.py", 1, 12)
        assert "result" in answer
        stats = [
            n["params"]
            for n in client.notifications
            if n["method"] == "$/quickdraft/stats" and n["params"]["requestId"] == answer["id"]
        ]
        assert stats and stats[0]["source"] == "model" and stats[0]["promptTokens"] > 0
        assert items_text(ask("file:///work/nul.py", 0, 4)) == []
        # Still serving; asked again at that place, the alternatives computed after the first
        # answer follow it.
        assert items_text(ask(good, 0, 8))[:1] == expected
    finally:
        client.close()


def expected_items(
    reference, uri: str, text: str, line: int, character: int, others=()
) -> list[str]:
    want = expected(reference, uri, text, line, character, others=others)
    return [want] if want else []


def items_text(answer: dict) -> list[str]:
    result = answer.get("result") or {}
    return [item["insertText"] for item in result.get("items", [])]

"""The language server's protocol layer end to end, with a fake Completer.

Each test starts this file as a server process (`python test_lsp_protocol.py serve ...`): the
real `quickdraft serve` server, argument parsing and worker thread, with models replaced by
`FakeCompleter`, whose answers say what it was asked (the text before the cursor as it saw it,
its configuration, the thread it ran on), so the tests can check positions and state exactly.
The same server with real tiny models is tested in test_lsp_models.py.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
from conftest import (
    complete,
    edit,
    inline,
    inline_text,
    items_of,
    open_doc,
    plain,
    raw_request,
    rng,
    shown,
    wait_for,
)
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcMethodNotFound,
    JsonRpcRequestCancelled,
)
from pygls.protocol.json_rpc import JsonRPCNotification

from quickdraft import prefill_progress

# --- the fake server (runs in the server process) ------------------------------------------

LOADS = 0
SERVER = None
"""The server this process runs (set by run_fake_server): the fake reads its document store."""


ENGINE_STATS = {
    "prompt_tokens": 10,
    "prefill_tokens": 7,
    "reused_tokens": 3,
    "new_tokens": 4,
    "target_forwards": 3,
    "tokens_per_forward": 1.333,
    "drafted_by_source": {"ngram": 4, "draft": 2, "live": 0},
    "accepted_by_source": {"ngram": 3},
    "strategy": "hybrid",
}
"""What every fake completion's engine reports (fixed values, as an engine's `to_dict()`): the
tests check that the server's `$/quickdraft/stats` carries them, not how they were computed."""


class FakeStats:
    prefill_tokens = 0  # what the prefetch's log line reads

    def to_dict(self):
        return copy.deepcopy(ENGINE_STATS)


@dataclass
class FakeCompletion:
    text: str
    tokens: list[int] = field(default_factory=list)
    raw_text: str = ""
    stats: FakeStats | None = None
    mode: str = "line"
    skipped: str | None = None
    stop_reason: str = "stop"
    confidence: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    repeated: bool = False
    repeat_trimmed: bool = False

    def __post_init__(self):
        self.tokens = list(range(len(self.text)))
        self.stats = FakeStats()


class FakeCompleter:
    """Answers with what it saw. Triggers are words in the line before the cursor."""

    def __init__(self, config):
        self.config = config
        self.documents: dict[str, tuple[str, str]] = {}
        self.calls = 0
        self.slow_endings: list[str] = []
        self.jobs: list[str] = []
        """The model work asked of it, in the order the worker ran it."""

    def set_document(self, uri, text, language_id):
        self.documents[uri] = (text, language_id)

    def describe(self):
        return f"fake models ({self.config.model.target or 'default'})"

    def close(self):
        self.documents.clear()

    def warm(self, request, cancel=None, file_level=False):
        return 0  # no caches to warm

    compute = {"runtime": "fake", "dtype": None, "kernel": None, "reason": "a test double"}
    works_ahead = True  # alternatives and prefetch, as for a local engine
    engine_status = None  # no serving engine whose state the server would watch

    class models:  # noqa: N801 - the shape of LoadedModels the server reads
        @staticmethod
        def describe():
            return {"runtime": "fake", "dtype": None, "device": "cpu"}

    def close_document(self, uri):
        self.documents.pop(uri, None)

    def update_config(self, config):
        self.config = config

    def has_answered(self, request):
        return True

    def alternatives(self, request, count, *, cancel=None):
        """CHOICES: one that reads like the first, then two more, less likely ones (and a
        fourth past any count the server asks for)."""
        self.alternative_calls = getattr(self, "alternative_calls", 0) + 1
        self.jobs.append("alternatives")
        line = request.text.split("\n")[request.line]
        if "CHOICES" not in line[: request.character]:
            return []
        found = [
            FakeCompletion("choice_one()", confidence=0.5),
            FakeCompletion("choice_two()", confidence=0.45),
            FakeCompletion("choice_three()", confidence=0.05),
            FakeCompletion("choice_four()", confidence=0.01),
        ]
        return found[: count + 1]

    def complete(self, request, *, cancel=None, strategy=None):
        self.calls += 1
        line = request.text.split("\n")[request.line]
        prefix = line[: request.character]
        self.jobs.append(f"complete {prefix.split()[0] if prefix.split() else ''}")
        if "JOBS" in prefix:
            return FakeCompletion(", ".join(self.jobs))
        if prefix.endswith("LEAD"):
            return FakeCompletion("_then")
        if prefix.endswith("LEAD_then"):  # the prefetch after accepting: runs until a request
            deadline = time.monotonic() + 10  # there waits for it, or it is stopped
            while not cancel.is_set() and time.monotonic() < deadline:
                job = SERVER.completions._inflight.get(request.uri) if SERVER else None
                if job is not None and getattr(job, "prefetched", False):
                    return FakeCompletion("_next()")
                time.sleep(0.01)  # pacing: polls for the request (the state it waits for)
            return FakeCompletion("", stop_reason="cancelled")
        if "LEAD_then" in prefix:  # after the prefetched answer: nothing more
            return FakeCompletion("")
        if "SLOW" in prefix:  # generate until cancelled (30 s at most)
            deadline = time.monotonic() + 30
            while not cancel.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)  # pacing: a generation's steps, each checking its cancel event
            ended = "cancelled" if cancel.is_set() else "ran to its end"
            self.slow_endings.append(ended)
            return FakeCompletion(ended)
        if "READING" in prefix:  # a prefill of 4 chunks that lasts, reported as the engine does
            for chunk in range(4):
                prefill_progress.report(chunk * 512, 2048)
                time.sleep(0.5)  # pacing: one chunk's forward
            prefill_progress.report(2048, 2048)
            return FakeCompletion("read()")
        if "ENDED" in prefix:  # how the SLOW generations ended, in order
            return FakeCompletion(", ".join(self.slow_endings) or "none")
        if "UNTIL_JOINED" in prefix:  # generate until a second request shares this one
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                job = SERVER.completions._inflight.get(request.uri) if SERVER else None
                if job is not None and job.waiters >= 2:
                    break
                time.sleep(0.01)  # pacing: polls for the second request (the state it waits for)
            else:
                return FakeCompletion("nobody joined")
        if "UNTIL_EDITED" in prefix:  # generate until the editor's edit has reached the server
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                document = SERVER.documents.get(request.uri) if SERVER is not None else None
                if document is not None and document.text != request.text:
                    break
                time.sleep(0.01)  # pacing: polls the store for the edit (the state it waits for)
            else:
                return FakeCompletion("the edit never arrived")
        if "COUNT" in prefix:
            return FakeCompletion(f"{self.calls} calls {LOADS} loads {len(self.documents)} docs")
        if "INDEX" in prefix:  # the document as the Completer was told about it
            known = self.documents.get(request.uri, ("?", ""))[0].split("\n")[request.line]
            return FakeCompletion(f"[{known[: request.character][-2:]}]")
        if "CONFIG" in prefix:
            config = self.config
            return FakeCompletion(
                f"max={config.max_new_tokens_for(request.language_id)} "
                f"temp={config.decoding.temperature}"
            )
        if "THREAD" in prefix:
            return FakeCompletion(threading.current_thread().name)
        if "SKIP" in prefix:
            return FakeCompletion("", skipped="the fake says no")
        if "GREET" in prefix:
            return FakeCompletion("hello_world()")
        if "CHOICES" in prefix:
            return FakeCompletion("choice_one()", confidence=0.6)
        if "UNSURE" in prefix:  # as the engine does: it stops once under the request's floor
            if request.min_confidence > 0.01:
                return FakeCompletion("", raw_text="may", stop_reason="unsure", confidence=0.01)
            return FakeCompletion("maybe_this()", confidence=0.01)
        if "DOUBT" in prefix:  # a backend that writes the whole answer whatever the floor
            return FakeCompletion("perhaps_that()", confidence=0.02)
        if "MULTI" in prefix:
            return FakeCompletion("first\nsecond")
        if "EMPTY" in prefix:
            return FakeCompletion("")
        return FakeCompletion(f"<{prefix[-2:]}>")


def fake_loader(config, progress=None):
    global LOADS
    target = config.model.target
    if progress is not None:
        progress("loading fake models")
        if target == "slow":
            time.sleep(1.0)  # pacing: a load that lasts, so each step is reported in turn
        progress("measuring fake step costs")
    if target == "broken":
        from quickdraft.errors import ModelNotFoundError

        raise ModelNotFoundError("model 'broken' not found: no such directory")
    if target == "crash":
        raise RuntimeError("CUDA out of memory (simulated)")
    LOADS += 1
    return FakeCompleter(config)


def run_fake_server(argv: list[str]) -> None:
    import argparse

    from quickdraft.cli_args import config_dict_from_args
    from quickdraft.config import load_config
    from quickdraft.lsp import cli
    from quickdraft.lsp.assembly import create_server

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    defaults = load_config(config_dict_from_args(args))
    cli.configure_logging(args.log_level)
    address = cli.parse_host_port(args.tcp) if args.tcp else None
    global SERVER
    SERVER = create_server(defaults, loader=fake_loader)
    cli.serve(SERVER, address)


if __name__ == "__main__":
    run_fake_server(sys.argv[1:])
    sys.exit(0)


# --- helpers -----------------------------------------------------------------------------


def fake_command(*flags: str) -> list[str]:
    return [sys.executable, __file__, "serve", "--target", "fake", *flags]


URI = "file:///work/a.py"


# --- tests -------------------------------------------------------------------------------


def test_the_server_and_its_requests_import_no_torch():
    """The server answers `initialize` before the worker imports torch (seconds): the request
    types it builds on the event loop (`quickdraft.generation`) import no model code."""
    probe = (
        "import sys; import quickdraft.lsp.server, quickdraft.lsp.service, quickdraft.generation;"
        " print(sorted(m for m in ('torch', 'transformers', 'llama_cpp') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_loading_is_reported_with_status_and_progress_until_ready(session):
    async with session(fake_command("--target", "slow")) as client:
        await wait_for(lambda: any(plain(s)["state"] == "ready" for s in client.statuses))
        states = [plain(s)["state"] for s in client.statuses]
        assert states[0] == "loading" and states[-1] == "ready"
        messages = [plain(s)["message"] for s in client.statuses]
        assert any("loading fake models" in m for m in messages)
        assert "fake models (slow)" in messages[-1]
        # A work-done progress went from begin to end, saying each step.
        await wait_for(lambda: client.progress_reports)
        [reports] = client.progress_reports.values()
        await wait_for(lambda: isinstance(reports[-1], types.WorkDoneProgressEnd))
        assert isinstance(reports[0], types.WorkDoneProgressBegin)
        assert any("fake step costs" in (r.message or "") for r in reports)


async def test_a_request_waiting_over_a_second_says_what_the_model_is_doing(session):
    """A completion whose prefill lasts (a cold file) shows a work-done progress from its
    second second: the file and how far its reading has got, then the writing, and it ends with
    the answer. An answer within the second shows none."""
    async with session(fake_command()) as client:
        await wait_for(lambda: any(plain(s)["state"] == "ready" for s in client.statuses))
        loads = set(client.progress_reports)
        open_doc(client, URI, "x = GREET\ny = READING")
        assert await inline_text(client, URI, 0, 9) == "hello_world()"
        assert set(client.progress_reports) == loads  # answered at once: nothing shown

        assert await inline_text(client, URI, 1, 11) == "read()"
        [token] = set(client.progress_reports) - loads
        assert token.startswith("quickdraft-wait-")
        reports = client.progress_reports[token]
        await wait_for(lambda: isinstance(reports[-1], types.WorkDoneProgressEnd))
        assert isinstance(reports[0], types.WorkDoneProgressBegin)
        assert reports[0].title == "quickdraft"
        messages = [r.message for r in reports[:-1]]
        # Shown from its second second (while about half the tokens were in), each
        # update as the prefill went on; the last poll may have caught the writing.
        said = [
            "reading a.py: 512 of 2,048 tokens",
            "reading a.py: 1,024 of 2,048 tokens",
            "reading a.py: 1,536 of 2,048 tokens",
            "writing a suggestion for a.py",
        ]
        assert messages and set(messages) <= set(said), messages
        assert messages == sorted(messages, key=said.index)
        assert messages[0].startswith("reading")


async def test_a_failed_load_is_an_error_state(session):
    async with session(fake_command("--target", "broken")) as client:
        await wait_for(lambda: any(plain(s)["state"] == "error" for s in client.statuses))
        assert "not found" in plain(client.statuses[-1])["message"]
        open_doc(client, URI, "x = 1")
        assert items_of(await inline(client, URI, 0, 5)) == []


async def test_skipped_completions_are_empty_and_logged(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "SKIP")
        assert items_of(await inline(client, URI, 0, 4)) == []
        await wait_for(lambda: any("the fake says no" in m.message for m in client.log_messages))


async def test_capabilities_advertise_inline_completion_and_incremental_sync(session):
    async with session(fake_command()) as client:
        caps = client.initialize_result.capabilities
        assert caps.inline_completion_provider is not None
        assert caps.completion_provider is not None
        sync = caps.text_document_sync
        kind = sync.change if hasattr(sync, "change") else sync
        assert kind == types.TextDocumentSyncKind.Incremental
        assert caps.position_encoding in (types.PositionEncodingKind.Utf16, "utf-16")
        assert client.initialize_result.server_info.name == "quickdraft"


async def test_inline_completion_text_range_and_stats(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "import os\nx = ab\n")
        result = await inline(client, URI, 1, 6)
        [item] = items_of(result)
        assert item.insert_text == "<ab>"
        assert rng(item) == (1, 6, 1, 6)
        await wait_for(lambda: client.stats)
        stats = plain(client.stats[-1])
        # What the engine returned, as the server reports it: its figures passed on unchanged...
        assert stats["engine"] == ENGINE_STATS
        assert stats["tokens"] == 4  # the completion's own tokens ("<ab>": 4 in the fake)
        assert stats["tokensPerForward"] == 1.333 and stats["targetForwards"] == 3
        assert (stats["promptTokens"], stats["prefillTokens"], stats["reusedTokens"]) == (10, 7, 3)
        assert stats["draftedBySource"] == {"ngram": 4, "draft": 2, "live": 0}
        assert stats["acceptedBySource"] == {"ngram": 3}
        # ... and the server's own share: acceptance per source that drafted (none accepted or
        # none drafted: 0), what answered and how, for which request.
        assert stats["acceptanceBySource"] == {"ngram": 0.75, "draft": 0.0, "live": 0.0}
        assert stats["source"] == "model" and stats["cached"] is False
        assert (stats["mode"], stats["stopReason"]) == ("line", "stop")
        assert stats["uri"] == URI and stats["feature"] == "inlineCompletion"
        assert stats["chars"] == 4 and stats["compute"]["runtime"] == "fake"
        # logged with the request id
        await wait_for(
            lambda: any(str(stats["requestId"]) in m.message for m in client.log_messages)
        )


async def test_model_work_runs_on_the_worker_thread(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "THREAD")
        assert await inline_text(client, URI, 0, 6) == "quickdraft-model"


async def test_utf16_positions_with_emoji_and_cjk(session):
    async with session(fake_command()) as client:
        # UTF-16: '😀' is 2 units, '中' is 1; code points: 1 each.
        open_doc(client, URI, "s = '😀中' + x\n")
        # after '中': 5 + 2 + 1 = 8 UTF-16 units (7 code points)
        [item] = items_of(await inline(client, URI, 0, 8))
        assert item.insert_text == "<😀中>"
        assert rng(item) == (0, 8, 0, 8)
        # An incremental edit addressed in UTF-16: replace '中' (units 7..8) with '文字'.
        edit(client, URI, 2, (0, 7), (0, 8), "文字")
        assert await inline_text(client, URI, 0, 9) == "<文字>"
        # The Completer (n-gram index) saw the same edit.
        edit(client, URI, 3, (0, 0), (0, 0), "INDEX ")
        assert await inline_text(client, URI, 0, 15) == "[文字]"


async def test_edits_are_seen_by_the_next_completion(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "a = 1\nb = xy\n")
        assert await inline_text(client, URI, 1, 6) == "<xy>"
        edit(client, URI, 2, (1, 4), (1, 6), "pq")
        assert await inline_text(client, URI, 1, 6) == "<pq>"
        # A multi-line edit that joins lines.
        edit(client, URI, 3, (0, 5), (1, 4), " + ")
        assert await inline_text(client, URI, 0, 10) == "<pq>"
        # Full-document replacement.
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=4),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text="zz\n")],
            )
        )
        assert await inline_text(client, URI, 0, 2) == "<zz>"


def generating(client) -> int:
    """How many generations the server has started on its worker (its log says each)."""
    return sum(": generating (" in m.message for m in client.log_messages)


async def test_an_answer_keeps_the_position_of_its_request_across_edits(session):
    async with session(fake_command()) as client:
        text = "UNTIL_EDITED ab"
        open_doc(client, URI, text)
        pending = asyncio.ensure_future(inline(client, URI, 0, len(text)))
        await wait_for(lambda: generating(client) == 1)
        edit(client, URI, 2, (0, 0), (0, 0), "😀\n")  # a line above, while generating
        [item] = items_of(await pending)
        # The fake answered only after the edit reached the server (it waits for that).
        assert item.insert_text == "<ab>"
        assert rng(item) == (0, len(text), 0, len(text))


async def test_close_and_reopen_keep_the_completer_in_step(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "one")
        open_doc(client, "file:///work/b.py", "two")
        open_doc(client, "file:///work/c.py", "COUNT")
        assert (await inline_text(client, "file:///work/c.py", 0, 5)).endswith("3 docs")
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=URI))
        )
        edit(client, "file:///work/c.py", 2, (0, 0), (0, 0), " ")
        assert (await inline_text(client, "file:///work/c.py", 0, 6)).endswith("2 docs")
        assert items_of(await inline(client, URI, 0, 1)) == []  # closed: unknown now


async def test_completion_fallback_for_clients_without_inline(session):
    async with session(fake_command(), inline=False) as client:
        open_doc(client, URI, "x = '中'ab")
        result = await complete(client, URI, 0, 9)
        [item] = items_of(result)
        assert item.text_edit.new_text == "<ab>"
        assert rng(item) == (0, 9, 0, 9)
        assert "quickdraft" in item.detail
        assert item.label_details.description == "quickdraft"
        assert item.insert_text_format == types.InsertTextFormat.PlainText
        # multi-line suggestions keep their lines in the edit
        open_doc(client, "file:///work/m.py", "MULTI")
        [item] = items_of(await complete(client, "file:///work/m.py", 0, 5))
        assert item.text_edit.new_text == "first\nsecond"


NO_WORK_AHEAD = {"cache": {"prefetch": False, "warmup": False}}
"""For tests that count the fake's model calls: nothing computed ahead adds to them."""


async def test_inline_and_completion_for_one_position_share_a_generation(session):
    async with session(fake_command(), inline=True, init_options=NO_WORK_AHEAD) as client:
        open_doc(client, URI, "UNTIL_JOINED ab\nCOUNT")
        first, second = await asyncio.gather(
            inline(client, URI, 0, 15), complete(client, URI, 0, 15)
        )
        assert items_of(first)[0].insert_text == "<ab>"
        assert items_of(second)[0].text_edit.new_text == "<ab>"
        # one model call for both (the COUNT request is the second)
        assert (await inline_text(client, URI, 1, 5)).startswith("2 calls")
        await wait_for(lambda: len(client.stats) >= 3)
        assert sorted(plain(s)["cached"] for s in client.stats[:2]) == [False, True]


async def test_typed_ahead_answers_without_the_model(session):
    async with session(fake_command(), init_options=NO_WORK_AHEAD) as client:
        open_doc(client, URI, "GREET \nCOUNT")
        [item] = items_of(await inline(client, URI, 0, 6))
        assert item.insert_text == "hello_world()"
        # The user types the start of the suggestion.
        edit(client, URI, 2, (0, 6), (0, 6), "hel")
        [item] = items_of(await inline(client, URI, 0, 9))
        assert item.insert_text == "lo_world()"
        assert rng(item) == (0, 9, 0, 9)
        await wait_for(lambda: len(client.stats) >= 2)
        cached = plain(client.stats[-1])
        assert cached["cached"] is True
        # The model was called once, for the first request (the COUNT request is the second).
        assert (await inline_text(client, URI, 1, 5)).startswith("2 calls")
        # Typing something else goes back to the model.
        edit(client, URI, 3, (0, 9), (0, 9), "X")
        assert await inline_text(client, URI, 0, 10) == "hello_world()"
        await wait_for(lambda: len(client.stats) >= 4)
        assert plain(client.stats[-1])["cached"] is False


async def test_malformed_params_get_invalid_params_and_the_server_keeps_serving(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "x = ab")
        with pytest.raises(JsonRpcInvalidParams) as info:
            await raw_request(
                client,
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                {"textDocument": {"uri": URI}, "position": {"line": "zero", "character": 0}},
            )
        assert "position" in str(info.value) or "line" in str(info.value)
        with pytest.raises(JsonRpcInvalidParams):
            await raw_request(client, types.TEXT_DOCUMENT_COMPLETION, None)
        with pytest.raises(JsonRpcInvalidParams):
            await raw_request(
                client,
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                {"textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}},
            )
        assert await inline_text(client, URI, 0, 6) == "<ab>"
        # A malformed notification cannot be answered: it is reported, and serving goes on.
        client.protocol._send_data(
            JsonRPCNotification(
                method=types.TEXT_DOCUMENT_DID_CHANGE, jsonrpc="2.0", params={"textDocument": 1}
            )
        )
        await wait_for(lambda: shown(client))
        assert "textDocument/didChange" in shown(client)[0]
        assert await inline_text(client, URI, 0, 6) == "<ab>"


async def test_unreadable_messages_are_reported_by_what_is_wrong_and_serving_goes_on(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "x = ab")
        for body, says in (
            (b"{", "ignored a message that is not JSON"),
            (b"[]", "ignored a message that is a JSON array"),
            (b"null", "ignored a message that is the JSON value null"),
            (
                b'{"jsonrpc": "2.0", "id": 7}',
                "ignored a message with neither a method nor a result",
            ),
            (
                b'{"jsonrpc": "2.0", "id": [1], "method": "x"}',
                "ignored a 'x' request whose id is neither a string nor a number",
            ),
        ):
            before = len(shown(client))
            await write_raw(client, body)
            await wait_for(lambda before=before: len(shown(client)) > before)
            assert shown(client)[-1].startswith("quickdraft: " + says), shown(client)[-1]
        # A request of another JSON-RPC version is answered (pygls would drop it unanswered).
        answer: Future = Future()
        client.protocol._request_futures["v1"] = answer
        position = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 6}}
        request = {"jsonrpc": "1.0", "id": "v1", "method": "textDocument/completion"}
        request["params"] = position
        await write_raw(client, json.dumps(request).encode())
        with pytest.raises(JsonRpcInvalidRequest, match=r'"jsonrpc": "1\.0", not "2\.0"'):
            await asyncio.wait_for(asyncio.wrap_future(answer), 10)
        assert await inline_text(client, URI, 0, 6) == "<ab>"


async def write_raw(client, body: bytes) -> None:
    """`body` to the server as one message, exactly as given."""
    written = client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if inspect.isawaitable(written):
        await written


async def test_unknown_methods_get_method_not_found(session):
    async with session(fake_command()) as client:
        with pytest.raises(JsonRpcMethodNotFound):
            await raw_request(client, "quickdraft/noSuchThing", {})
        with pytest.raises(JsonRpcMethodNotFound):  # a real LSP method we do not serve
            await raw_request(
                client,
                types.TEXT_DOCUMENT_HOVER,
                {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}},
            )
        open_doc(client, URI, "x = ab")
        assert await inline_text(client, URI, 0, 6) == "<ab>"


async def test_unknown_uri_and_positions_outside_the_document_are_empty(session):
    async with session(fake_command()) as client:
        assert items_of(await inline(client, "file:///nowhere.py", 0, 0)) == []
        open_doc(client, URI, "ab\n😀")
        assert items_of(await inline(client, URI, 5, 0)) == []  # past the last line
        assert items_of(await inline(client, URI, 0, 3)) == []  # past the end of the line
        assert items_of(await inline(client, URI, 1, 3)) == []  # the emoji is 2 units
        assert await inline_text(client, URI, 1, 2) == "<😀>"
        assert await inline_text(client, URI, 0, 2) == "<ab>"
        assert any("not open" in m.message for m in client.log_messages)


async def test_huge_and_binary_documents_are_empty_and_state_is_kept(session):
    options = {"context": {"maxDocumentBytes": 1000}}
    async with session(fake_command(), init_options=options) as client:
        big = "y" * 600 + "\n" + "中" * 200 + "ab"  # 600 + 1 + 600 + 2 bytes
        open_doc(client, URI, big)
        assert items_of(await inline(client, URI, 1, 202)) == []
        # Deleting most of it makes it usable again: the edits applied to the kept state.
        edit(client, URI, 2, (0, 0), (1, 150), "")
        assert await inline_text(client, URI, 0, 52) == "<ab>"

        binary = "file:///work/blob.bin"
        open_doc(client, binary, "ab\x00cd", language_id="plaintext")
        assert items_of(await inline(client, binary, 0, 2)) == []
        edit(client, binary, 2, (0, 2), (0, 3), "")
        assert await inline_text(client, binary, 0, 2) == "<ab>"
        assert any("NUL" in m.message for m in client.log_messages)
        assert any("larger than" in m.message for m in client.log_messages)


async def test_per_language_settings_via_did_change_configuration(session):
    async with session(fake_command("--max-tokens", "20")) as client:
        open_doc(client, URI, "CONFIG")
        open_doc(client, "file:///work/a.rs", "CONFIG", language_id="rust")
        assert (await inline_text(client, URI, 0, 6)).startswith("max=20 ")  # CLI default
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={
                    "quickdraft": {
                        "decoding": {"temperature": 0.5},
                        "languages": {
                            "python": {"enabled": False},
                            "rust": {"maxNewTokens": 7},
                        },
                    }
                }
            )
        )
        assert items_of(await inline(client, URI, 0, 6)) == []
        assert await inline_text(client, "file:///work/a.rs", 0, 6) == "max=7 temp=0.5"
        # Settings replace the previous ones: python back on, rust back to the default.
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"quickdraft": {}})
        )
        assert await inline_text(client, URI, 0, 6) == "max=20 temp=0.0"
        assert await inline_text(client, "file:///work/a.rs", 0, 6) == "max=20 temp=0.0"


async def test_invalid_configuration_shows_a_message_and_keeps_the_previous(session):
    options = {"decoding": {"maxNewTokens": 12}}
    async with session(fake_command(), init_options=options) as client:
        open_doc(client, URI, "CONFIG")
        assert await inline_text(client, URI, 0, 6) == "max=12 temp=0.0"
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={"quickdraft": {"decoding": {"maxNewTokens": -3, "temperature": 0.3}}}
            )
        )
        await wait_for(lambda: shown(client))
        assert "decoding.maxNewTokens" in shown(client)[-1]
        assert await inline_text(client, URI, 0, 6) == "max=12 temp=0.0"
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={"quickdraft": {"decoding": {"strategy": "fastest"}}}
            )
        )
        await wait_for(lambda: len(shown(client)) >= 2)
        assert "strategy" in shown(client)[-1]
        assert await inline_text(client, URI, 0, 6) == "max=12 temp=0.0"


async def test_invalid_initialization_options_fall_back_to_defaults(session):
    async with session(fake_command(), init_options={"decoding": {"nope": 1}}) as client:
        await wait_for(lambda: shown(client))
        assert "decoding.nope" in shown(client)[0]
        open_doc(client, URI, "CONFIG")
        assert await inline_text(client, URI, 0, 6) == "max=64 temp=0.0"


async def test_workspace_configuration_is_pulled(session):
    settings = {"quickdraft": {"languages": {"python": {"maxNewTokens": 5}}}}
    async with session(fake_command(), pull_configuration=settings) as client:
        open_doc(client, URI, "CONFIG")
        await wait_for(
            lambda: any("configuration updated" in m.message for m in client.log_messages)
        )
        assert await inline_text(client, URI, 0, 6) == "max=5 temp=0.0"
        # A notification without settings (pull model) makes the server ask again.
        client.set_configuration({"quickdraft": {"decoding": {"maxNewTokens": 9}}})
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        await wait_for(
            lambda: sum("configuration updated" in m.message for m in client.log_messages) >= 2
        )
        assert await inline_text(client, URI, 0, 6) == "max=9 temp=0.0"


async def test_cancel_request_stops_the_generation(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "SLOW\nx = ab\nENDED")
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=URI),
            position=types.Position(line=0, character=4),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic
            ),
        )
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="slow-1"
            )
        )
        # Running on the worker: SLOW generates until its cancel event is set.
        await wait_for(
            lambda: any(
                "[slow-1] inlineCompletion: generating (" in m.message for m in client.log_messages
            )
        )
        client.cancel_request(types.CancelParams(id="slow-1"))
        with pytest.raises(JsonRpcRequestCancelled):
            await asyncio.wait_for(pending, 60)
        # The generation saw its cancel event (it did not run on for 30 s), and the worker,
        # free again, answers the next request.
        assert await inline_text(client, URI, 2, 5) == "cancelled"
        assert await inline_text(client, URI, 1, 6) == "<ab>"


async def test_newer_request_supersedes_the_older(session):
    async with session(fake_command()) as client:
        open_doc(client, URI, "SLOW\nx = ab\nENDED")
        older = asyncio.ensure_future(inline(client, URI, 0, 4))
        await wait_for(lambda: generating(client) == 1)  # SLOW runs until cancelled
        newer = await inline(client, URI, 1, 6)
        assert items_of(newer)[0].insert_text == "<ab>"
        assert items_of(await asyncio.wait_for(older, 60)) == []
        # The older generation was stopped by its cancel event, not left to run on.
        assert await inline_text(client, URI, 2, 5) == "cancelled"


async def test_model_load_failure_is_reported_and_the_server_keeps_serving(session):
    async with session(fake_command("--target", "broken")) as client:
        await wait_for(lambda: shown(client))
        message = shown(client)[0]
        assert "could not load models" in message and "broken" in message
        open_doc(client, URI, "x = ab")
        assert items_of(await inline(client, URI, 0, 6)) == []
        # Fixing the model in the settings loads it.
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={"quickdraft": {"model": {"target": "good"}}}
            )
        )
        await wait_for(lambda: any("models ready" in m.message for m in client.log_messages))
        assert await inline_text(client, URI, 0, 6) == "<ab>"


async def test_failed_reload_keeps_the_running_models(session):
    async with session(fake_command(), init_options=NO_WORK_AHEAD) as client:
        open_doc(client, URI, "COUNT")
        assert (await inline_text(client, URI, 0, 5)).startswith("1 calls 1 loads")
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={
                    "quickdraft": {"model": {"target": "crash"}, "decoding": {"temperature": 0.7}}
                }
            )
        )
        await wait_for(lambda: shown(client))
        assert "CUDA out of memory" in shown(client)[0]
        assert (await inline_text(client, URI, 0, 5)).startswith("2 calls 1 loads")
        # the settings that came with the failed models apply to the running ones
        edit(client, URI, 2, (0, 0), (0, 5), "CONFIG")
        assert await inline_text(client, URI, 0, 6) == "max=64 temp=0.7"
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={"quickdraft": {"model": {"target": "other"}}}
            )
        )
        await wait_for(lambda: any("models ready" in m.message for m in client.log_messages[2:]))
        # A new Completer: counts restart, and it was told about the open document.
        edit(client, URI, 3, (0, 0), (0, 6), "COUNT")
        assert await inline_text(client, URI, 0, 5) == "1 calls 2 loads 1 docs"


async def test_requests_after_shutdown_get_an_error(session):
    async with session(fake_command()) as client:
        await client.shutdown_async(None)
        with pytest.raises(JsonRpcInvalidRequest):
            await raw_request(
                client,
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}},
            )
        client.exit(None)
        await asyncio.wait_for(client._server.wait(), 10)
        assert client._server.returncode == 0
        client.capabilities = None  # already shut down


async def test_tcp_transport_reads_even_invalid_utf8():
    import socket

    from conftest import client_capabilities, server_env
    from pytest_lsp import make_test_lsp_client

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        *fake_command("--tcp", f"127.0.0.1:{port}"), env=server_env()
    )
    client = make_test_lsp_client()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                await client.start_tcp("127.0.0.1", port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # pacing: retries until the server listens
        result = await client.initialize_session(
            types.InitializeParams(capabilities=client_capabilities())
        )
        assert result.capabilities.inline_completion_provider is not None
        open_doc(client, URI, "x = ab")
        assert await inline_text(client, URI, 0, 6) == "<ab>"
        # Invalid UTF-8 in a didOpen (no client library would send it): the bytes are
        # replaced, not the message dropped, so the document is open and answers.
        other = "file:///work/raw.py"
        body = (
            b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument":'
            b' {"uri": "' + other.encode() + b'", "languageId": "python", "version": 1,'
            b' "text": "x = \xff cd"}}}'
        )
        client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert await inline_text(client, other, 0, 8) == "<cd>"  # U+FFFD is one UTF-16 unit
        await client.shutdown_async(None)
        client.exit(None)
        await asyncio.wait_for(process.wait(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        client._stop_event.set()


async def invoked(client, uri: str, line: int, character: int):
    return await inline(client, uri, line, character, types.InlineCompletionTriggerKind.Invoked)


async def test_alternatives_follow_the_first_answer_and_an_invoked_request_waits_for_them(
    session,
):
    async with session(fake_command(), init_options=NO_WORK_AHEAD) as client:
        open_doc(client, URI, "CHOICES \nCHOICES x\n")
        # Asked by the editor: the first suggestion at once, the others computed after it.
        [item] = items_of(await inline(client, URI, 0, 8))
        assert item.insert_text == "choice_one()"
        await wait_for(
            lambda: any("alternatives: 3 ready" in m.message for m in client.log_messages)
        )
        # The same place again: the others, less the one that reads like the first and the one
        # below the confidence floor (0.4 by default)...
        items = items_of(await inline(client, URI, 0, 8))
        assert [i.insert_text for i in items] == ["choice_one()", "choice_two()"]
        assert [i.command.arguments[0]["index"] for i in items] == [0, 1]
        # ...which an explicit request shows too.
        items = items_of(await invoked(client, URI, 0, 8))
        assert [i.insert_text for i in items] == ["choice_one()", "choice_two()", "choice_three()"]
        assert [i.command.arguments[0]["index"] for i in items] == [0, 1, 2]
        # Asked for by the person at a new place: the answer waits for the alternatives.
        items = items_of(await invoked(client, URI, 1, 9))
        assert [i.insert_text for i in items] == ["choice_one()", "choice_two()", "choice_three()"]
        # Accepting the second is counted by its index.
        accepted = items[1].command
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=accepted.command, arguments=accepted.arguments)
        )
        edit(client, URI, 2, (2, 0), (2, 0), "GREET ")
        await inline(client, URI, 2, 6)
        await wait_for(lambda: bool(client.stats) and plain(client.stats[-1])["acceptedByIndex"])
        assert list(plain(client.stats[-1])["acceptedByIndex"]) == [0, 1]


async def test_the_prefetch_after_an_answer_runs_before_its_alternatives(session):
    # Tab is likelier than cycling: the completion after accepting comes first on the worker.
    options = {"cache": {"prefetch": True, "warmup": False}}
    async with session(fake_command(), init_options=options) as client:
        open_doc(client, URI, "CHOICES \nJOBS \n")
        [item] = items_of(await inline(client, URI, 0, 8))
        assert item.insert_text == "choice_one()"
        await wait_for(
            lambda: (
                any("alternatives: 3 ready" in m.message for m in client.log_messages)
                and any(m.message.startswith("prefetch: ") for m in client.log_messages)
            )
        )
        # The answer, the prefetch of the text after accepting it, then the alternatives.
        assert await inline_text(client, URI, 1, 5) == (
            "complete CHOICES, complete CHOICES, alternatives, complete JOBS"
        )


async def test_a_request_where_a_prefetch_runs_waits_for_it_instead_of_stopping_it(session):
    # Tab, then the request at the end of the accepted text before the prefetch is done: the
    # prefetch's answer is the request's, computed once.
    options = {"cache": {"prefetch": True, "warmup": False}, "decoding": {"candidates": 1}}
    async with session(fake_command(), init_options=options) as client:
        open_doc(client, URI, "LEAD\nJOBS \n")
        assert await inline_text(client, URI, 0, 4) == "_then"
        edit(client, URI, 2, (0, 4), (0, 4), "_then")  # accepted
        assert await inline_text(client, URI, 0, 9) == "_next()"
        await wait_for(lambda: any(plain(s)["source"] == "prefetch" for s in client.stats))
        assert any("waiting for the prefetch" in m.message for m in client.log_messages)
        # The prefetch after this answer ("nothing to add") is done before the jobs are read.
        await wait_for(lambda: any("nothing to add" in m.message for m in client.log_messages))
        assert await inline_text(client, URI, 1, 5) == (
            "complete LEAD, complete LEAD_then, complete LEAD_then_next(), complete JOBS"
        )


async def test_a_suggestion_below_the_floor_is_shown_only_when_asked_for(session):
    options = {**NO_WORK_AHEAD, "decoding": {"min_confidence": 0.1, "candidates": 1}}
    async with session(fake_command(), init_options=options) as client:
        open_doc(client, URI, "UNSURE \nGREET \nDOUBT \n")
        # Unasked, the engine is given the floor and stops once under it.
        assert items_of(await inline(client, URI, 0, 7)) == []
        await wait_for(
            lambda: any("stopped, no completion" in m.message for m in client.log_messages)
        )
        await wait_for(lambda: bool(client.stats))
        hidden = plain(client.stats[-1])
        assert hidden["belowFloor"] is True and hidden["chars"] == 0
        assert hidden["confidence"] == 0.01
        # Back at the same place unasked, or typing what it wrote, that is known without
        # the model.
        calls = len(client.stats)
        assert items_of(await inline(client, URI, 0, 7)) == []
        edit(client, URI, 2, (0, 7), (0, 7), "m")
        assert items_of(await inline(client, URI, 0, 8)) == []
        await wait_for(lambda: len(client.stats) >= calls + 2)
        assert [plain(s)["source"] for s in client.stats[calls:]] == ["unsure", "unsure"]
        edit(client, URI, 3, (0, 7), (0, 8), "")  # back to where it was asked
        # Asked for, it is written whole and shown.
        [item] = items_of(await invoked(client, URI, 0, 7))
        assert item.insert_text == "maybe_this()"
        # A whole answer under the floor is held back all the same.
        reported = len(client.stats)
        assert items_of(await inline(client, URI, 2, 6)) == []
        await wait_for(lambda: len(client.stats) > reported)
        assert any("is below the floor" in m.message for m in client.log_messages)
        assert plain(client.stats[-1])["belowFloor"] is True
        # A suggestion with no confidence (a serving engine's) is never held back.
        assert await inline_text(client, URI, 1, 6) == "hello_world()"
        assert plain(client.stats[-1])["confidence"] is None

"""`textDocument/copilotInlineEdit` end to end: a real `quickdraft serve` server process, the real
Completer, document store, edit history and next-edit pipeline, with the model replaced by
`RenamingBackend`, whose rewrite of the region is known: it finishes the rename the person's
last edit started (every other occurrence of the old name gets the new one). So the test checks
the history, the region, the diff and the LSP ranges exactly.

Each test starts this file as the server (`python test_inline_edit_lsp.py serve ...`).
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path

import pytest
from conftest import edit, open_doc, plain, wait_for
from pygls.exceptions import JsonRpcInvalidParams
from pygls.protocol.json_rpc import JsonRPCRequestMessage

INLINE_EDIT = "textDocument/copilotInlineEdit"
URI = "file:///work/shapes.py"

# --- the fake model (runs in the server process) ----------------------------------------------


SLOW_STARTED = "QUICKDRAFT_TEST_SLOW_STARTED"
"""The file the fake server touches when a SLOW rewrite starts (the test waits for it)."""


class RenamingBackend:
    """Generates next edits by rule: the region, with the word the last hunk replaced renamed
    everywhere. Regions holding `UNCLOSED` are left unfinished (max tokens); `SLOW` ones wait
    for their cancel event (30 s at most), and `ENDINGS` ones say how the slow ones ended. An
    added parameter's argument it writes as `1`."""

    def __init__(self, config):
        from quickdraft.context import get_fim_template
        from quickdraft.testing import build_tiny_tokenizer
        from quickdraft.tokens import PromptTokenizer

        tokenizer = build_tiny_tokenizer()

        class Models:
            family = "qwen2.5-coder"
            preset = None

            def __init__(self):
                self.tokenizer = tokenizer

            def summary(self):
                return "renaming fake"

            def names(self):
                return []  # no model trained for next edits: the instruct format

            def describe(self):
                return {"runtime": "fake", "dtype": None, "device": "cpu"}

        self.models = Models()
        self.prompts = PromptTokenizer(tokenizer, get_fim_template("qwen2.5-coder"))
        self.config = config
        self.endings: list[str] = []
        self.fills: list[tuple[int, int, str]] = []

    def configure(self, config):
        self.config = config
        return config

    def index_documents(self, documents, current):
        pass

    def forget_document(self, uri):
        pass

    def generate(self, prepared, *, strategy, cancel, deadline):
        from quickdraft.decoding import GenerationStats
        from quickdraft.generation import Generated

        return Generated("", [], "eos", GenerationStats())

    def generate_edit(self, prepared, *, strategy, cancel, deadline):
        from quickdraft.decoding import GenerationStats
        from quickdraft.generation import Generated

        region = prepared.region.text
        closing = prepared.prompt.closing
        stop = "stop"
        if "SLOW" in region:
            started = os.environ.get(SLOW_STARTED)
            if started:
                Path(started).touch()  # the test waits for this state, not for time
            deadline_at = time.monotonic() + 30
            while not cancel.is_set() and time.monotonic() < deadline_at:
                time.sleep(0.01)  # pacing: polls its cancel event (held until stopped)
            self.endings.append("cancelled" if cancel.is_set() else "ran to its end")
            written = region
        elif "ENDINGS" in region:
            written = region.replace("ENDINGS", "ENDINGS " + ",".join(self.endings))
        else:
            written = renamed(region, prepared.request.hunks)
        text = written + closing
        if "UNCLOSED" in region:
            text, stop = written[: len(written) // 2], "max_tokens"
        tokens = list(self.models.tokenizer.encode(text, add_special_tokens=False))
        copied = sum(1 for a, b in zip(tokens, prepared.copy_source, strict=False) if a == b)
        stats = GenerationStats(
            strategy="fake",
            prompt_tokens=len(prepared.prompt_ids),
            new_tokens=len(tokens),
            target_forwards=3,
            produced_tokens=len(tokens),
            drafted_by_source={"copy": len(prepared.copy_source)},
            accepted_by_source={"copy": copied},
        )
        return Generated(text, tokens, stop, stats)

    def alternatives(self, prepared, generated, count, *, within, cancel):
        return []  # one suggestion per place

    def warm(self, prepared, cancel):
        return 0

    def fill(self, prompt_ids, *, max_new_tokens, ended, slot, language_id, cancel):
        """An added parameter's argument: `1`, then the call's closing parenthesis (where the
        server stops reading), each token sure."""
        from quickdraft.decoding import GenerationStats
        from quickdraft.decoding.confidence import TokenChoice
        from quickdraft.generation import Generated

        self.fills.append((len(prompt_ids), max_new_tokens, slot))
        text = "1)\n"
        tokens = list(self.models.tokenizer.encode(text, add_special_tokens=False))
        choices = [TokenChoice(0.0, 0, -9.0) for _ in tokens]
        return Generated(text, tokens, "stop", GenerationStats(), choices)

    def likelihoods(self, prompt_ids, continuations, *, slot, model, cancel, deadline):
        """Every token as likely as the next: the likelihood veto keeps every candidate. A
        window holding `SLOW_VETO` waits for its cancel event (30 s at most) and scores
        nothing."""
        if "SLOW_VETO" in self.models.tokenizer.decode(prompt_ids):
            started = os.environ.get(SLOW_STARTED)
            if started:
                Path(started).touch()
            deadline_at = time.monotonic() + 30
            while not cancel.is_set() and time.monotonic() < deadline_at:
                time.sleep(0.01)  # pacing: polls its cancel event (held until stopped)
            return None
        return [[-1.0] * len(tokens) for tokens in continuations]

    def prefill(self, prompt_ids, *, slot, model, cancel):
        return 0

    compute = {"runtime": "fake", "dtype": None, "kernel": None, "reason": "a test double"}
    compute_path = None
    batch_invariant = False
    works_ahead = True  # as a local engine: alternatives and prefetch
    engine_status = None  # this machine's models

    def close(self):
        pass


def renamed(region: str, hunks) -> str:
    """`region` with the word the last hunk replaced by another renamed everywhere."""
    if not hunks:
        return region
    old, new = re.findall(r"\w+", hunks[-1].old), re.findall(r"\w+", hunks[-1].new)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new).get_opcodes():
        if tag == "replace" and i2 - i1 == 1 and j2 - j1 == 1:
            return re.sub(rf"\b{re.escape(old[i1])}\b", new[j1], region)
    return region


def fake_loader(config, progress=None):
    from quickdraft.completer import Completer

    return Completer(RenamingBackend(config), config)


def run_server(argv: list[str]) -> None:
    import argparse

    from quickdraft.cli_args import config_dict_from_args
    from quickdraft.config import load_config
    from quickdraft.lsp import cli
    from quickdraft.lsp.assembly import create_server

    # The scripted model's rewrite is what most tests here check: the rules off and the model's
    # rewrite on (a model not trained for next edits gets neither by default). `--rules`: the
    # defaults, rules first.
    rules = "--rules" in argv
    argv = [arg for arg in argv if arg != "--rules"]
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    cli.configure_logging(args.log_level)
    settings = config_dict_from_args(args)
    if not rules:
        settings.setdefault("edits", {}).update(rules=False, model_rewrite="on")
    cli.serve(create_server(load_config(settings), loader=fake_loader), None)


if __name__ == "__main__":
    run_server(sys.argv[1:])
    sys.exit(0)


# --- helpers -----------------------------------------------------------------------------


def command(*flags: str) -> list[str]:
    return [sys.executable, __file__, "serve", "--target", "fake", *flags]


async def raw_request(client, method: str, params, timeout: float = 60.0):
    """Send a request exactly as given; await the answer (the first waits for the server to
    import its pipeline, which conftest's 10 s does not always allow on 2 busy cores)."""
    msg_id = f"raw-{uuid.uuid4()}"
    future: Future = Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data(
        JsonRPCRequestMessage(id=msg_id, method=method, jsonrpc="2.0", params=params)
    )
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout)


def data(value):
    """An answer as plain dicts and lists (pygls reads unknown results as named tuples)."""
    if hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, dict):
        return {key: data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [data(item) for item in value]
    return value


async def inline_edit(client, uri: str, version, line: int, character: int):
    params = {"textDocument": {"uri": uri, "version": version}}
    params["position"] = {"line": line, "character": character}
    return data(await raw_request(client, INLINE_EDIT, params))


def positions(text: str) -> list[tuple[int, int]]:
    """(line, UTF-16 length) of every line of `text`."""
    return [(i, len(line.encode("utf-16-le")) // 2) for i, line in enumerate(text.split("\n"))]


def apply(text: str, edits: list[dict]) -> str:
    """The edits (LSP ranges in UTF-16 units, none overlapping) applied to `text`."""
    lines = text.split("\n")

    def offset(position) -> int:
        line = lines[position["line"]]
        units, column = 0, 0
        while column < len(line) and units < position["character"]:
            units += 2 if ord(line[column]) > 0xFFFF else 1
            column += 1
        return sum(len(x) + 1 for x in lines[: position["line"]]) + column

    spans = sorted(
        ((offset(e["range"]["start"]), offset(e["range"]["end"]), e["text"]) for e in edits),
        reverse=True,
    )
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


def inside(text: str, edits: list[dict]) -> bool:
    bounds = dict(positions(text))
    for e in edits:
        for end in ("start", "end"):
            at = e["range"][end]
            if at["line"] not in bounds or not 0 <= at["character"] <= bounds[at["line"]]:
                return False
    return True


SHAPES = (
    "def area(width, height):\n"
    "    scale = width * height\n"
    "    return width * height\n"
    "\n"
    "\n"
    "print(area(2, 3))\n"
)


# --- tests -------------------------------------------------------------------------------


async def test_the_capability_is_advertised(session):
    async with session(command()) as client:
        experimental = plain(client.initialize_result.capabilities.experimental)
        assert experimental == {"inlineEdit": True}


async def test_a_rename_is_finished_with_the_smallest_edits(session):
    async with session(command()) as client:
        open_doc(client, URI, SHAPES, version=1)
        # Rename `width` to `w` in the signature, as a client sends it: one change.
        edit(client, URI, 2, (0, 9), (0, 14), "w")
        answer = await inline_edit(client, URI, 2, 0, 10)
        current = SHAPES.replace("(width,", "(w,", 1)
        edits = answer["edits"]
        assert all(e["textDocument"] == {"uri": URI, "version": 2} for e in edits)
        assert inside(current, edits)
        assert apply(current, edits) == SHAPES.replace("width", "w")
        # Lines 1 and 2 changed together: one line-level hunk, trimmed to the characters
        # that differ at both ends (from after the first `w` to the end of the second).
        [only] = edits
        assert only["text"] == " * height\n    return w"
        assert only["range"] == {
            "start": {"line": 1, "character": len("    scale = w")},
            "end": {"line": 2, "character": len("    return width")},
        }
        await wait_for(lambda: any(plain(s).get("feature") == "inlineEdit" for s in client.stats))
        [stats] = [plain(s) for s in client.stats if plain(s).get("feature") == "inlineEdit"]
        assert stats["editCount"] == 1 and stats["uri"] == URI
        assert stats["copiedTokens"] > 0 and stats["targetForwards"] == 3
        assert stats["format"] == "instruct" and stats["rejected"] is None
        assert stats["stagesMs"].keys() >= {"context_ms", "tokenize_ms", "diff_ms"}


async def test_ranges_are_utf16_units_of_the_version_asked(session):
    async with session(command()) as client:
        text = "def f(name):\n    s = '😀' + name\n\n    return name\n"
        open_doc(client, URI, text, version=5)
        edit(client, URI, 6, (0, 6), (0, 10), "label")
        answer = await inline_edit(client, URI, 6, 0, 8)
        current = text.replace("(name)", "(label)")
        edits = answer["edits"]
        assert inside(current, edits)
        assert apply(current, edits) == text.replace("name", "label")
        # After '😀' (2 UTF-16 units, 1 code point) the column counts it twice.
        first = edits[0]["range"]
        assert (first["start"]["line"], first["start"]["character"]) == (
            1,
            len("    s = '😀' + ") + 1,
        )
        assert first["end"] == {"line": 1, "character": first["start"]["character"] + 4}
        assert len(edits) == 2 and edits[1]["range"]["start"] == {"line": 3, "character": 11}


async def test_stale_versions_and_unknown_documents_get_no_edits(session):
    async with session(command()) as client:
        open_doc(client, URI, SHAPES, version=1)
        edit(client, URI, 2, (0, 9), (0, 14), "w")
        assert (await inline_edit(client, URI, 1, 0, 10)) == {"edits": []}
        assert (await inline_edit(client, "file:///nowhere.py", 1, 0, 0)) == {"edits": []}
        assert (await inline_edit(client, URI, 2, 40, 0)) == {"edits": []}  # past the last line
        assert (await inline_edit(client, URI, 2, 0, 99)) == {"edits": []}  # past the line's end
        assert len((await inline_edit(client, URI, 2, 0, 10))["edits"]) == 1
        assert any("not 1" in m.message for m in client.log_messages)


async def test_bad_params_get_invalid_params_and_the_server_keeps_serving(session):
    async with session(command()) as client:
        open_doc(client, URI, SHAPES, version=1)
        edit(client, URI, 2, (0, 9), (0, 14), "w")
        bad = [
            {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}},
            {"textDocument": {"uri": URI, "version": "2"}, "position": {"line": 0, "character": 0}},
            {"textDocument": {"version": 2}, "position": {"line": 0, "character": 0}},
            {"textDocument": {"uri": URI, "version": 2}, "position": {"line": -1, "character": 0}},
            {"textDocument": {"uri": URI, "version": 2}},
            None,
        ]
        for params in bad:
            with pytest.raises(JsonRpcInvalidParams) as info:
                await raw_request(client, INLINE_EDIT, params)
            assert INLINE_EDIT in str(info.value)
        # A notification about a shown edit is accepted.
        client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"text": "w"}})
        assert len((await inline_edit(client, URI, 2, 0, 10))["edits"]) == 1


async def test_an_unfinished_rewrite_gives_no_edit(session):
    async with session(command()) as client:
        text = "def f(x):\n    return x  # UNCLOSED\n"
        open_doc(client, URI, text, version=1)
        edit(client, URI, 2, (0, 6), (0, 7), "y")
        assert (await inline_edit(client, URI, 2, 0, 7)) == {"edits": []}
        await wait_for(lambda: any(plain(s).get("feature") == "inlineEdit" for s in client.stats))
        stats = plain(client.stats[-1])
        assert stats["editCount"] == 0 and "did not finish" in stats["rejected"]
        assert stats["stopReason"] == "max_tokens"


async def test_a_newer_request_supersedes_the_older_and_stops_it(session, tmp_path, monkeypatch):
    started = tmp_path / "slow-started"
    monkeypatch.setenv(SLOW_STARTED, str(started))
    async with session(command()) as client:
        slow = "SLOW = 1\n" + "\n" * 40 + "ENDINGS = 2\n"
        open_doc(client, URI, slow, version=1)
        assert (await inline_edit(client, URI, 1, 41, 0))["edits"][0]["text"] == " "
        older = asyncio.ensure_future(inline_edit(client, URI, 1, 0, 0))
        await wait_for(started.exists, 20)  # the older rewrite runs on the worker
        assert not older.done()
        newer = asyncio.ensure_future(inline_edit(client, URI, 1, 41, 0))
        assert (await asyncio.wait_for(older, 20)) == {"edits": []}
        answer = await asyncio.wait_for(newer, 20)
        # The older generation saw its cancel event (it did not run on for 30 s).
        [item] = answer["edits"]
        assert "cancelled" in item["text"] and "ran to its end" not in item["text"]


async def test_a_keystroke_stops_the_next_edit_the_model_is_scoring(session, tmp_path, monkeypatch):
    """The likelihood veto runs on the model worker; the next change to the document stops it,
    so the keystroke's completion does not wait behind it."""
    started = tmp_path / "slow-started"
    monkeypatch.setenv(SLOW_STARTED, str(started))
    async with session(command("--rules")) as client:
        text = SHAPES.replace("    scale", "    # SLOW_VETO\n    scale")
        open_doc(client, URI, text, version=1)
        edit(client, URI, 2, (0, 9), (0, 14), "w")
        asked = asyncio.ensure_future(inline_edit(client, URI, 2, 0, 10))
        await wait_for(started.exists, 20)  # the model is scoring the first candidate
        assert not asked.done()
        edit(client, URI, 3, (0, 10), (0, 10), "i")  # the next keystroke
        # Stopped: answered long before the fake's 30 s, with nothing for an older version.
        assert (await asyncio.wait_for(asked, 20)) == {"edits": []}


async def test_a_renamed_parameter_is_proposed_at_each_use_in_turn_by_the_rename_rule(session):
    """The defaults (rules first, no model rewrite for this model): one edit at the next use;
    applied (as an editor's Tab sends it), the next answer is the use after it; then none."""
    async with session(command("--rules")) as client:
        open_doc(client, URI, SHAPES, version=1)
        edit(client, URI, 2, (0, 9), (0, 14), "w")
        current = SHAPES.replace("(width,", "(w,", 1)
        version, answers = 2, []
        for _ in range(4):
            answer = await inline_edit(client, URI, version, 0, 10)
            if not answer["edits"]:
                break
            [item] = answer["edits"]
            answers.append(item)
            current = apply(current, [item])
            version += 1
            r = item["range"]
            start, end = (
                (r["start"]["line"], r["start"]["character"]),
                (
                    r["end"]["line"],
                    r["end"]["character"],
                ),
            )
            edit(client, URI, version, start, end, item["text"])
        assert [a["range"]["start"] for a in answers] == [
            {"line": 1, "character": len("    scale = ")},
            {"line": 2, "character": len("    return ")},
        ]
        assert all(a["text"] == "w" for a in answers)
        assert current == SHAPES.replace("width", "w")
        await wait_for(
            lambda: sum(plain(s).get("feature") == "inlineEdit" for s in client.stats) >= 3
        )
        stats = [plain(s) for s in client.stats if plain(s).get("feature") == "inlineEdit"]
        assert [(s["rule"], s["confidence"], s["editCount"]) for s in stats] == [
            ("rename", 0.9, 1),
            ("rename", 0.9, 1),
            (None, None, 0),
        ]
        assert "model_rewrite" in stats[-1]["abstained"] and stats[0]["tokens"] == 0
        # The model was asked about each rename before it was shown (the likelihood veto).
        assert [s["judged"] for s in stats] == [1, 1, 0]


async def test_a_parameter_added_with_no_variable_of_its_name_gets_the_model_s_argument(
    session,
):
    """`def area(width, height)` gains `depth`: the call at the bottom has no `depth` to pass,
    so the model writes the argument (the fake writes `1`); applied, nothing is left."""
    async with session(command("--rules")) as client:
        open_doc(client, URI, SHAPES, version=1)
        at = SHAPES.index("):")
        edit(client, URI, 2, (0, at), (0, at), ", depth")
        answer = await inline_edit(client, URI, 2, 0, at)
        [item] = answer["edits"]
        line = "print(area(2, 3))"
        call = {"line": 5, "character": line.index("))")}
        assert item["text"] == ", 1" and item["range"] == {"start": call, "end": call}
        current = apply(SHAPES.replace("height):", "height, depth):"), [item])
        assert current.endswith("print(area(2, 3, 1))\n")
        edit(client, URI, 3, (5, call["character"]), (5, call["character"]), ", 1")
        assert await inline_edit(client, URI, 3, 5, 0) == {"edits": []}
        await wait_for(
            lambda: sum(plain(s).get("feature") == "inlineEdit" for s in client.stats) >= 2
        )
        stats = [plain(s) for s in client.stats if plain(s).get("feature") == "inlineEdit"]
        # Written by the model, not scored by the likelihood veto (the call needs an argument).
        assert [(s["rule"], s["filled"], s["judged"]) for s in stats] == [
            ("signature", 1, 0),
            (None, 0, 0),
        ]


async def test_a_change_has_its_next_edit_decided_before_it_is_asked_for(session):
    """Once the client asks for next edits, each change has the rules and the veto decide the
    document's next edit in the background; the request for that version takes the decision
    (the same answer it would have made), and says so."""
    async with session(command("--rules")) as client:
        open_doc(client, URI, SHAPES, version=1)
        assert await inline_edit(client, URI, 1, 0, 0) == {"edits": []}  # the client asks
        edit(client, URI, 2, (0, 9), (0, 14), "w")

        def decided() -> bool:
            return any(
                "(version 2) decided ahead: rule rename" in m.message for m in client.log_messages
            )

        await wait_for(decided, 20)
        answer = await inline_edit(client, URI, 2, 0, 10)
        [item] = answer["edits"]
        assert item["text"] == "w" and item["range"]["start"] == {
            "line": 1,
            "character": len("    scale = "),
        }
        await wait_for(
            lambda: sum(plain(s).get("feature") == "inlineEdit" for s in client.stats) >= 2
        )
        stats = [plain(s) for s in client.stats if plain(s).get("feature") == "inlineEdit"]
        assert [(s["rule"], s["decidedAhead"], s["judged"]) for s in stats] == [
            (None, False, 0),
            ("rename", True, 1),
        ]


async def test_a_function_renamed_in_one_file_renames_its_import_in_another(session):
    """A rename in `shapes.py`, then a next edit asked in the open `report.py`, which imports
    the function: its import is renamed (the answer is for report.py, at its version); applied,
    the next answer renames the call (the import rule, report.py's own latest edit now)."""
    report_uri = "file:///work/report.py"
    report = "from .shapes import area\n\n\nprint(area(4, 5))\n"
    async with session(command("--rules")) as client:
        open_doc(client, URI, SHAPES, version=1)
        open_doc(client, report_uri, report, version=1)
        edit(client, URI, 2, (0, 4), (0, 8), "surface")
        answer = await inline_edit(client, report_uri, 1, 3, 0)
        [item] = answer["edits"]
        assert item["textDocument"] == {"uri": report_uri, "version": 1}
        assert item["text"] == "surface" and item["range"]["start"] == {"line": 0, "character": 20}
        report = apply(report, [item])
        r = item["range"]
        start, end = (
            (r["start"]["line"], r["start"]["character"]),
            (r["end"]["line"], r["end"]["character"]),
        )
        edit(client, report_uri, 2, start, end, item["text"])
        [item] = (await inline_edit(client, report_uri, 2, 0, 0))["edits"]
        report = apply(report, [item])
        assert report == "from .shapes import surface\n\n\nprint(surface(4, 5))\n"
        await wait_for(
            lambda: sum(plain(s).get("feature") == "inlineEdit" for s in client.stats) >= 2
        )
        stats = [plain(s) for s in client.stats if plain(s).get("feature") == "inlineEdit"]
        assert [s["rule"] for s in stats] == ["rename", "import"]


def test_history_is_recorded_from_the_changes_the_store_applies():
    """The server's store records each change once, in order (threads: the event loop only)."""
    from quickdraft.lsp.documents import DocumentStore

    store = DocumentStore()
    store.open(URI, SHAPES, "python", 1)
    store.change(URI, [("w", (0, 9, 0, 14))], 2)
    [hunk] = store.history.hunks(URI)
    assert (hunk.old, hunk.new) == ("def area(width, height):\n", "def area(w, height):\n")
    assert threading.current_thread() is threading.main_thread()

"""The pieces of `quickdraft bench --typing` that need no server: the editor's keystrokes and
edits, the match rule, variants and flags, the summary, and the LSP client facing a server that
exits or never answers."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from quickdraft.bench import typing_report
from quickdraft.bench.editor import EditorDocument
from quickdraft.bench.lsp_client import StdioLspClient
from quickdraft.bench.typing_cli import base_settings, model_flags, parse_variants
from quickdraft.bench.typing_plan import (
    auto_indent,
    guess_indent_unit,
    other_file_spot,
    plan_keystrokes,
    suggestion_matches,
    typing_truth,
)
from quickdraft.bench.typing_replay import merge_settings
from quickdraft.errors import ConfigError, LanguageServerError
from quickdraft.lsp.documents import UTF16, Document


def typed_by(keys, line_before: str) -> str:
    text = line_before
    for key in keys:
        text = text[: len(text) - key.delete] + key.insert
    return text


# --- keystrokes -----------------------------------------------------------------------------


def test_keystrokes_type_the_truth_then_press_enter():
    truth = "if x:\n        y = 1\n    z = 2"
    keys = plan_keystrokes(truth, "    ", "    ")
    assert typed_by(keys, "    ") == "    " + truth + "\n    "
    kinds = [key.kind for key in keys]
    assert kinds.count("char") == len("if x:") + len("y = 1") + len("z = 2")
    # Enter after "if x:" indents one level more, as the file does: no fix needed.
    # Enter after "y = 1" keeps 8 spaces; the file dedents to 4: one `indent` keystroke.
    assert kinds.count("enter") == 3 and kinds.count("indent") == 1
    assert kinds[-1] == "enter" and not keys[-1].comparable
    # Wherever the document is the file's own text, `done` says how much of the truth is in.
    text = "    "
    for key in keys:
        text = text[: len(text) - key.delete] + key.insert
        if key.comparable:
            assert text == "    " + truth[: key.done]


def test_enter_indentation_follows_the_line_and_openers():
    assert auto_indent("    return f(", "    ") == "        "
    assert auto_indent("\tx = 1", "\t") == "\t"
    assert auto_indent("def f():", "  ") == "  "
    assert guess_indent_unit("def f():\n  if x:\n    y\n") == "  "
    assert guess_indent_unit("def f():\n\tif x:\n\t\ty\n") == "\t"
    assert guess_indent_unit("x = 1\n") == "    "


def test_typed_truth_is_the_first_lines():
    assert typing_truth("a\nb\nc\nd", 2) == "a\nb"
    assert typing_truth("a  \n", 3) == "a"


def test_a_suggestion_matches_the_text_typed_next():
    assert suggestion_matches("foo(", "foo(bar)\nbaz")
    assert suggestion_matches("foo(bar)  # done", "foo(bar)\nbaz")  # rest of line, then more
    assert suggestion_matches("foo(bar)\nbaz", "foo(bar)\nbaz = 1")
    assert not suggestion_matches("fox", "foo(bar)")
    assert not suggestion_matches("", "foo")
    assert not suggestion_matches("  ", "  foo")
    assert not suggestion_matches("x", "\ny")  # nothing left on the line: must be a prefix


def test_other_file_spot_is_the_end_of_a_middle_line():
    text = "a = 1\n\nb = 2\nc = 3\n"
    spot = other_file_spot(text)
    assert text[:spot].endswith("b = 2") or text[:spot].endswith("c = 3")
    assert other_file_spot("\n\n") == 0


def test_edits_become_didchange_with_utf16_ranges_and_versions():
    doc = EditorDocument("file:///a.py", "python", "s = '😀'\nx")
    change = doc.edit(len("s = '😀'"), len("s = '😀'"), "!")
    assert change["textDocument"] == {"uri": "file:///a.py", "version": 2}
    (only,) = change["contentChanges"]
    # The emoji is two UTF-16 code units: after 7 code points, the cursor is at character 8.
    assert only["range"]["start"] == {"line": 0, "character": 8}
    assert only["rangeLength"] == 0 and only["text"] == "!"
    replaced = doc.edit(4, 7, "")
    assert replaced["contentChanges"][0]["rangeLength"] == 4
    assert doc.text == "s = !\nx" and doc.document.version == 3
    # The server's own document store, fed the same changes, ends with the same text.
    server = Document("file:///a.py", "s = '😀'\nx", "python", 1, UTF16)
    for params in (change, replaced):
        for c in params["contentChanges"]:
            r = c["range"]
            server.apply_change(
                c["text"],
                (
                    r["start"]["line"],
                    r["start"]["character"],
                    r["end"]["line"],
                    r["end"]["character"],
                ),
            )
    assert server.text == doc.text


# --- variants and flags ---------------------------------------------------------------------


def test_variants_are_every_combination_with_their_settings():
    variants = parse_variants("append,classic", "ar,hybrid", "on,off")
    assert len(variants) == 8
    assert variants[0].name == "append/ar/ahead-on"
    assert variants[-1].settings() == {
        "context": {"layout": "classic"},
        "cache": {"warmup": False, "prefetch": False},
        "decoding": {"strategy": "hybrid"},
    }
    assert [v.name for v in parse_variants(None, None, None)][:3] == [
        "pinned/ar/ahead-on",
        "pinned/ar/ahead-off",
        "pinned/hybrid/ahead-on",
    ]
    for bad in (("zigzag", None, None), (None, "beam", None), (None, None, "maybe")):
        with pytest.raises(ConfigError, match="zigzag|beam|maybe"):
            parse_variants(*bad)


def test_candidates_are_a_variant_axis_only_when_asked_for():
    [one, three] = parse_variants("pinned", "hybrid", "on", "1,3")
    assert one.name == "pinned/hybrid/ahead-on/candidates-1"
    assert three.settings()["decoding"] == {"strategy": "hybrid", "candidates": 3}
    [plain] = parse_variants("pinned", "hybrid", "on")
    assert (
        plain.name == "pinned/hybrid/ahead-on" and "candidates" not in plain.settings()["decoding"]
    )
    for bad in ("0", "two", ""):
        with pytest.raises(ConfigError, match="--typing-candidates"):
            parse_variants("pinned", "hybrid", "on", bad)


def test_settings_merge_section_by_section():
    base = {"decoding": {"maxNewTokens": 8}, "context": {"layout": "append"}}
    merged = merge_settings(base, {"context": {"layout": "classic"}, "cache": {"warmup": True}})
    assert merged == {
        "decoding": {"maxNewTokens": 8},
        "context": {"layout": "classic"},
        "cache": {"warmup": True},
    }
    assert base["context"] == {"layout": "append"}


def test_max_tokens_goes_to_the_section_of_the_bench(tmp_path):
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"context": {"layout": "classic"}}), encoding="utf-8")
    args = argparse.Namespace(config=str(config), max_new_tokens=7)
    assert base_settings(args) == {
        "context": {"layout": "classic"},
        "decoding": {"maxNewTokens": 7},
    }
    assert base_settings(args, max_tokens_section="edits") == {
        "context": {"layout": "classic"},
        "edits": {"maxNewTokens": 7},
    }
    with pytest.raises(ConfigError, match="edits"):
        base_settings(argparse.Namespace(max_new_tokens=-1), max_tokens_section="edits")


def test_the_server_gets_the_bench_model_flags():
    args = argparse.Namespace(
        preset=None,
        target="t/",
        draft="d/",
        device="cpu",
        dtype="int8",
        threads=2,
        compile=None,
        no_calibrate=True,
    )
    flags = model_flags(args)
    assert flags[:2] == ["--target", "t/"]
    assert "--no-calibrate" in flags and flags[flags.index("--threads") :][:2] == ["--threads", "2"]
    assert "--preset" not in flags and "--compile" not in flags


# --- the summary ----------------------------------------------------------------------------


def request(hole, kind, outcome="shown", latency=10.0, **extra):
    record = {
        "hole": hole,
        "kind": kind,
        "outcome": outcome,
        "latency_ms": latency,
        "response": "cancelled" if outcome == "superseded" else "result",
        "cancel_sent": outcome == "superseded",
        "stats": outcome in ("shown", "empty"),
    }
    record.update(extra)
    return record


def test_summary_separates_cached_model_and_superseded_keystrokes():
    requests = [
        request(0, "cold", latency=1000.0, prefill_tokens=900, prompt_tokens=950, cached=False),
        request(0, "char", "superseded", latency=120.0),
        request(0, "char", latency=200.0, prefill_tokens=4, cached=False, matched=True),
        request(0, "char", latency=2.0, prefill_tokens=0, cached=True, matched=True),
        request(0, "char", latency=300.0, prefill_tokens=6, cached=False, matched=False),
        request(0, "enter", latency=250.0, prefill_tokens=20, cached=False, matched=None),
        request(0, "accept-wait", latency=50.0, prefill_tokens=0, cached=True, source="prefetch"),
        request(0, "back-enter", latency=400.0, prefill_tokens=30, cached=False),
        {**request(0, "char", "unanswered"), "response": "none", "stats": False},
    ]
    summary = typing_report.summarize_variant({"holes": [{}], "requests": requests})
    assert summary["keystrokes"] == 6 and summary["answered"] == 4
    assert summary["superseded"] == 1 and summary["unanswered"] == 1
    assert summary["cold_p50_ms"] == 1000.0
    assert summary["model_keystroke_p50_ms"] == 250.0  # 200, 250, 300
    assert summary["model_keystroke_to_cold"] == 0.25
    assert summary["prefill_p50"] == 5.0  # typed characters only, Enter apart
    assert summary["enter_prefill_p50"] == 20.0
    assert summary["cached_share"] == 0.25
    assert summary["match_rate"] == round(2 / 3, 3)
    assert summary["accept_wait"]["to_cold"] == 0.05
    assert summary["accept_wait"]["sources"] == ["prefetch"]
    assert summary["back_enter"]["prefill_p50"] == 30.0
    assert typing_report.failures({"summary": {"v": summary}}) == [
        "variant v: 1 requests never answered"
    ]
    results = {
        "env": {"holes": [], "pace_ms": 120.0, "server_command": []},
        "variants": {"v": {"requests": requests, "server": {}}},
        "summary": {"v": summary},
    }
    assert "| v |" in typing_report.render_markdown(results)
    assert typing_report.summary_table(results).splitlines()[1].startswith("v ")


# --- the client against a failing server ----------------------------------------------------


async def test_a_server_that_exits_fails_its_requests_with_its_log(tmp_path):
    script = (
        "import sys; sys.stdin.readline(); print('boom: no models', file=sys.stderr); sys.exit(3)"
    )
    client = StdioLspClient([sys.executable, "-c", script], log_path=tmp_path / "s.log")
    await client.start()
    pending = client.request("initialize", {})
    with pytest.raises(LanguageServerError, match="status 3") as caught:
        await client.wait(pending, 30)
    assert "boom: no models" in str(caught.value)
    assert client.exited
    with pytest.raises(LanguageServerError):
        client.request("shutdown", None)
    await client.close(timeout=5)


async def test_a_server_that_never_answers_times_out_and_says_so(tmp_path):
    # A server that reads and never answers (its sleep is the silence the client must time out).
    script = "import sys, time; sys.stdin.readline(); time.sleep(60)"
    client = StdioLspClient([sys.executable, "-c", script], log_path=tmp_path / "s.log")
    await client.start()
    beats: list[float] = []
    pending = client.request("textDocument/inlineCompletion", {})
    with pytest.raises(LanguageServerError, match="did not answer the request in 1 s"):
        await client.wait(pending, 0.6, what="the request", heartbeat=beats.append, every=0.2)
    assert beats  # it said it was waiting
    assert [r.id for r in client.unanswered()] == [pending.id]
    client.kill()
    await client.close(timeout=5)

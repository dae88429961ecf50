"""The workspace scenario of `quickdraft bench --typing` without models: which files and spots
it picks, the order of the editor's messages (planned, and as a stand-in server reads them off
the wire), the summary, and its flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from quickdraft.bench import workspace_report
from quickdraft.bench.holes import sample_holes
from quickdraft.bench.typing_replay import TypingBench, TypingOptions, Variant, reuse_split
from quickdraft.bench.workspace import (
    MOVE_LINES,
    choose_files,
    move_spot,
    plan_workspace,
    revisited_text,
    usable,
)
from quickdraft.bench.workspace_replay import WorkspaceScenario
from quickdraft.cli import main
from quickdraft.lsp.documents import UTF16, Document


def long_python(name: str, functions: int = 12) -> str:
    body = [f'"""{name}."""', ""]
    for n in range(functions):
        body += [
            f"def {name}_{n}(value, scale):",
            f"    total = value * scale + {n}",
            "    return total",
            "",
        ]
    return "\n".join(body) + "\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for name in ("alpha", "beta", "gamma"):
        (root / "pkg" / f"{name}.py").write_text(long_python(name))
    (root / "web").mkdir()
    for name in ("view", "model"):
        (root / "web" / f"{name}.js").write_text(
            "".join(
                f"function {name}{n}(a, b) {{\n  const sum = a + b * {n};\n  return sum;\n}}\n\n"
                for n in range(10)
            )
        )
    return root


def sampled(repo: Path, files: int):
    return sample_holes(repo, 4 * (files + 1), kinds=("line", "block"), open_files=0)


def apply(texts: dict[str, str], step) -> None:
    text = texts[step.file]
    texts[step.file] = text[: step.offset] + step.text + text[step.end :]


# --- the plan -------------------------------------------------------------------------------


def test_the_plan_opens_all_files_pauses_then_visits_each_comes_back_moves_and_asks_cold(repo):
    plan = plan_workspace(sampled(repo, 3), 3, open_pause_s=90.0, think_s=3.0)
    files = [hole.file for hole in plan.visits]
    assert len(files) == len(set(files)) == 3
    assert plan.cold is not None and plan.cold.file not in files
    assert {h.language for h in [*plan.visits, plan.cold]} == {"python", "javascript"}
    assert plan.notes == []

    steps = plan.steps
    actions = [(s.action, s.label) for s in steps]
    # didOpen all, the pause, then per file: didFocus, a thought, one character, a request.
    assert actions[:4] == [("open", "")] * 3 + [("pause", "open")]
    assert [s.file for s in steps[:3]] == files and steps[3].seconds == 90.0
    visit = [("focus", ""), ("pause", "think"), ("edit", ""), ("ask", "visit")]
    assert actions[4:16] == visit * 3
    for hole, (focus, think, edit, ask) in zip(
        plan.visits, [steps[4 + 4 * n : 8 + 4 * n] for n in range(3)], strict=True
    ):
        assert focus.file == edit.file == ask.file == hole.file
        assert focus.offset == edit.offset == edit.end == hole.offset and think.seconds == 3.0
        assert edit.text == hole.truth[0] and ask.offset == hole.offset + 1
    # Back to a visited file at once (no thought), one more character; then the move.
    back = plan.visits[plan.revisit]
    assert actions[16:] == [
        ("focus", ""),
        ("edit", ""),
        ("ask", "revisit"),
        ("focus", ""),
        ("pause", "think"),
        ("edit", ""),
        ("ask", "move"),
        ("open", ""),
        ("focus", ""),
        ("edit", ""),
        ("ask", "cold"),
    ]
    assert {s.file for s in steps[16:23] if s.action != "pause"} == {back.file}
    assert steps[16].offset == back.offset + 1 and steps[17].text == back.truth[1]
    move = plan.move
    assert move is not None and MOVE_LINES[0] <= abs(move.distance) <= MOVE_LINES[1]
    assert steps[19].offset == steps[21].offset == move.offset and steps[21].end == move.end
    assert steps[22].offset == move.offset + 1
    # The cold file is opened only at the end, and asked with no pause.
    assert [s.file for s in steps[23:]] == [plan.cold.file] * 4
    assert not any(s.action == "open" and s.file == plan.cold.file for s in steps[:23])

    # Played on the documents, every request sees the hole's text with what was typed.
    texts = {h.file: h.text for h in [*plan.visits, plan.cold]}
    asked = {}
    for step in steps:
        if step.action == "edit":
            apply(texts, step)
        elif step.action == "ask":
            asked[(step.label, step.file)] = (texts[step.file], step.offset)
    for hole in plan.visits:
        text, offset = asked[("visit", hole.file)]
        if hole.file != back.file:
            assert text == hole.typed(1)[0] and offset == hole.offset + 1
    text, offset = asked[("revisit", back.file)]
    assert text == revisited_text(back) == back.typed(2)[0] and offset == back.offset + 2
    text, offset = asked[("move", back.file)]
    line = text[: text.find("\n", offset)].rsplit("\n", 1)[1]
    assert text.count("\n") == revisited_text(back).count("\n")
    assert line.endswith(revisited_text(back)[move.offset]) and offset == move.offset + 1
    assert asked[("cold", plan.cold.file)] == (plan.cold.typed(1)[0], plan.cold.offset + 1)


def test_files_are_each_used_once_and_the_cold_one_is_extra(repo):
    holes = sampled(repo, 5)
    visits, cold = choose_files(holes, 5)
    assert len({h.file for h in visits}) == 5 == len(visits) and cold is None
    visits, cold = choose_files(holes, 3)
    assert len({h.file for h in [*visits, cold]}) == 4 and cold not in visits
    plan = plan_workspace(holes, 5, open_pause_s=0, think_s=0)
    assert "no file left for the cold baseline" in plan.notes
    assert not any(s.label == "cold" for s in plan.steps)
    plan = plan_workspace(holes, 9, open_pause_s=0, think_s=0)
    assert "only 5 files with a usable hole (asked for 9)" in plan.notes
    assert plan_workspace([], 3, open_pause_s=0, think_s=0).steps == []


def test_the_cold_file_is_the_one_most_like_the_visits_in_size(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    sizes = {"a": 40, "b": 40, "tiny": 2, "big": 40, "c": 40}
    for name, functions in sizes.items():
        (root / f"{name}.py").write_text(long_python(name, functions))
    holes = [h for h in sample_holes(root, 40, kinds=("line",), open_files=0) if usable(h)]
    first = {}
    for hole in holes:
        first.setdefault(Path(hole.file).stem, hole)
    assert {"a", "b", "tiny", "big"} <= set(first)
    # In sampling order the tiny file comes right after the two visited ones.
    ordered = [first["a"], first["b"], first["tiny"], first["big"]]
    visits, cold = choose_files(ordered, 2)
    assert [Path(h.file).stem for h in visits] == ["a", "b"]
    assert Path(cold.file).stem == "big"  # the tiny file would cost a fraction of a visit
    visits, cold = choose_files(ordered[:3], 2)
    assert Path(cold.file).stem == "tiny"  # the only one left


def test_a_hole_needs_two_characters_on_its_first_line(repo):
    hole = sampled(repo, 1)[0]
    assert usable(hole)
    for truth in ("x", "x\ny", " xy", "\r\nx"):
        hole.truth = truth
        assert not usable(hole), truth


def test_no_move_without_a_line_hole_20_to_40_lines_away(tmp_path):
    short = "def f(a):\n    return a + 1\n"
    assert move_spot(short, "python", 0) is None
    text = long_python("far", 15)
    spot = move_spot(text, "python", 0)
    assert spot is not None and 20 <= spot.distance <= 40
    assert abs(spot.distance - 30) <= 2  # the nearest to 30 lines away
    assert not text[spot.offset].isspace() and "\n" not in text[spot.offset : spot.end]
    root = tmp_path / "small"
    root.mkdir()
    for name in ("a", "b"):
        (root / f"{name}.py").write_text(f"def {name}(x):\n    return x * 2\n")
    plan = plan_workspace(sampled(root, 1), 1, open_pause_s=0, think_s=0)
    assert plan.move is None and plan.revisit == 0
    assert any("no move" in note for note in plan.notes)
    assert [s.label for s in plan.steps if s.action == "ask"] == ["visit", "revisit", "cold"]


# --- on the wire, against a stand-in server -------------------------------------------------

FAKE_SERVER = r"""
import json, sys
log = open(sys.argv[1], "w")
def send(message):
    body = json.dumps(message).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sys.stdout.buffer.flush()
while True:
    length = None
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            sys.exit(0)
        if not line.strip():
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    message = json.loads(sys.stdin.buffer.read(length))
    log.write(json.dumps(message) + "\n"); log.flush()
    method = message.get("method")
    if method == "exit":
        sys.exit(0)
    if "id" not in message:
        continue
    result = None
    if method == "initialize":
        result = {"capabilities": {}}
    elif method == "textDocument/inlineCompletion":
        stats = {"requestId": message["id"], "promptTokens": 100, "prefillTokens": 10,
                 "reusedTokens": 90, "cached": False, "source": "model",
                 "reusedSharedTokens": 60, "engine": {"reused_warm_tokens": 30}}
        send({"jsonrpc": "2.0", "method": "$/quickdraft/stats", "params": stats})
        result = {"items": [{"insertText": "x"}]}
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})
"""


def test_the_scenario_sends_the_planned_messages_and_reports_the_reuse_split(repo, tmp_path):
    plan = plan_workspace(sampled(repo, 2), 2, open_pause_s=0.01, think_s=0.0)
    wire = tmp_path / "wire.jsonl"
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    options = TypingOptions(
        repo=repo,
        out=tmp_path / "out",
        variants=[Variant("append", "ar", False)],
        server_command=[sys.executable, str(script), str(wire)],
        progress=False,
    )
    scenario = WorkspaceScenario(plan, open_pause_s=0.01, think_s=0.0)
    holes = [*plan.visits, plan.cold]
    results = TypingBench(holes, options, scenario).run()

    messages = [json.loads(line) for line in wire.read_text().splitlines()]
    methods = [m["method"] for m in messages if "method" in m]
    # initialize, initialized, the warm-up (open, ask, close); the scenario; shutdown, exit.
    start = methods.index("textDocument/didClose") + 1
    scenario_methods = methods[start : methods.index("shutdown")]
    wanted = {"open": "textDocument/didOpen", "focus": "textDocument/didFocus"}
    wanted |= {"edit": "textDocument/didChange", "ask": "textDocument/inlineCompletion"}
    planned = [wanted[s.action] for s in plan.steps if s.action != "pause"]
    assert scenario_methods == planned + ["textDocument/didClose"] * 3
    sent = [m for m in messages if m.get("method") in wanted.values()][2:]  # after the warm-up
    by_uri = {h.uri: Document(h.uri, h.text, h.language, 1, UTF16) for h in holes}
    for step, message in zip([s for s in plan.steps if s.action != "pause"], sent, strict=True):
        params = message["params"]
        uri = params["textDocument"]["uri"]
        assert uri == next(h.uri for h in holes if h.file == step.file)
        doc = by_uri[uri]
        if step.action in ("focus", "ask"):
            position = params["position"]
            assert doc.offset_at(position["line"], position["character"]) == step.offset
        elif step.action == "edit":
            (change,) = params["contentChanges"]
            r = change["range"]
            doc.apply_change(
                change["text"],
                (
                    r["start"]["line"],
                    r["start"]["character"],
                    r["end"]["line"],
                    r["end"]["character"],
                ),
            )
    assert by_uri[plan.cold.uri].text == plan.cold.typed(1)[0]

    (variant,) = results["variants"].values()
    requests = variant["requests"]
    assert [r["kind"] for r in requests] == ["visit", "visit", "revisit", "move", "cold"]
    assert [r["file"] for r in requests[:2]] == [h.file for h in plan.visits]
    assert all(r["outcome"] == "shown" and r["stats"] for r in requests)
    assert requests[0]["reused_shared_tokens"] == 60 and requests[0]["reused_warm_tokens"] == 30
    assert "reused_own_tokens" not in requests[0]
    summary = results["summary"]["append/ar/ahead-off"]
    assert summary["files"] == 2 and summary["unanswered"] == 0
    assert summary["move_prefill_share"] == 0.1
    assert summary["reuse"]["visit"] == {
        "requests": 2,
        "prompt_tokens": 200,
        "prefill_tokens": 20,
        "reused_tokens": 180,
        "reused_shared_tokens": 120,
        "reused_warm_tokens": 60,
        "reused_own_tokens": None,
    }
    assert results["env"]["scenario"] == "workspace"
    assert results["env"]["workspace"]["files"] == [h.file for h in plan.visits]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## First suggestion per file" in report and "## Reused tokens" in report


# --- the summary ----------------------------------------------------------------------------


def record(kind, latency, file="a.py", **extra):
    return {
        "kind": kind,
        "file": file,
        "outcome": "shown",
        "response": "result",
        "latency_ms": latency,
        "stats": True,
        **extra,
    }


def test_summary_compares_visits_with_the_cold_file_and_splits_reuse():
    requests = [
        record("visit", 100.0, "a.py", prompt_tokens=500, prefill_tokens=50, reused_tokens=450),
        record("visit", 300.0, "b.py", prompt_tokens=500, prefill_tokens=150, reused_tokens=350),
        {**record("visit", None, "c.py"), "outcome": "unanswered", "response": "none"},
        record("revisit", 40.0, prompt_tokens=500, prefill_tokens=2, reused_tokens=498),
        record("move", 250.0, prompt_tokens=400, prefill_tokens=100, reused_tokens=300),
        record("cold", 800.0, "d.py", prompt_tokens=600, prefill_tokens=600, reused_tokens=0),
    ]
    summary = workspace_report.summarize_variant({"requests": requests})
    assert summary["files"] == 3 and summary["answered"] == 5 and summary["unanswered"] == 1
    assert [v["file"] for v in summary["visits"]] == ["a.py", "b.py", "c.py"]
    assert summary["visit_p50_ms"] == 200.0 and summary["cold_ms"] == 800.0
    assert summary["visit_to_cold"] == 0.25
    assert summary["revisit_p50_ms"] == 40.0 and summary["move_p50_ms"] == 250.0
    assert summary["move_prefill_share"] == 0.25 and summary["cold_prefill_share"] == 1.0
    assert summary["visit_prefill_share"] == 0.2
    assert summary["reuse"]["visit"]["reused_tokens"] == 800
    assert summary["reuse"]["visit"]["reused_shared_tokens"] is None  # not sent: no figure
    assert summary["reuse"]["cold"]["prefill_tokens"] == 600
    assert summary["sources"]["revisit"] == []  # these stats name no source
    requests[3]["source"] = "typed-ahead"
    summary = workspace_report.summarize_variant({"requests": requests})
    assert summary["sources"]["revisit"] == ["typed-ahead"]
    empty = workspace_report.summarize_variant({"requests": []})
    assert empty["visit_to_cold"] is None and empty["move_prefill_share"] is None
    results = {
        "env": {"workspace": {"files": ["a.py"], "languages": ["python"]}},
        "variants": {"v": {"requests": requests, "server": {}}},
        "summary": {"v": summary},
    }
    markdown = workspace_report.render_markdown(results)
    assert "| v | 3 | 200 | 280 | 800 | 600 | 25% |" in markdown
    assert workspace_report.summary_table(results).splitlines()[1].startswith("v ")


def test_the_reuse_split_is_read_wherever_the_stats_carry_it():
    assert reuse_split({"reusedTokens": 5}) == {}
    assert reuse_split(
        {"reusedSharedTokens": 3, "reused_warm_tokens": 2, "engine": {"reused_own_tokens": 1}}
    ) == {"reused_shared_tokens": 3, "reused_warm_tokens": 2, "reused_own_tokens": 1}
    assert reuse_split({"reusedOwnTokens": True, "engine": None}) == {}


# --- flags ----------------------------------------------------------------------------------


def bench(repo: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--repo",
        str(repo),
        "--target",
        str(tmp_path / "t"),
        "--draft",
        "none",
        "--out",
        str(tmp_path / "out"),
        "--typing",
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("--typing-scenario", "workspace", "--typing-files", "0"), "--typing-files"),
        (("--typing-scenario", "workspace", "--typing-think-s", "-1"), "--typing-think-s"),
        (("--typing-scenario", "workspace", "--typing-open-pause-s", "nan"), "--typing-open"),
        (("--typing-scenario", "workspace", "--holes", "3"), "--holes: only with"),
        (("--typing-scenario", "workspace", "--typing-pace-ms", "5"), "--typing-pace-ms"),
        (("--typing-scenario", "workspace", "--typing-await"), "--typing-await"),
        (("--typing-files", "3"), "--typing-files: only with --typing-scenario workspace"),
        (("--typing-think-s", "1"), "--typing-think-s: only with"),
    ],
)
def test_scenario_flags_are_checked_with_clear_errors(repo, tmp_path, capsys, extra, named):
    assert main(bench(repo, tmp_path, *extra)) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing started


def test_an_unknown_scenario_is_refused_by_the_parser(repo, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(bench(repo, tmp_path, "--typing-scenario", "nap"))
    assert "nap" in capsys.readouterr().err

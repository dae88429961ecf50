"""`quickdraft bench --edits` without a model: mining cases from a git history the test writes,
applying and scoring answers, the summary, and the whole command against a stand-in server
that speaks the next-edit protocol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quickdraft.bench import edits_replay
from quickdraft.bench.edits import Hunk, apply_hunks, is_source, smallest_change
from quickdraft.bench.edits_cases import close_hunks, edit_distance, kind, mine_cases, score
from quickdraft.bench.edits_replay import EditError, apply_edits
from quickdraft.bench.edits_report import outcome, summarize
from quickdraft.cli import main
from quickdraft.errors import ConfigError
from quickdraft.lsp.documents import UTF16, Document

# --- a repository with a history ------------------------------------------------------------

AREA = [
    "def area(width, height):",
    '    """The area."""',
    "    check(width)",
    "    check(height)",
    "    return width * height",
    "",
    "",
    "def check(value):",
    "    if value < 0:",
    "        raise ValueError(value)",
]
SHAPES = ["class Shape:", "    def __init__(self, name):", "        self.name = name", ""] + [
    f"    def method_{n}(self):\n        return {n}" for n in range(6)
]
FAR = [f"x_{n} = {n}" for n in range(200)]


def lines(items: list[str]) -> str:
    return "\n".join(items) + "\n"


def git(root: Path, *args: str, date: str = "2025-02-01T12:00:00+00:00") -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    out = subprocess.run(
        ["git", "-C", str(root), *args], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def commit(root: Path, files: dict[str, str | bytes], date: str) -> str:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", f"change {', '.join(files)}", date=date)
    return git(root, "rev-parse", "HEAD")


def renamed(items: list[str], old: str, new: str, indices: list[int]) -> list[str]:
    return [line.replace(old, new) if i in indices else line for i, line in enumerate(items)]


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("history") / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(
        root,
        {
            "geo/area.py": lines(AREA),
            "geo/shapes.py": lines(SHAPES),
            "geo/far.py": lines(FAR),
            "geo/other.py": "y = 1\n",
            "geo/blob.py": b"\x00\x01binary\x00\n" * 20,
            "node_modules/lib/index.js": "var a = 1;\nvar b = 2;\nvar c = 3;\nvar d = 4;\n",
        },
        "2024-05-01T12:00:00+00:00",
    )
    commits = {}
    # Two close hunks, but before --edits-since.
    far = list(FAR)
    far[1], far[3] = "x_1 = 10", "x_3 = 30"
    commits["old"] = commit(root, {"geo/far.py": lines(far)}, "2024-06-01T12:00:00+00:00")
    # 3 hunks close together (lines 1, 3, 5: the parameter renamed): one case.
    commits["area"] = commit(
        root,
        {"geo/area.py": lines(renamed(AREA, "width", "w", [0, 2, 4]))},
        "2025-02-01T12:00:00+00:00",
    )
    # Two files at once, one hunk each: two no-edit cases.
    far[100] = "x_100 = 1000"
    commits["two"] = commit(
        root,
        {"geo/far.py": lines(far), "geo/other.py": "y = 2\n"},
        "2025-02-02T12:00:00+00:00",
    )
    # Hunks 150 lines apart: skipped.
    far[5], far[155] = "x_5 = 50", "x_155 = 1550"
    commits["far"] = commit(root, {"geo/far.py": lines(far)}, "2025-02-03T12:00:00+00:00")
    # A binary file (with a source extension): skipped.
    blob = bytearray(b"\x00\x01binary\x00\n" * 20)
    blob[1], blob[40] = 2, 3
    commits["binary"] = commit(root, {"geo/blob.py": bytes(blob)}, "2025-02-04T12:00:00+00:00")
    # Vendored: skipped.
    commits["vendored"] = commit(
        root,
        {"node_modules/lib/index.js": "var a = 10;\nvar b = 2;\nvar c = 30;\nvar d = 4;\n"},
        "2025-02-05T12:00:00+00:00",
    )
    # One hunk only: a no-edit case.
    far[5] = "x_5 = 5"
    commits["one"] = commit(root, {"geo/far.py": lines(far)}, "2025-02-06T12:00:00+00:00")
    # Two hunks in the class (a field renamed in two methods, 4 lines apart): one case.
    shapes = list(SHAPES)
    shapes[1] = "    def __init__(self, label):"
    shapes[2] = "        self.label = label"
    shapes[5] = "    def method_1(self):\n        return self.label"
    commits["shapes"] = commit(root, {"geo/shapes.py": lines(shapes)}, "2025-02-07T12:00:00+00:00")
    # A hunk of 9 changed lines: skipped.
    area = lines(renamed(AREA, "width", "w", [0, 2, 4]))
    big = area.replace("def check(value):\n", "def check(value):\n" + "    pass\n" * 9)
    big = big.replace("def area(w,", "def area(ww,")
    commits["big"] = commit(root, {"geo/area.py": big}, "2025-02-08T12:00:00+00:00")
    return {"root": root, "commits": commits}


def edit_cases(root: Path, **options) -> list:
    return [c for c in mine_cases(root, since="2025-01-01", max_cases=8, **options) if c.hunks > 1]


def test_a_case_is_the_first_hunk_typed_and_the_file_as_the_commit_left_it(history):
    commits = history["commits"]
    area, shapes = edit_cases(history["root"])
    assert (area.commit, shapes.commit) == (commits["area"], commits["shapes"])  # oldest first
    assert area.path == "geo/area.py" and area.language == "python" and area.hunks == 3
    assert area.date.startswith("2025-02-01T12:00:00")
    assert area.repository == str(history["root"].resolve())
    assert area.before == lines(AREA)
    # The user's edit is the first hunk, as small as a user types it: "width" -> "w".
    assert (area.edit_start, area.edit_end, area.edit_text) == (10, 14, "")
    assert area.before[area.edit_start : area.edit_end] == "idth"
    assert area.current == lines(renamed(AREA, "width", "w", [0]))
    assert area.current[: area.cursor].endswith("def area(w")
    # The truth: every hunk of the commit applied (its order is lost: any is the next).
    assert area.truth == lines(renamed(AREA, "width", "w", [0, 2, 4]))
    assert area.next_lines == 2
    # Hunk 1 is the two lines of the constructor; hunk 2 the method that reads the field.
    assert shapes.current.splitlines()[1:3] == [
        "    def __init__(self, label):",
        "        self.label = label",
    ]
    assert "return self.label" not in shapes.current and "return self.label" in shapes.truth
    assert shapes.hunks == 2 and shapes.next_lines == 5  # lines 3 to 8


def test_mining_reads_a_bare_mirror_as_it_reads_a_checkout(history, tmp_path):
    bare = tmp_path / "mirror.git"
    subprocess.run(
        ["git", "clone", "-q", "--mirror", str(history["root"]), str(bare)],
        check=True,
        env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull},
    )
    from_checkout = mine_cases(history["root"], since="2025-01-01", max_cases=8)
    from_mirror = mine_cases(bare, since="2025-01-01", max_cases=8)
    assert [(p.commit, p.path, p.before, p.truth) for p in from_mirror] == [
        (p.commit, p.path, p.before, p.truth) for p in from_checkout
    ]
    assert from_mirror[0].repository == str(bare.resolve())


def test_a_mirror_missing_a_large_blob_is_mined_as_the_whole_history(tmp_path):
    """A partial clone lacks its largest blobs: `git log --numstat` fails on them. The files
    then come from names alone, the line counts from the source files, and the cases are the
    same as the whole history gives."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(root, {"geo/area.py": lines(AREA), "data.csv": "a,b\n"}, "2024-05-01T12:00:00+00:00")
    commit(root, {"data.csv": "a,b\n" + "1,2\n" * 500}, "2025-02-01T12:00:00+00:00")
    edited = renamed(AREA, "width", "w", [0, 2, 4])
    commit(root, {"geo/area.py": lines(edited)}, "2025-02-02T12:00:00+00:00")
    commit(
        root,
        {"geo/area.py": lines(edited).replace("value < 0", "value <= 0"), "data.csv": "x\n"},
        "2025-02-03T12:00:00+00:00",
    )
    whole = mine_cases(root, since="2025-01-01", max_cases=8)
    blob = git(root, "rev-parse", "HEAD~2:data.csv")
    (root / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # as a partial clone lacks it
    with pytest.raises(subprocess.CalledProcessError):
        git(root, "log", "--numstat")
    assert mine_cases(root, since="2025-01-01", max_cases=8) == whole
    assert [c.hunks for c in whole] == [3, 1]  # the rename, and the one-hunk change


def test_since_max_cases_and_seed_choose_the_cases_deterministically(history):
    root, commits = history["root"], history["commits"]
    assert mine_cases(root, since="2025-02-05", max_cases=4) == mine_cases(
        root, since="2025-02-05", max_cases=4
    )
    later = mine_cases(root, since="2025-02-05", max_cases=4)
    assert [(c.commit, c.hunks) for c in later] == [(commits["one"], 1), (commits["shapes"], 2)]
    assert mine_cases(root, since="2030-01-01", max_cases=4) == []
    everything = mine_cases(root, since="2000-01-01", max_cases=12)
    assert everything[0].commit == commits["old"]
    assert len([c for c in everything if c.hunks > 1]) == 3
    chosen = {
        c.commit
        for seed in range(8)
        for c in mine_cases(root, since="2025-01-01", max_cases=1, seed=seed)
    }
    assert chosen == {commits["area"], commits["shapes"]}  # one edit case, no one-hunk one
    with pytest.raises(ConfigError, match="at least 1"):
        mine_cases(root, since="2025-01-01", max_cases=0)


def test_not_a_repository_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not a git repository"):
        mine_cases(tmp_path, since="2025-01-01", max_cases=1)
    with pytest.raises(ConfigError, match="does not exist"):
        mine_cases(tmp_path / "nowhere", since="2025-01-01", max_cases=1)


def test_hunks_their_limits_and_applying_them():
    assert Hunk.parse("@@ -3,0 +4,2 @@ def f():") == Hunk(3, 0, 3, 2)  # inserted after line 3
    assert Hunk.parse("@@ -5 +5 @@") == Hunk(4, 1, 4, 1)
    assert Hunk.parse("@@ -7,2 +6,0 @@") == Hunk(6, 2, 6, 0)
    old = ["a\n", "b\n", "c\n", "d\n"]
    new = ["a\n", "B\n", "c\n", "x\n", "d\n"]
    hunks = [Hunk(1, 1, 1, 1), Hunk(3, 0, 3, 1)]
    assert apply_hunks(old, new, hunks[:1]) == "a\nB\nc\nd\n"
    assert apply_hunks(old, new, hunks) == "".join(new)
    small = Hunk(10, 2, 10, 3)
    assert close_hunks([small, Hunk(20, 1, 21, 1), Hunk(85, 3, 86, 3)])
    assert close_hunks([small])  # one hunk: a no-edit case
    assert not close_hunks([small] * 7)  # seven
    assert not close_hunks([small, Hunk(100, 1, 101, 1)])  # 91 lines apart
    assert not close_hunks([small, Hunk(20, 9, 21, 1)])  # 9 lines removed
    assert smallest_change("f(a, b)\n", "f(a, bc)\n") == (6, 6, "c")
    assert smallest_change("abc", "abc") == (3, 3, "")


def test_source_files_only_not_vendored_generated_or_locks():
    assert is_source("src/agents/run.py") and is_source("tests/test_run.py")
    assert is_source("web/app.ts") and is_source("cmd/main.go")
    assert not is_source("README.md") and not is_source("package-lock.json")
    assert not is_source("node_modules/x/index.js") and not is_source("vendor/a/b.go")
    assert not is_source("proto/api_pb2.py") and not is_source("static/app.min.js")


# --- applying and scoring answers -----------------------------------------------------------

URI = "file:///w/a.py"


def edit(l1, c1, l2, c2, text, version=2, uri=URI):
    return {
        "range": {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}},
        "text": text,
        "textDocument": {"uri": uri, "version": version},
    }


def test_edits_apply_in_utf16_and_bad_ones_are_errors():
    text = "s = '😀'; x = 1\ny = x\n"
    # After the emoji (two UTF-16 units) "x" is at character 10; both ranges are in the text
    # as it was, whatever their order.
    applied = apply_edits(text, URI, 2, [edit(1, 4, 1, 5, "z"), edit(0, 10, 0, 11, "z")])
    assert applied == "s = '😀'; z = 1\ny = z\n"
    assert apply_edits(text, URI, 2, []) == text
    with pytest.raises(EditError, match="version 1"):
        apply_edits(text, URI, 2, [edit(1, 4, 1, 5, "z", version=1)])
    with pytest.raises(EditError, match="file:///other.py"):
        apply_edits(text, URI, 2, [edit(1, 4, 1, 5, "z", uri="file:///other.py")])
    with pytest.raises(EditError, match="outside the document"):
        apply_edits(text, URI, 2, [edit(9, 0, 9, 1, "z")])
    with pytest.raises(EditError, match="outside the document"):
        apply_edits(text, URI, 2, [edit(1, 0, 1, 40, "z")])
    with pytest.raises(EditError, match="overlap"):
        apply_edits(text, URI, 2, [edit(1, 0, 1, 3, "a"), edit(1, 2, 1, 4, "b")])
    with pytest.raises(EditError, match="no valid range"):
        apply_edits(text, URI, 2, [{"text": "a", "textDocument": {"uri": URI, "version": 2}}])


def test_scores_compare_the_answer_with_the_truth_over_the_changed_region():
    assert edit_distance("kitten", "sitting") == 3
    current = "def f(w):\n    g(width)\n    h(width)\n"
    truth = "def f(w):\n    g(w)\n    h(width)\n"
    assert score(current, truth, truth) == {
        "exact": True,
        "distance_before": 4,
        "distance_after": 0,
        "helpful": True,
        "harmful": False,
    }
    halfway = "def f(w):\n    g(wi)\n    h(width)\n"
    assert score(current, truth, halfway)["helpful"] and not score(current, truth, halfway)["exact"]
    # A step toward a truth of several changes is exact when it is one of them.
    both = "def f(w):\n    g(w)\n    h(w)\n"
    assert score(current, both, truth)["exact"] and score(current, both, truth)["helpful"]
    elsewhere = "def f(w):\n    g(w)\n    h(width)\n    k(w)\n"
    assert not score(current, both, elsewhere)["exact"]
    worse = "def f(w):\n    g(widthxx)\n    h(width)\n"
    result = score(current, truth, worse)
    assert result["harmful"] and result["distance_after"] == 6
    same = score(current, truth, current)
    assert not same["helpful"] and not same["harmful"] and same["distance_after"] == 4


def run(pair, latency, edits, *, exact=False, helpful=False, harmful=False, stats=None, error=None):
    record = {"pair": pair, "latency_ms": latency, "edits": edits, "error": error}
    if edits is not None and error is None:
        record.update(exact=exact, helpful=helpful, harmful=harmful)
    record["stats"] = stats is not None
    record.update(stats or {})
    return record


def test_summary_counts_exact_helpful_harmful_identity_no_edit_and_errors():
    a = [edit(0, 0, 0, 1, "x")]
    b = [edit(1, 0, 1, 1, "y")]
    ar_stats = {"tokens": 10, "target_forwards": 10, "copied_tokens": 0}
    fast = {"tokens": 12, "target_forwards": 4, "copied_tokens": 9}
    results = {
        "strategies": {
            "ar": {
                "runs": [
                    run(0, 100.0, a, exact=True, helpful=True, stats=ar_stats),
                    run(1, 200.0, [], stats=ar_stats),
                    run(2, 300.0, b, harmful=True, stats=ar_stats),
                    run(3, 400.0, b, helpful=True, stats=ar_stats),
                ]
            },
            "ngram": {
                "runs": [
                    run(0, 50.0, a, exact=True, helpful=True, stats=fast),  # same as ar
                    run(1, 50.0, [], stats=fast),  # same as ar: no edit either
                    run(2, 100.0, a, helpful=True, stats=fast),  # other edits than ar's
                    run(3, 10.0, None, error="edit 1's range is outside the document"),
                ]
            },
        }
    }
    summary = summarize(results)
    ar, ngram = summary["ar"], summary["ngram"]
    assert ar["pairs"] == 4 and ar["errors"] == 0 and ar["no_edit"] == 1
    assert (ar["exact"], ar["helpful"], ar["harmful"]) == (0.25, 0.5, 0.25)
    assert ar["identical_to_ar"] == 1.0 and ar["speedup_vs_ar"] == 1.0
    assert ar["tokens_per_forward"] == 1.0 and ar["copied_share"] == 0.0
    assert ar["p50_ms"] == 250.0
    assert ngram["errors"] == 1 and ngram["answered"] == 3 and ngram["no_edit"] == 1
    assert (ngram["exact"], ngram["helpful"], ngram["harmful"]) == (0.25, 0.5, 0.0)
    assert ngram["identical_to_ar"] == round(2 / 3, 3)
    assert ngram["speedup_vs_ar"] == 3.0  # median of 100/50, 200/50, 300/100
    assert ngram["tokens_per_forward"] == 3.0 and ngram["copied_share"] == 0.75
    assert ngram["p50_ms"] == 50.0  # the error's latency is not an answer's
    words = [outcome(r) for r in results["strategies"]["ngram"]["runs"]]
    assert words == ["exact", "no edit", "helpful", "error"]


# --- the whole command, against a stand-in server -------------------------------------------

FAKE_SERVER = r"""
import json, sys
wire = open(sys.argv[1], "a")
answers = json.load(open(sys.argv[2]))
strategy = None
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
    method = message.get("method")
    wire.write(json.dumps({"strategy": strategy, **message}) + "\n"); wire.flush()
    if method == "exit":
        sys.exit(0)
    if "id" not in message:
        continue
    reply = {"jsonrpc": "2.0", "id": message["id"], "result": None}
    if method == "initialize":
        strategy = message["params"]["initializationOptions"]["decoding"]["strategy"]
        reply["result"] = {"capabilities": {"experimental": {"inlineEdit": True}}}
    elif method == "textDocument/inlineCompletion":
        reply["result"] = {"items": []}
    elif method == "textDocument/copilotInlineEdit":
        doc = message["params"]["textDocument"]
        path = doc["uri"].split("/workspace/", 1)[-1].split("/", 1)[-1]
        spec = answers.get(strategy, {}).get(path, [])
        if spec == "unknown":
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": -32601, "message": "Method Not Found"}}
        elif spec == "fail":
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": -32603, "message": "the model failed"}}
        else:
            edits = [{"text": e["text"], "range": e["range"],
                      "textDocument": {"uri": doc["uri"], "version": doc["version"] + e.get("off", 0)},
                      "command": {"title": "accept", "command": "noop"}} for e in spec]
            reply["result"] = {"edits": edits}
            if path != "quickdraft-warmup.py":
                tokens = 20
                send({"jsonrpc": "2.0", "method": "$/quickdraft/stats", "params": {
                    "requestId": message["id"], "feature": "inlineEdit", "latencyMs": 5.0,
                    "rule": "repeat" if edits else None, "judged": 1 if edits else 0,
                    "tokens": tokens, "targetForwards": 20 if strategy == "ar" else 5,
                    "tokensPerForward": 1.0 if strategy == "ar" else 4.0,
                    "copiedTokens": 0 if strategy == "ar" else 15, "editCount": len(edits),
                    "engine": {"strategy": strategy}}})
    send(reply)
"""


def lsp_edit(text: str, start: int, end: int, new: str, **extra) -> dict:
    doc = Document("file:///x", text, "python", 1, UTF16)
    (l1, c1), (l2, c2) = doc.position_at(start), doc.position_at(end)
    return {
        "range": {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}},
        "text": new,
        **extra,
    }


def truth_edit(pair, **extra) -> dict:
    start, end, text = smallest_change(pair.current, pair.truth)
    return lsp_edit(pair.current, start, end, text, **extra)


@pytest.fixture
def fake_server(history, tmp_path, monkeypatch):
    cases = mine_cases(history["root"], since="2025-01-01", max_cases=12)
    area, shapes = (c for c in cases if c.hunks > 1)
    junk = lsp_edit(area.current, area.cursor, area.cursor, "_junk_")
    answers = {
        "ar": {"geo/area.py": [truth_edit(area)], "geo/shapes.py": []},
        "ngram": {"geo/area.py": [truth_edit(area)], "geo/shapes.py": [truth_edit(shapes)]},
        "hybrid": {"geo/area.py": [junk], "geo/shapes.py": [truth_edit(shapes, off=-1)]},
    }
    wire, answers_path = tmp_path / "wire.jsonl", tmp_path / "answers.json"
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)

    def serve(answers_now: dict) -> None:
        answers_path.write_text(json.dumps(answers_now))

    serve(answers)
    command = [sys.executable, str(script), str(wire), str(answers_path)]
    monkeypatch.setattr(edits_replay, "serve_command", lambda flags: command)
    return {"cases": cases, "pairs": (area, shapes), "wire": wire, "serve": serve}


def edits_args(repo: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--edits",
        "--edits-repo",
        str(repo),
        "--no-progress",
        "--out",
        str(out),
        *(() if "--edits-rest-ms" in extra else ("--edits-rest-ms", "0")),
        *extra,
    ]


def test_bench_edits_drives_the_server_as_a_client_and_reports(
    history, fake_server, tmp_path, capsys
):
    out = tmp_path / "out"
    assert main(edits_args(history["root"], out)) == 1  # hybrid's wrong version is a failure
    results = json.loads((out / "results.json").read_text())
    area, shapes = fake_server["pairs"]
    # The rules bench's cases: the two edit cases and three one-hunk files, oldest first.
    assert [p["commit"] for p in results["env"]["pairs"]] == [
        c.commit for c in fake_server["cases"]
    ]
    assert [p["hunks"] for p in results["env"]["pairs"]] == [3, 1, 1, 1, 2]
    root = str(history["root"].resolve())
    assert results["env"]["repositories"] == [root]
    assert results["env"]["heads"] == {root: git(history["root"], "rev-parse", "HEAD")}
    assert results["env"]["cpu"] and results["env"]["since"] == "2025-01-01"
    assert list(results["strategies"]) == ["ar", "ngram", "hybrid"]
    # Each server's facts: its log, the warm-up, the errors shown, its exit status.
    server = results["strategies"]["ngram"]["server"]
    assert server["log"] == str(out / "logs" / "serve-2-ngram.log") and server["errors"] == []
    assert server["warmup_s"] >= 0 and server["exit_status"] is not None

    ar, ngram, hybrid = (results["strategies"][n]["runs"] for n in ("ar", "ngram", "hybrid"))
    no_edits = ["no edit"] * 3
    assert [outcome(r) for r in ar] == ["exact", *no_edits, "no edit"]
    assert [outcome(r) for r in ngram] == ["exact", *no_edits, "exact"]
    assert [outcome(r) for r in hybrid] == ["harmful", *no_edits, "error"]
    assert [r["kind"] for r in ar] == ["edit", "none", "none", "none", "edit"]
    assert (
        hybrid[4]["error"] == "edit 1 is for version 1, asked for version 2" and hybrid[4]["edits"]
    )
    assert ngram[0]["stats"] and ngram[0]["copied_tokens"] == 15 and ngram[0]["tokens"] == 20
    assert ngram[0]["stats_edit_count"] == 1 and ngram[0]["feature"] == "inlineEdit"
    assert all(r["version"] == 2 for r in ar)
    summary = results["summary"]
    assert summary["ar"]["exact"] == 0.2 and summary["ar"]["no_edit"] == 4
    assert summary["ngram"]["identical_to_ar"] == 0.8 and summary["ngram"]["exact"] == 0.4
    assert (
        summary["ngram"]["tokens_per_forward"] == 4.0 and summary["ngram"]["copied_share"] == 0.75
    )
    assert summary["hybrid"]["harmful"] == 0.2 and summary["hybrid"]["errors"] == 1
    assert summary["ngram"]["speedup_vs_ar"] > 0
    # ...and scored per rule as the rules bench scores its cases.
    ngram_cases = summary["ngram"]["cases"]["overall"]
    assert (ngram_cases["cases"], ngram_cases["edit_cases"], ngram_cases["proposals"]) == (5, 2, 2)
    assert ngram_cases["coverage"]["rate"] == 1.0 and ngram_cases["precision"]["rate"] == 1.0
    assert ngram_cases["scored"] == 2 and summary["ngram"]["cases"]["rules"]["repeat"]
    hybrid_cases = summary["hybrid"]["cases"]["overall"]
    assert (hybrid_cases["errors"], hybrid_cases["harmful"]["n"]) == (1, 1)
    assert hybrid_cases["harmful"]["of"] == 4 and hybrid_cases["precision"]["rate"] == 0.0

    # On the wire: per pair didOpen, the request where the cursor arrives (before the edit, at
    # its start), an incremental didChange, the request at the cursor, and (for an edit shown)
    # didShowInlineEdit, then didClose.
    messages = [json.loads(line) for line in fake_server["wire"].read_text().splitlines()]
    mine = [m for m in messages if m["strategy"] == "ngram" and "area.py" in json.dumps(m)]
    assert [m["method"] for m in mine] == [
        "textDocument/didOpen",
        "textDocument/copilotInlineEdit",
        "textDocument/didChange",
        "textDocument/copilotInlineEdit",
        "textDocument/didShowInlineEdit",
        "textDocument/didClose",
    ]
    opened, arrived, changed, asked = (m["params"] for m in mine[:4])
    assert arrived["textDocument"] == {"uri": opened["textDocument"]["uri"], "version": 1}
    before = Document("file:///x", area.before, "python", 1, UTF16)
    assert before.offset_at(**arrived["position"]) == area.edit_start
    assert ngram[0]["arrival"]["edits"] == 1 and ngram[0]["arrival"]["latency_ms"] > 0
    assert summary["ngram"]["arrival_p50_ms"] > 0 and results["env"]["arrival"] is True
    assert ngram[0]["id"] == mine[3]["id"]
    server_copy = Document("file:///x", opened["textDocument"]["text"], "python", 1, UTF16)
    (change,) = changed["contentChanges"]
    r = change["range"]
    server_copy.apply_change(
        change["text"],
        (r["start"]["line"], r["start"]["character"], r["end"]["line"], r["end"]["character"]),
    )
    assert opened["textDocument"]["text"] == area.before and server_copy.text == area.current
    assert asked["textDocument"] == {"uri": opened["textDocument"]["uri"], "version": 2}
    line, character = asked["position"]["line"], asked["position"]["character"]
    assert server_copy.offset_at(line, character) == area.cursor
    shows = [m for m in messages if m.get("method") == "textDocument/didShowInlineEdit"]
    # Every answer with edits that apply: not ar's empty one nor hybrid's wrong version.
    assert [m["strategy"] for m in shows] == ["ar", "ngram", "ngram", "hybrid"]
    assert shows[0]["params"]["item"]["command"]["title"] == "accept"

    report = (out / "report.md").read_text()
    assert "CPU" in report and str(history["root"].resolve()) in report
    assert "| `ngram` | 5 |" in report and "## Per case" in report
    assert "## `ngram`, scored per rule" in report and "| repeat | 2 |" in report
    printed = capsys.readouterr()
    assert "ngram" in printed.out and "hybrid: 1 of 5 cases failed" in printed.err
    assert "ngram, scored per rule" in printed.out


def test_arrival_off_asks_only_after_the_edit(history, fake_server, tmp_path):
    out = tmp_path / "out"
    main(
        edits_args(
            history["root"],
            out,
            *("--strategies", "ar", "--edits-arrival", "off", "--edits-rest-ms", "20"),
        )
    )
    messages = [json.loads(line) for line in fake_server["wire"].read_text().splitlines()]
    mine = [m for m in messages if "area.py" in json.dumps(m)]
    assert [m["method"] for m in mine][:3] == [
        "textDocument/didOpen",
        "textDocument/didChange",
        "textDocument/copilotInlineEdit",
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["env"]["arrival"] is False and results["env"]["rest_ms"] == 20
    assert "20 ms later (editors ask once the person rests)" in (out / "report.md").read_text()
    assert "arrival" not in results["strategies"]["ar"]["runs"][0]
    assert results["summary"]["ar"]["arrival_p50_ms"] is None


def test_a_server_without_next_edits_stops_each_strategy_clearly(
    history, fake_server, tmp_path, capsys
):
    fake_server["serve"]({s: {"quickdraft-warmup.py": "unknown"} for s in ("ar", "ngram")})
    out = tmp_path / "out"
    assert main([*edits_args(history["root"], out), "--strategies", "ngram"]) == 1
    results = json.loads((out / "results.json").read_text())
    assert list(results["strategies"]) == ["ar", "ngram"]  # ar always runs, first
    for record in results["strategies"].values():
        assert "does not implement textDocument/copilotInlineEdit" in record["error"]
        assert record["runs"] == []
    assert "Stopped strategies" in (out / "report.md").read_text()
    assert "stopped" in capsys.readouterr().err


def test_edits_list_prints_the_cases_and_starts_no_server(history, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*edits_args(history["root"], out), "--edits-list"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("5 cases from ")
    area = history["commits"]["area"][:10]
    assert (
        printed[1]
        == f"{area} 2025-02-01 geo/area.py (3 hunks, the next 2 lines down): 'idth' -> ''"
    )
    assert not out.exists()


def test_flags_are_checked(history, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "--edits", "--out", str(out)]) == 2
    assert "--edits-repo: required" in capsys.readouterr().err
    assert main([*edits_args(history["root"], out), "--strategies", "fast"]) == 2
    assert "--strategies: unknown fast" in capsys.readouterr().err
    assert main([*edits_args(history["root"], out), "--edits-since", "2031-01-01"]) == 2
    assert "no case since 2031-01-01" in capsys.readouterr().err
    assert main(["bench", "--out", str(out)]) == 2
    assert "--repo: required" in capsys.readouterr().err
    assert main([*edits_args(history["root"], out), "--edits-rest-ms", "-1"]) == 2
    assert "--edits-rest-ms: must be milliseconds, 0 or more" in capsys.readouterr().err


# --- the rules' benchmark (bench/edits_cases.py) ----------------------------------------------


def test_cases_are_mined_wider_with_one_hunk_files_as_no_edit_cases(history):
    commits = history["commits"]
    cases = mine_cases(history["root"], since="2025-01-01", max_cases=8)
    edit_cases = [c for c in cases if kind(c) == "edit"]
    none_cases = [c for c in cases if kind(c) == "none"]
    # Edit cases: the rename in 3 hunks and the class's 2; the binary, vendored, 150-lines-apart
    # and 9-line-hunk commits stay out. One-hunk files (a quarter of 8): the two-file commit's
    # and the one-hunk commit's, the truth being the file as the commit left it.
    assert sorted(c.commit for c in edit_cases) == sorted([commits["area"], commits["shapes"]])
    assert len(none_cases) == 2
    assert {c.commit for c in none_cases} <= {commits["two"], commits["one"]}
    assert all(c.truth == c.current for c in none_cases)
    area = next(c for c in edit_cases if c.commit == commits["area"])
    assert area.truth == lines(renamed(AREA, "width", "w", [0, 2, 4]))  # all its hunks


def test_the_rules_are_replayed_as_the_server_runs_them_and_scored_per_rule(history):
    from quickdraft.bench.edits_cases import render, replay_case
    from quickdraft.bench.edits_cases import summarize as summarize_cases

    cases = mine_cases(history["root"], since="2025-01-01", max_cases=8)
    runs = [replay_case(case) for case in cases]
    by_commit = {case.commit: run for case, run in zip(cases, runs, strict=True)}
    area = by_commit[history["commits"]["area"]]
    assert (area["rule"], area["helpful"], area["harmful"]) == ("rename", True, False)
    assert area["note"] == "width -> w" and area["latency_ms"] >= 0
    summary = summarize_cases(runs)
    overall = summary["overall"]
    assert (overall["cases"], overall["edit_cases"], overall["errors"]) == (4, 2, 0)
    assert overall["precision"]["n"] == summary["rules"]["rename"]["precision"]["n"] >= 1
    assert overall["harmful"] == {"n": 0, "of": 4, "rate": 0.0, "ci95": [0.0, 0.4899]}
    assert "| rename |" in render(summary) and "| 0.45 |" in render(summary)


def test_a_rule_row_times_its_own_proposals_and_scored_answers_are_timed_apart():
    from quickdraft.bench.edits_cases import render, summarize

    def run(rule, latency, judged=0):
        verdict = {"exact": True, "helpful": True, "harmful": False}
        proposed = {"rule": rule, "proposed": True, **verdict} if rule else {"proposed": False}
        return {"kind": "edit", "latency_ms": latency, "judged": judged, **proposed}

    runs = [run(None, 2.0), run(None, 4.0), run("hoist", 6.0), run("rename", 3000.0, judged=1)]
    runs[-1]["decided_ahead"] = True  # the server decided it before the request came
    summary = summarize(runs)
    assert summary["rules"]["hoist"]["p50_ms"] == 6.0
    assert summary["rules"]["rename"]["p50_ms"] == 3000.0
    assert summary["overall"]["p50_ms"] == 5.0  # every answer's
    assert (summary["overall"]["scored"], summary["overall"]["scored_p50_ms"]) == (1, 3000.0)
    assert "scored: 1, p50 3000 ms" in render(summary)
    assert summary["overall"]["scored_ahead"] == 1 and "1 of them decided" in render(summary)
    assert "model scored" not in render(summarize(runs[:3]))


def test_wilson_intervals():
    from quickdraft.bench.edits_cases import rate, wilson

    assert wilson(0, 0) is None
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    assert rate(0, 10) == {"n": 0, "of": 10, "rate": 0.0, "ci95": [0.0, 0.2775]}


def test_the_rules_bench_writes_its_results_and_report_without_a_server(history, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["bench", "--edits", "--edits-rules", "--edits-repo", str(history["root"])]
    assert main([*argv, "--edits-max-pairs", "8", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["overall"]["cases"] == 4 and len(results["runs"]) == 4
    assert "0.45" in results["summary"]["floor_sweep"]
    assert "| overall |" in (out / "report.md").read_text()
    assert "| overall |" in capsys.readouterr().out


def test_histories_are_named_by_their_folder_not_a_mirrors_repo():
    from quickdraft.bench.edits_rules_cli import history_name

    assert history_name(Path("/m/huggingface+trl/repo")) == "huggingface+trl"
    assert history_name(Path("/src/aider/.git")) == "aider"
    assert history_name(Path("/src/aider")) == "aider"

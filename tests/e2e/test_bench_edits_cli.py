"""`quickdraft bench --edits` end to end: real `quickdraft serve` processes with tiny models,
asked for next edits over stdio LSP on a pair mined from a history the test writes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from quickdraft.cli import main

pytestmark = pytest.mark.timeout(300)

BEFORE = (
    "def area(width, height):\n"
    "    check(width)\n"
    "    check(height)\n"
    "    return width * height\n"
    "\n\n"
    "def check(value):\n"
    "    if value < 0:\n"
    "        raise ValueError(value)\n"
)


def git(root: Path, *args: str) -> None:
    date = "2025-03-01T12:00:00+00:00"
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
    subprocess.run(["git", "-C", str(root), *args], env=env, check=True, capture_output=True)


@pytest.fixture
def history(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "geo").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "geo" / "area.py").write_text(BEFORE)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "area")
    (root / "geo" / "area.py").write_text(BEFORE.replace("width", "w"))
    git(root, "commit", "-q", "-am", "rename width")  # 3 hunks: lines 1, 2, 4
    return root


def test_every_strategy_answers_next_edits_that_apply(tiny_models, history, tmp_path):
    out = tmp_path / "out"
    args = [
        "bench",
        "--edits",
        "--edits-repo",
        str(history),
        "--target",
        str(tiny_models / "target"),
        "--draft",
        str(tiny_models / "draft"),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--quick",
        "--no-progress",
        "--strategies",
        "ar,hybrid",
        "--out",
        str(out),
    ]
    status = main(args)
    results = json.loads((out / "results.json").read_text())
    errors = [record["error"] or "" for record in results["strategies"].values()]
    if all("does not implement textDocument/copilotInlineEdit" in e for e in errors):
        pytest.skip("this server has no next edits yet (issue 20)")
    assert status == 0, errors
    assert list(results["strategies"]) == ["ar", "hybrid"]
    for record in results["strategies"].values():
        assert record["error"] is None and record["server"]["exit_status"] == 0
        (run,) = record["runs"]
        # Whatever a random model writes, the server's edits apply to the version asked.
        assert run["error"] is None and isinstance(run["edits"], list)
        assert run["stats"] and run["feature"] == "inlineEdit"
        assert run["stats_edit_count"] == len(run["edits"])
        # The parameter's rename is finished by the rename rule, with no model work (the
        # model's rewrite is off for a model not trained for next edits).
        assert (run["rule"], run["exact"], run["tokens"]) == ("rename", True, 0)
    ar, hybrid = (results["strategies"][n]["runs"][0] for n in ("ar", "hybrid"))
    assert hybrid["edits"] == ar["edits"]  # greedy: the same rewrite, drafts or not
    assert results["summary"]["hybrid"]["identical_to_ar"] == 1.0
    assert "| `hybrid` | 1 |" in (out / "report.md").read_text()

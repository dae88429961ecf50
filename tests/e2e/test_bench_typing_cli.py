"""`quickdraft bench --typing` end to end: real `quickdraft serve` processes with tiny models,
typed at over stdio LSP; what every request became, the stats matched to them, the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_cli import bench_args

from quickdraft.cli import main

pytestmark = pytest.mark.timeout(240)

VARIANTS = ("append/hybrid/ahead-on", "classic/hybrid/ahead-on")
KEYSTROKES = ("char", "enter", "indent")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "geo").mkdir(parents=True)
    (root / "geo" / "circle.py").write_text(
        "from .constants import PI\n\n\ndef area(radius):\n    squared = radius * radius\n"
        "    return PI * squared\n\n\ndef perimeter(radius):\n    return 2 * PI * radius\n"
    )
    (root / "geo" / "constants.py").write_text("PI = 3.14159\nTAU = 2 * PI\n")
    return root


def typing_args(tiny_models: Path, repo: Path, out: Path, *extra: str) -> list[str]:
    return bench_args(
        tiny_models,
        repo,
        out,
        "--typing",
        "--threads",
        "1",
        "--no-calibrate",
        "--max-tokens",
        "8",
        "--languages",
        "py",
        *extra,
    )


def test_typing_bench_answers_every_request_and_reports_each_variant(
    tiny_models, repo, tmp_path, capsys
):
    out = tmp_path / "out"
    args = typing_args(
        tiny_models,
        repo,
        out,
        "--holes",
        "1",
        "--typing-lines",
        "2",
        # No time between keystrokes: every keystroke but the last supersedes the one before.
        "--typing-pace-ms",
        "0",
        "--typing-layouts",
        "append,classic",
        "--strategies",
        "hybrid",
        "--typing-work-ahead",
        "on",
    )
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["variants"]) == list(VARIANTS)
    for name in VARIANTS:
        variant = results["variants"][name]
        assert variant["error"] is None
        assert variant["settings"]["context"]["layout"] == name.split("/")[0]
        assert variant["settings"]["cache"] == {"warmup": True, "prefetch": True}
        assert variant["server"]["dtype"] and variant["server"]["device"] == "cpu"
        requests = variant["requests"]
        kinds = [r["kind"] for r in requests]
        assert kinds[0] == "cold" and kinds.count("cold") == 1
        assert {"char", "enter", "other-file", "back-same", "back-enter"} <= set(kinds)
        # Tab then a request, wherever there was a suggestion to accept; else the hole says so.
        skipped = variant["holes"][0].get("accept_skipped", [])
        for kind in ("accept-wait", "accept-now"):
            assert (kind in kinds) != (kind in skipped), kind

        # Every request was answered: with a result, or as cancelled after $/cancelRequest.
        assert all(r["response"] in ("result", "cancelled") for r in requests), name
        for r in requests:
            if r["response"] == "cancelled" or r["outcome"] == "superseded":
                assert r["cancel_sent"] and r["cancel_ms"] <= r["answer_ms"], r
        keys = [r for r in requests if r["kind"] in KEYSTROKES]
        assert sum(r["outcome"] == "superseded" for r in keys) >= len(keys) - 1 > 0
        assert keys[-1]["outcome"] in ("shown", "empty")  # the last one is awaited

        # The server's $/quickdraft/stats, matched by requestId, are in the records.
        cold = requests[0]
        assert cold["stats"] and cold["prompt_tokens"] > 0 and cold["prefill_tokens"] > 0
        assert all(r["stats"] for r in requests if r["outcome"] == "shown")
        answered = [r for r in requests if r["stats"]]
        assert all(isinstance(r["prefill_tokens"], int) for r in answered)
        assert all(
            r["source"] in ("model", "typed-ahead", "prefetch", "shared", "unsure")
            for r in answered
        )
        summary = results["summary"][name]
        assert summary["unanswered"] == 0 and summary["cancel_without_request"] == 0
        assert summary["cold_prefill_p50"] == cold["prefill_tokens"]

    report = (out / "report.md").read_text()
    assert all(f"| {name} |" in report for name in VARIANTS)
    assert "CPU:" in report and "## Accept, then the next suggestion" in report
    assert (out / "typing_latency_cdf.png").stat().st_size > 0
    printed = capsys.readouterr()
    assert all(name in printed.out for name in VARIANTS)
    assert "hole 1/1" in printed.err and "variant 2/2" in printed.err


def test_a_server_that_cannot_serve_stops_its_variant_with_a_clear_error(repo, tmp_path, capsys):
    out = tmp_path / "out"
    missing = tmp_path / "no-such-model"
    args = typing_args(missing.parent, repo, out, "--holes", "1", "--typing-layouts", "classic")
    args[args.index("--target") + 1] = str(missing)
    args[args.index("--draft") + 1] = "none"
    args += ["--strategies", "ar", "--typing-work-ahead", "off"]
    assert main(args) == 1
    results = json.loads((out / "results.json").read_text())
    (variant,) = results["variants"].values()
    assert "could not load models" in variant["error"] and "no-such-model" in variant["error"]
    assert "Stopped variants" in (out / "report.md").read_text()
    assert "could not load models" in capsys.readouterr().err


@pytest.fixture
def workspace_repo(repo: Path) -> Path:
    """Four Python files, one long enough to move 20-40 lines within."""
    lines = ['"""Shapes."""', "", "from .constants import PI", ""]
    for n in range(14):
        lines += [
            f"def shape_{n}(size):",
            f"    scaled = size * {n + 1}",
            "    return PI * scaled",
            "",
        ]
    (repo / "geo" / "shapes.py").write_text("\n".join(lines) + "\n")
    (repo / "geo" / "units.py").write_text(
        "def metres(feet):\n    ratio = 0.3048\n    return feet * ratio\n"
    )
    return repo


def test_workspace_scenario_visits_each_file_comes_back_moves_and_asks_a_cold_one(
    tiny_models, workspace_repo, tmp_path, capsys
):
    out = tmp_path / "out"
    args = typing_args(
        tiny_models,
        workspace_repo,
        out,
        "--typing-scenario",
        "workspace",
        "--typing-files",
        "3",
        "--typing-open-pause-s",
        "0.5",
        "--typing-think-s",
        "0",
        "--typing-layouts",
        "append",
        "--strategies",
        "hybrid",
        "--typing-work-ahead",
        "on",
    )
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    workspace = results["env"]["workspace"]
    assert results["env"]["scenario"] == "workspace"
    assert len(workspace["files"]) == 3 and workspace["cold"] not in workspace["files"]
    assert workspace["move"] is not None and workspace["notes"] == []
    (name,) = results["variants"]
    variant = results["variants"][name]
    assert variant["error"] is None and variant["server"]["exit_status"] == 0
    requests = variant["requests"]
    # didFocus (which this server may not know) is no reason to stop: every request answered.
    assert [r["kind"] for r in requests] == ["visit"] * 3 + ["revisit", "move", "cold"]
    assert [r["file"] for r in requests[:3]] == workspace["files"]
    assert requests[-1]["file"] == workspace["cold"]
    assert all(r["response"] == "result" and r["stats"] for r in requests)
    assert all(r["prompt_tokens"] > 0 and r["prefill_tokens"] is not None for r in requests)
    assert "prefill_ms" in requests[0]["stages_ms"]  # where the server spent the time
    summary = results["summary"][name]
    assert summary["files"] == 3 and summary["answered"] == 6 and summary["unanswered"] == 0
    for key in ("visit_p50_ms", "cold_ms", "visit_to_cold", "revisit_p50_ms", "move_p50_ms"):
        assert summary[key] is not None, key
    move = requests[4]
    assert summary["move_prefill_share"] == round(move["prefill_tokens"] / move["prompt_tokens"], 3)
    assert summary["reuse"]["visit"]["requests"] == 3
    assert summary["reuse"]["visit"]["prompt_tokens"] == sum(
        r["prompt_tokens"] for r in requests[:3]
    )

    report = (out / "report.md").read_text()
    assert "## First suggestion per file" in report and "## Reused tokens" in report
    assert all(f"`{file}`" in report for file in workspace["files"])
    printed = capsys.readouterr()
    assert name in printed.out and "/ cold" in printed.out
    assert "6/6 cold" in printed.err

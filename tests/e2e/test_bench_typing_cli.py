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
        assert all(r["source"] in ("model", "typed-ahead", "prefetch", "shared") for r in answered)
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

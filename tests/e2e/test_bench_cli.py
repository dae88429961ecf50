"""`quickdraft bench --quick` end to end: the CLI, model loading, Completer, peers, files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickdraft.bench.report import STAGES
from quickdraft.cli import main

OURS = ("ar", "ngram", "draft", "hybrid")
HOLE_KEYS = {"file", "language", "line", "col", "kind", "prompt_tokens", "truth", "runs"} | {
    "open_files",
    "copied_from",
    "ar_copied_from",
}
RUN_KEYS = {
    "completion",
    "tokens",
    "latency_ms",
    "prefill_ms",
    "decode_ms",
    "new_tokens",
    "target_forwards",
    "accepted_by_source",
    "drafted_by_source",
    "stages_ms",
    "repeated",
    "repeat_trimmed",
    "identical_to_ar",
    "exact_match",
    "prefix_match",
    "confidence",
    "line_confidence",
    "alternatives",
}
SUMMARY_KEYS = {
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "tokens_per_forward",
    "speedup_vs_ar",
    "identical_to_ar",
    "same_text_as_ar",
    "exact_match",
    "stages_p50_ms",
    "repeated",
    "repeat_trimmed",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "app").mkdir(parents=True)
    (root / "app" / "shapes.py").write_text(
        "from .units import scale\n\n\nclass Rect:\n    def __init__(self, w, h):\n"
        "        self.w = w\n        self.h = h\n\n    def area(self):\n"
        "        product = self.w * self.h\n        return scale(product, 2)\n"
    )
    (root / "app" / "units.py").write_text(
        "def scale(value, factor):\n    result = value * factor\n    return round(result, 3)\n"
    )
    (root / "web").mkdir()
    (root / "web" / "greet.ts").write_text(
        "export function greet(name: string): string {\n  const base = 'Hello, ' + name;\n"
        "  return base.trim();\n}\n"
    )
    (root / "web" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    return root


def bench_args(tiny_models: Path, repo: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--repo",
        str(repo),
        "--target",
        str(tiny_models / "target"),
        "--draft",
        str(tiny_models / "draft"),
        "--device",
        "cpu",
        "--quick",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_quick_run_writes_results_report_and_plots(tiny_models, repo, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(bench_args(tiny_models, repo, out)) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"env", "holes", "summary"}
    assert len(results["holes"]) == 3
    for key in ("device", "dtype", "torch", "transformers", "models"):
        assert key in results["env"]
    for hole in results["holes"]:
        assert set(hole) == HOLE_KEYS
        assert hole["file"] != "web/logo.png"
        for name in OURS:
            assert set(hole["runs"][name]) == RUN_KEYS
            assert tuple(hole["runs"][name]["stages_ms"]) == STAGES  # timed per stage
        assert hole["runs"]["hf-prompt-lookup"]["stages_ms"] == {}  # peers: timed whole
    for name in OURS:
        assert set(results["summary"][name]) == SUMMARY_KEYS
        # Greedy speculative decoding through the whole pipeline is plain decoding.
        assert results["summary"][name]["identical_to_ar"] == 1.0, name
    # transformers' peers ran on the same prompts; their identity is reported, whatever it is.
    for peer in ("hf-assisted", "hf-prompt-lookup"):
        assert peer in results["summary"]
    # llama.cpp needs the package and GGUF models: skipped with a reason, not an error.
    for peer in ("llama-cpp", "llama-cpp-lookup"):
        assert peer in results["env"]["skipped"]
    report = (out / "report.md").read_text()
    assert "## Per strategy" in report and "## Keystroke replay" in report
    assert "## Where the time goes" in report
    assert (out / "latency_cdf.png").exists() and (out / "speedup_by_language.png").exists()
    replay = json.loads((out / "replay.json").read_text())
    assert all(step["reused_tokens"] > 0 for rec in replay["holes"] for step in rec["typed"])
    printed = capsys.readouterr().out
    assert "hybrid" in printed and "results.json" in printed


def test_sweep_writes_the_best_draft_length(tiny_models, repo, tmp_path):
    out = tmp_path / "out"
    args = bench_args(
        tiny_models, repo, out, "--strategies", "ar,hybrid", "--sweep-draft-length", "1,4"
    )
    assert main([*args, "--languages", "py", "--no-replay"]) == 0
    snippet = json.loads((out / "draft_length.json").read_text())
    sweep = json.loads((out / "sweep.json").read_text())
    best = sweep["best"]["python"]
    assert best in (1, 4)
    # The snippet fixes the best length only where it beat the adaptive policy.
    cells = sweep["summary"]["python"]["hybrid"]
    adaptive_won = cells["adaptive"]["speedup_vs_ar"] >= cells[str(best)]["speedup_vs_ar"]
    expected = None if adaptive_won else best
    assert snippet["languages"]["python"]["draft_length"] == expected
    assert (out / "acceptance_vs_draft_length.png").exists()


def test_interrupt_keeps_the_finished_holes(tiny_models, repo, tmp_path, monkeypatch):
    from quickdraft.bench.session import Session

    real = Session.complete
    calls = {"n": 0}

    def interrupting(self, hole, strategy, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2 + 2 * 2:  # warm-up (2 runs), then hole 1 and hole 2 (2 runs each)
            raise KeyboardInterrupt
        return real(self, hole, strategy, **kwargs)

    monkeypatch.setattr(Session, "complete", interrupting)
    out = tmp_path / "out"
    args = bench_args(tiny_models, repo, out, "--strategies", "ar,hybrid", "--no-replay")
    assert main(args) == 130
    results = json.loads((out / "results.json").read_text())
    assert results["env"]["interrupted"] is True
    assert len(results["holes"]) == 3 - 1
    assert "interrupted" in (out / "report.md").read_text()


def test_bad_arguments_are_one_line_errors(tiny_models, repo, tmp_path, capsys):
    assert main(bench_args(tiny_models, tmp_path / "missing", tmp_path / "o")) == 2
    assert "--repo" in capsys.readouterr().err
    assert main(bench_args(tiny_models, repo, tmp_path / "o", "--strategies", "ar,beam")) == 2
    assert "beam" in capsys.readouterr().err
    assert main(bench_args(tiny_models, repo, tmp_path / "o", "--languages", "cobol")) == 2
    assert "cobol" in capsys.readouterr().err
    assert main(bench_args(tiny_models, repo, tmp_path / "o", "--trees", "off,sometimes")) == 2
    assert "--trees" in capsys.readouterr().err
    assert main(bench_args(tiny_models, repo, tmp_path / "o", "--trees", "off,65")) == 2
    assert "65" in capsys.readouterr().err


def test_bench_times_two_runtimes_side_by_side(repo, tmp_path, monkeypatch):
    """`--runtime torch,llamacpp` on the same GGUF pair: every engine strategy runs on both,
    each compared for identity with `ar` on its own runtime."""
    from quickdraft.decoding import llamacpp

    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed (quickdraft[llama])")
    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, layers=1)
    out = tmp_path / "out"
    args = [
        "bench",
        "--repo",
        str(repo),
        "--target",
        str(tmp_path / "target.gguf"),
        "--draft",
        str(tmp_path / "draft.gguf"),
        "--runtime",
        "torch,llamacpp",
        "--strategies",
        "ar,ngram,hybrid",
        "--threads",
        "1",
        "--quick",
        "--no-progress",
        "--no-replay",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    names = ["ar", "ngram", "hybrid", "ar@llamacpp", "ngram@llamacpp", "hybrid@llamacpp"]
    assert results["env"]["strategies"] == names
    assert results["env"]["models"]["runtime"] == "torch"
    assert results["env"]["variants"]["llamacpp"]["models"]["runtime"] == "llamacpp"
    for hole in results["holes"]:
        assert list(hole["runs"]) == names
        runs = hole["runs"]
        for name in ("ngram", "hybrid"):
            assert runs[name]["identical_to_ar"] == (runs[name]["tokens"] == runs["ar"]["tokens"])
            on_llama = runs[f"{name}@llamacpp"]
            assert on_llama["identical_to_ar"] == (
                on_llama["tokens"] == runs["ar@llamacpp"]["tokens"]
            )
    assert set(results["summary"]) >= set(names)
    assert "hybrid@llamacpp" in (out / "report.md").read_text()


def test_bench_compares_prompt_layouts_on_the_same_holes(tiny_models, repo, tmp_path):
    out = tmp_path / "out"
    args = bench_args(tiny_models, repo, out, "--layouts", "classic,append", "--no-replay")
    args += ["--strategies", "ar,hybrid"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    names = ["ar", "hybrid", "ar@append", "hybrid@append"]
    assert results["env"]["strategies"] == names
    assert results["env"]["variants"]["append"]["layout"] == "append"
    for hole in results["holes"]:
        runs = hole["runs"]
        assert runs["hybrid@append"]["identical_to_ar"] == (
            runs["hybrid@append"]["tokens"] == runs["ar@append"]["tokens"]
        )
        assert runs["ar@append"]["same_text_as_ar"] == (
            runs["ar@append"]["completion"] == runs["ar"]["completion"]
        )
    assert results["summary"]["ar@append"]["same_text_as_ar"] is not None


def test_bench_compares_tree_settings_on_the_same_holes(tiny_models, repo, tmp_path):
    """`--trees off,8`: the first setting is the baseline, `ngram@tree-8` verifies trees of 8
    tokens on the same models and holes, and greedy output stays token-identical to `ar`. (The
    tiny models stop within a forward or two, before any runner-up was recycled: the trees
    themselves are tested in unit/test_tree.py.)"""
    out = tmp_path / "out"
    args = bench_args(
        tiny_models, repo, out, "--trees", "off,8,8", "--dtype", "int8", "--no-replay"
    )
    args += ["--strategies", "ar,ngram"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    names = ["ar", "ngram", "ar@tree-8", "ngram@tree-8"]
    assert results["env"]["strategies"] == names
    assert results["env"]["variants"]["tree-8"]["tree"] == 8
    for hole in results["holes"]:
        runs = hole["runs"]
        assert runs["ngram@tree-8"]["tokens"] == runs["ar"]["tokens"]
        assert runs["ngram"]["drafted_by_source"].get("recycled", 0) == 0  # tree off


def test_candidates_are_forks_that_compute_no_prompt_token(tiny_models, repo, tmp_path):
    out = tmp_path / "out"
    args = bench_args(
        tiny_models, repo, out, "--strategies", "ar,hybrid", "--candidates", "3", "--holes", "8"
    )
    args += ["--max-tokens", "12"]
    assert main([*args, "--no-replay"]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = [hole["runs"]["hybrid"] for hole in results["holes"]]
    alternatives = [other for run in runs for other in run["alternatives"]]
    assert alternatives, runs  # random tiny models are unsure: there is somewhere to branch
    for run in runs:
        shown = bool(run["completion"].strip())
        assert (0 <= run["confidence"] <= 1) if shown else run["confidence"] is None
        assert len(run["alternatives"]) <= 2
        for other in run["alternatives"]:
            assert other["prefill_tokens"] == 0 and other["completion"] != run["completion"]
    assert all(not hole["runs"]["ar"]["alternatives"] for hole in results["holes"])
    summary = results["summary"]["confidence"]
    assert (
        summary["strategy"] == "hybrid" and summary["candidates"]["alternative_prefill_tokens"] == 0
    )
    assert "## Confidence floor" in (out / "report.md").read_text()

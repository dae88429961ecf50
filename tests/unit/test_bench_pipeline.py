"""The bench through the real Completer and engine, on tiny in-memory models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from quickdraft.bench.holes import sample_holes
from quickdraft.bench.runner import Bench, BenchOptions, make_peers, parse_strategies
from quickdraft.bench.session import Session
from quickdraft.config import load_config
from quickdraft.generation import CompletionRequest
from quickdraft.testing import build_tiny_int8_model, build_tiny_loaded_models, local_completer

OURS = ("ar", "ngram", "draft", "hybrid")


@pytest.fixture(scope="module")
def models():
    return build_tiny_loaded_models()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "geometry.py").write_text(
        "from .units import scale\n\n\ndef area(width, height):\n    product = width * height\n"
        "    return scale(product, 2)\n\n\ndef perimeter(width, height):\n"
        "    total = width + height\n    return scale(total, 2)\n"
    )
    (root / "lib" / "units.py").write_text(
        "def scale(value, factor):\n    result = value * factor\n    return result\n"
    )
    return root


def test_every_strategy_matches_ar_and_the_replay_reuses_the_cache(models, repo, tmp_path):
    config = load_config({"decoding": {"max_new_tokens": 10}})
    completer = local_completer(models, config)
    holes = sample_holes(repo, 3, seed=0)
    strategies = parse_strategies("ar,ngram,draft,hybrid,hf-prompt-lookup")
    options = BenchOptions(
        repo=repo,
        out=tmp_path / "out",
        holes=3,
        strategies=strategies,
        max_new_tokens=10,
        progress=False,
        sweep=[2],
    )
    results = Bench(completer, holes, options, peers=make_peers(completer, strategies, None)).run()
    assert len(results["holes"]) == 3
    for name in OURS:
        assert results["summary"][name]["identical_to_ar"] == 1.0, name
    path = "torch float64, cpu, growing KV cache"
    assert results["env"]["paths"] == {"": path}
    assert results["summary"]["identity_by_path"][path]["hybrid"]["rate"] == 1.0
    for hole in results["holes"]:
        assert hole["prompt_tokens"] > 0
        assert hole["runs"]["ar"]["tokens"], "tiny models still produce tokens"
        assert hole["runs"]["hf-prompt-lookup"]["identical_to_ar"] in (True, False)
    replay = json.loads((tmp_path / "out" / "replay.json").read_text())
    for record in replay["holes"]:
        assert record["cold"]["reused_tokens"] == 0
        for step in record["typed"]:
            assert step["reused_tokens"] > 0
            assert step["prefill_tokens"] < record["cold"]["prefill_tokens"]
    sweep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    for record in sweep["holes"]:
        ar = next(
            h
            for h in results["holes"]
            if h["file"] == record["file"]
            and h["line"] == record["line"]
            and h["col"] == record["col"]
        )
        for runs in record["runs"].values():
            assert runs["2"]["tokens"] == ar["runs"]["ar"]["tokens"]
    assert completer.documents == {}, "every document is closed afterwards"


def test_a_cold_start_forgets_earlier_completions(models, repo):
    # The layout does not matter here; on this hole the tiny model writes more than the
    # n-gram minimum with the classic one, so its completion is remembered.
    config = {"decoding": {"max_new_tokens": 10}, "context": {"layout": "classic"}}
    completer = local_completer(models, load_config(config))
    session = Session(completer)
    hole = sample_holes(repo, 1, seed=1)[0]
    session.open(hole)
    session.complete(hole, "ar")
    assert any(s.startswith("completion:") for s in completer.backend.engine.ngram.sources)
    session.reset_cache()
    assert not any(s.startswith("completion:") for s in completer.backend.engine.ngram.sources)
    ngram_sources = completer.backend.engine.ngram.sources
    assert any(s.startswith(hole.uri + "#") for s in ngram_sources)  # the documents stay indexed
    session.close()


def test_a_cold_start_forgets_the_runner_ups_kept_for_trees(models, repo):
    # Kept, the target's top tokens after each token of one strategy's answer would be the
    # next strategy's tree on the same hole: its answer, handed over.
    config = {"decoding": {"max_new_tokens": 10, "tree": 8}}
    vocab = len(models.tokenizer)  # trees are verified on the exact int8 path only
    int8 = dataclasses.replace(models, target=build_tiny_int8_model(vocab), draft=None)
    completer = local_completer(int8, load_config(config))
    session = Session(completer)
    hole = sample_holes(repo, 1, seed=1)[0]
    session.open(hole)
    session.complete(hole, "hybrid")
    recycled = completer.backend.engine.recycled
    assert len(recycled) > 0
    session.reset_cache()
    assert len(recycled) == 0
    session.close()


def test_peer_plan_is_the_request_complete_sends(models, repo):
    completer = local_completer(models, load_config({"decoding": {"max_new_tokens": 10}}))
    session = Session(completer)
    hole = sample_holes(repo, 1, seed=2)[0]
    session.open(hole)
    plan = session.plan(hole)
    request = CompletionRequest(hole.uri, hole.text, hole.line, hole.col, hole.language)
    assert plan.prompt_ids == completer.prepare(request).prompt_ids
    assert plan.max_new_tokens == 10
    assert plan.stop_ids == frozenset(models.stop_token_ids)
    ar = session.complete(hole, "ar")
    assert plan.finish(ar.tokens) == ar.completion
    session.close()

"""The bench loop against a fake Completer: schema, interleaving, replay, sweep, interrupts."""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quickdraft.bench import report
from quickdraft.bench.holes import sample_holes
from quickdraft.bench.peers import Peer, PeerCrashed, PeerOutput
from quickdraft.bench.runner import RUN_KEYS, Bench, BenchOptions, parse_lengths, parse_strategies
from quickdraft.config import QuickdraftConfig, load_config
from quickdraft.errors import ConfigError

# The schema, plus the open files and whether the hidden text stands in one of them.
HOLE_KEYS = {"file", "language", "line", "col", "kind", "prompt_tokens", "truth", "runs"} | {
    "open_files",
    "copied_from",
    "ar_copied_from",
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


@dataclass
class FakeStats:
    prompt_tokens: int
    prefill_tokens: int
    reused_tokens: int
    new_tokens: int
    target_forwards: int
    drafted_by_source: dict = field(default_factory=dict)
    accepted_by_source: dict = field(default_factory=dict)
    prefill_ms: float = 1.0
    decode_ms: float = 2.0
    total_ms: float = 3.0


@dataclass
class FakeCompletion:
    text: str
    tokens: list
    stats: FakeStats
    mode: str = "line"


@dataclass
class Asked:
    """One `complete` call as the fake saw it: the request, and the engine resets before it."""

    request: object
    strategy: str
    resets: int
    stats: FakeStats


class FakeBackend:
    """The local backend's cold start: KV cache and remembered completions gone."""

    def __init__(self) -> None:
        self.resets = 0
        self.cached: list[int] = []

    def reset_cache(self) -> None:
        self.resets += 1
        self.cached = []


class FakeCompleter:
    """Answers with the start of the hidden truth (read back from the file on disk), so every
    strategy agrees with `ar` and the first few holes match exactly."""

    def __init__(self, config: QuickdraftConfig, *, interrupt_after: int | None = None) -> None:
        self.config = config
        self.backend = FakeBackend()
        self.tokenizer = types.SimpleNamespace(
            encode=lambda text, **kw: list(text.encode()),
            decode=lambda ids, **kw: bytes(ids).decode("latin-1"),
        )
        self.documents: dict[str, tuple[str, str]] = {}
        self.models = types.SimpleNamespace(
            target=None,
            draft=object(),
            tokenizer=self.tokenizer,
            stop_token_ids={0},
            device="cpu",
            dtype="float64",
            describe=lambda: {"target": "fake", "draft": "fake"},
        )
        self.calls: list[tuple[str, str]] = []
        self.asked: list[Asked] = []
        self.interrupt_after = interrupt_after
        self.draft_lengths: list[int | None] = []

    def set_document(self, uri, text, language_id) -> None:
        self.documents[uri] = (text, language_id)

    def close_document(self, uri) -> None:
        self.documents.pop(uri, None)

    def refresh_documents(self) -> None:
        pass

    def build_prompt(self, request):
        lines = request.text.split("\n")
        offset = sum(len(x) + 1 for x in lines[: request.line]) + request.character
        prefix, suffix = request.text[:offset], request.text[offset:]
        return types.SimpleNamespace(text=prefix[-300:], prefix=prefix, suffix=suffix)

    def prepare(self, request, *, max_new_tokens=None):
        decode = self.tokenizer.decode
        return types.SimpleNamespace(
            prompt_ids=self.build_prompt_ids(request),
            max_new_tokens=max_new_tokens or self.config.max_new_tokens_for(request.language_id),
            stop_rule=lambda: None,
            finish=lambda tokens: (decode(tokens), decode(tokens)),
        )

    def build_prompt_ids(self, request) -> list[int]:
        return self.tokenizer.encode(self.build_prompt(request).text) or [1]

    def complete(self, request, *, strategy=None, max_new_tokens=None):
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt
        assert request.uri in self.documents, "the hole's document is open"
        assert self.documents[request.uri][0] == request.text
        self.calls.append((request.uri, strategy))
        self.draft_lengths.append(self.config.draft_length_for(request.language_id))
        original = Path(request.uri.removeprefix("file://")).read_text()
        lines = request.text.split("\n")
        offset = sum(len(x) + 1 for x in lines[: request.line]) + request.character
        typed = len(request.text) - len(original)  # the hole removed text: typed is negative
        rest = original[offset : offset - typed] if typed < 0 else ""
        text = rest[:12]
        prompt = self.build_prompt_ids(request)
        reused = 0
        for a, b in zip(self.backend.cached, prompt, strict=False):
            if a != b:
                break
            reused += 1
        self.backend.cached = prompt
        tokens = list(text.encode())
        forwards = len(tokens) if strategy == "ar" else max(1, len(tokens) // 3)
        drafted = {} if strategy == "ar" else {"ngram": 6, "draft": 3}
        accepted = {} if strategy == "ar" else {"ngram": 4, "draft": 1}
        stats = FakeStats(
            len(prompt), len(prompt) - reused, reused, len(tokens), forwards, drafted, accepted
        )
        self.asked.append(Asked(request, strategy, self.backend.resets, stats))
        return FakeCompletion(text, tokens, stats)


class FakePeer(Peer):
    name = "hf-prompt-lookup"

    def unavailable(self):
        return None

    def run(self, prompt_ids, max_new_tokens, stop_ids, stop):
        return PeerOutput(
            tokens=[65, 66], latency_ms=5.0, prefill_ms=1.0, decode_ms=4.0, target_forwards=2
        )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(
        "def area(width, height):\n    product = width * height\n    return abs(product)\n\n\n"
        "def main():\n    value = area(3, 4)\n    print(value, area(value, 2))\n"
    )
    (root / "pkg" / "b.py").write_text(
        "from .a import area\n\n\ndef double(x):\n    total = area(x, 2)\n    return total + total\n"
    )
    (root / "pkg" / "c.ts").write_text(
        'export function greet(name: string): string {\n  const base = "Hello, " + name;\n'
        "  return base.trim();\n}\n"
    )
    return root


def make_bench(repo, tmp_path, *, holes=4, strategies="ar,ngram,draft,hybrid", **kwargs):
    config = load_config({"decoding": {"max_new_tokens": 16}})
    completer = FakeCompleter(config, interrupt_after=kwargs.pop("interrupt_after", None))
    options = BenchOptions(
        repo=repo,
        out=tmp_path / "out",
        holes=holes,
        strategies=parse_strategies(strategies),
        max_new_tokens=16,
        progress=False,
        **kwargs,
    )
    sampled = sample_holes(repo, holes, seed=0)
    peers = {"hf-prompt-lookup": FakePeer()}
    return Bench(completer, sampled, options, peers=peers), completer


def test_results_json_has_exactly_the_schema(repo, tmp_path):
    bench, _ = make_bench(repo, tmp_path, strategies="ar,ngram,draft,hybrid,hf-prompt-lookup")
    bench.run()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results) == {"env", "holes", "summary"}
    for key in ("device", "dtype", "torch", "transformers", "models"):
        assert key in results["env"]
    assert len(results["holes"]) == 4
    for hole in results["holes"]:
        assert set(hole) == HOLE_KEYS
        assert list(hole["runs"]) == ["ar", "ngram", "draft", "hybrid", "hf-prompt-lookup"]
        for run in hole["runs"].values():
            assert set(run) == set(RUN_KEYS)
        for name in ("ar", "ngram", "draft", "hybrid"):
            assert hole["runs"][name]["identical_to_ar"] is True
        # The peer answered something else, and is reported as such.
        assert hole["runs"]["hf-prompt-lookup"]["identical_to_ar"] is False
        assert hole["runs"]["hf-prompt-lookup"]["completion"] == "AB"
    summary = results["summary"]
    assert set(summary) == {
        "ar",
        "ngram",
        "draft",
        "hybrid",
        "hf-prompt-lookup",
        "by_language",
        "copy_heavy",
        "model_copies",
        "identity_by_path",
        "confidence",
    }
    for name in ("ar", "ngram", "draft", "hybrid", "hf-prompt-lookup"):
        assert set(summary[name]) == SUMMARY_KEYS
    # The fake completer has no engine: its path is unnamed, the runtime mark stands in.
    assert results["env"]["paths"] == {"": None}
    assert set(summary["identity_by_path"]["variant default"]) == {"ngram", "draft", "hybrid"}
    assert summary["hybrid"]["identical_to_ar"] == 1.0
    assert summary["hf-prompt-lookup"]["identical_to_ar"] == 0.0
    assert summary["ar"]["speedup_vs_ar"] == 1.0
    assert summary["ar"]["tokens_per_forward"] == 1.0
    assert set(summary["by_language"]) == {"python", "typescript"}
    for per in summary["by_language"].values():
        for s in per.values():
            assert set(s) == SUMMARY_KEYS
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Per strategy" in report and "## Per language" in report
    assert (tmp_path / "out" / "latency_cdf.png").stat().st_size > 0
    assert (tmp_path / "out" / "speedup_by_language.png").stat().st_size > 0


def test_exact_match_is_against_the_hidden_truth(repo, tmp_path):
    bench, _ = make_bench(repo, tmp_path, holes=6)
    results = bench.run()
    for hole in results["holes"]:
        run = hole["runs"]["ar"]
        assert run["completion"] == hole["truth"][:12]
        assert run["exact_match"] is (len(hole["truth"].rstrip()) <= 12)


def test_strategies_interleave_and_start_cold(repo, tmp_path):
    bench, completer = make_bench(repo, tmp_path, replay=False, warmup=False)
    bench.run()
    per_hole: dict[str, list[str]] = {}
    for uri, strategy in completer.calls:
        per_hole.setdefault(uri, []).append(strategy)
    orders = [tuple(calls) for calls in per_hole.values()]
    firsts = [order[0] for order in orders]
    assert len(set(firsts)) > 1, "the strategy order rotates from hole to hole"
    assert completer.backend.resets == len(completer.calls)


def test_keystroke_replay_types_into_the_cold_runs_cache(repo, tmp_path):
    bench, completer = make_bench(repo, tmp_path, holes=3)
    bench.run()
    replay = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert replay["strategy"] == "hybrid"
    holes = {(hole.file, hole.line, hole.col): hole for hole in bench.holes}
    assert len(replay["holes"]) == len(holes)
    for record in replay["holes"]:
        hole = holes[(record["file"], record["line"], record["col"])]
        typed = [chars for chars in (1, 3) if len(hole.truth) > chars]
        assert [step["chars"] for step in record["typed"]] == typed
        # The primary's run of the hole (a reset just before it), then one request per typed
        # step right after it, with nothing reset in between: the replay keeps the cache.
        asked = completer.asked
        at = max(
            i
            for i, a in enumerate(asked)
            if a.request.uri == hole.uri and a.strategy == "hybrid" and a.request.text == hole.text
        )
        cold, steps = asked[at], asked[at + 1 : at + 1 + len(typed)]
        assert cold.resets == asked[at - 1].resets + 1
        assert record["cold"]["reused_tokens"] == cold.stats.reused_tokens
        assert record["cold"]["prefill_tokens"] == cold.stats.prefill_tokens
        for step, chars, asked_step in zip(record["typed"], typed, steps, strict=True):
            assert asked_step.strategy == "hybrid"
            assert asked_step.resets == cold.resets
            text, line, col = hole.typed(chars)
            assert asked_step.request.text == text
            assert (asked_step.request.line, asked_step.request.character) == (line, col)
            # What the engine reported for that request is what the replay records.
            assert step["reused_tokens"] == asked_step.stats.reused_tokens
            assert step["prefill_tokens"] == asked_step.stats.prefill_tokens
            assert step["prompt_tokens"] == asked_step.stats.prompt_tokens
            assert step["new_tokens"] == asked_step.stats.new_tokens
    assert "Keystroke replay" in (tmp_path / "out" / "report.md").read_text()


def test_sweep_writes_a_loadable_config_snippet(repo, tmp_path):
    bench, completer = make_bench(repo, tmp_path, holes=3, sweep=[1, 4], replay=False)
    bench.run()
    out = tmp_path / "out"
    snippet = json.loads((out / "draft_length.json").read_text())
    sweep = json.loads((out / "sweep.json").read_text())
    # The snippet is the sweep's recommendation (how that is chosen: test_bench_report), for
    # every language swept, and it loads as configuration.
    assert snippet == report.config_snippet(sweep)
    assert set(snippet["languages"]) == {hole["language"] for hole in sweep["holes"]}
    config = load_config(snippet)
    for language, lang in snippet["languages"].items():
        assert config.draft_length_for(language) == lang["draft_length"]
    assert set(sweep["summary"]["python"]) == {"ngram", "draft", "hybrid"}
    assert set(sweep["summary"]["python"]["hybrid"]) == {"1", "4", "adaptive"}
    assert {1, 4} <= set(completer.draft_lengths)
    assert completer.config.draft_length_for("python") is None, "the sweep restores the config"
    assert (out / "acceptance_vs_draft_length.png").exists()
    assert "Draft-length sweep" in (out / "report.md").read_text()


def test_interrupt_keeps_finished_holes(repo, tmp_path):
    # 4 strategies per hole, no warm-up or replay: the 10th call is in the third hole.
    bench, _ = make_bench(repo, tmp_path, holes=4, warmup=False, replay=False, interrupt_after=9)
    with pytest.raises(KeyboardInterrupt):
        bench.run()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results["holes"]) == 2
    assert results["env"]["interrupted"] is True
    assert set(results["summary"]["ar"]) == SUMMARY_KEYS
    assert "interrupted" in (tmp_path / "out" / "report.md").read_text()


def test_unavailable_strategies_are_skipped_with_a_reason(repo, tmp_path):
    bench, _ = make_bench(repo, tmp_path, holes=2, strategies="ar,hybrid,hf-assisted,llama-cpp")
    results = bench.run()
    skipped = results["env"]["skipped"]
    assert set(skipped) == {"hf-assisted", "llama-cpp"}
    assert all(isinstance(reason, str) and reason for reason in skipped.values())
    assert list(results["holes"][0]["runs"]) == ["ar", "hybrid"]
    assert "skipped" in (tmp_path / "out" / "report.md").read_text()


def test_option_parsing():
    assert parse_strategies("hybrid,ngram")[0] == "ar"
    assert parse_strategies(None)[:4] == ["ar", "ngram", "draft", "hybrid"]
    with pytest.raises(ConfigError, match="beam"):
        parse_strategies("ar,beam")
    assert parse_lengths("8,1,2,2") == [1, 2, 8]
    assert parse_lengths(None) is None
    with pytest.raises(ConfigError):
        parse_lengths("0,2")
    with pytest.raises(ConfigError):
        parse_lengths("two")


class CrashingPeer(Peer):
    """A peer whose process dies at its first run (llama.cpp's AMX crash, say)."""

    name = "llama-cpp"

    def __init__(self) -> None:
        self.runs = 0
        self.closed = False

    def unavailable(self):
        return None

    def note(self):
        return "`llama-cpp` ran without llama.cpp's extra (AMX) buffers"

    def run(self, prompt_ids, max_new_tokens, stop_ids, stop):
        self.runs += 1
        raise PeerCrashed("the llama.cpp peer's process crashed (signal 11)")

    def close(self):
        self.closed = True


@pytest.mark.parametrize("warmup", [True, False])
def test_a_peer_that_crashes_never_takes_the_bench_down(repo, tmp_path, warmup):
    config = load_config({"decoding": {"max_new_tokens": 16}})
    options = BenchOptions(
        repo=repo,
        out=tmp_path / "out",
        holes=3,
        strategies=parse_strategies("ar,hybrid,llama-cpp"),
        max_new_tokens=16,
        progress=False,
        warmup=warmup,
        replay=False,
    )
    peer = CrashingPeer()
    bench = Bench(
        FakeCompleter(config), sample_holes(repo, 3, seed=0), options, peers={"llama-cpp": peer}
    )
    results = bench.run()
    assert peer.runs == 1  # dropped after its crash, on the first hole or in the warm-up
    assert peer.closed
    assert len(results["holes"]) == 3
    assert all(list(hole["runs"]) == ["ar", "hybrid"] for hole in results["holes"])
    skipped = results["env"]["skipped"]["llama-cpp"]
    assert "signal 11" in skipped and ("warm-up" in skipped) == warmup
    assert "extra (AMX) buffers" in " ".join(results["env"]["notes"])
    report_text = (tmp_path / "out" / "report.md").read_text()
    assert "signal 11" in report_text and "extra (AMX) buffers" in report_text

"""The bench loop: every strategy on every hole, interleaved, written as it goes.

Order is hole-major with the strategy order rotated from one hole to the next, so slow moments of
a shared machine fall on every strategy alike. Each strategy's run of a hole starts from a cold KV
cache. After the primary strategy's run (`hybrid` when it is in the run) the same hole is asked
again after typing 1 and 3 characters of the truth, keeping the cache: the keystroke replay.

Results are rewritten after every hole (atomically), and an interrupt (Ctrl-C) writes the report
for the holes that finished before it ends the command.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from quickdraft.bench import report
from quickdraft.bench.confidence_report import render_confidence, summarize_confidence
from quickdraft.bench.holes import Hole
from quickdraft.bench.peers import PEERS, HFPeer, LlamaCppPeer, Peer
from quickdraft.bench.provenance import peak_memory, provenance
from quickdraft.bench.session import Outcome, Session
from quickdraft.bench.variants import baseline_of, split_variant
from quickdraft.config import STRATEGIES
from quickdraft.errors import ConfigError, QuickdraftError
from quickdraft.models.store import write_json_atomic

REMOTE = "remote"
"""A serving engine (`--remote-url`) through the same `Completer` pipeline (quickdraft.remote)."""

ALL_STRATEGIES: tuple[str, ...] = (*STRATEGIES, *PEERS, REMOTE)
DRAFTING = ("ngram", "draft", "hybrid")
REPLAY_TYPED = (1, 3)
RUN_KEYS = (
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
)


def parse_strategies(value: str | None) -> list[str]:
    if not value:
        return list(ALL_STRATEGIES)
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL_STRATEGIES]
    if unknown:
        raise ConfigError(
            f"--strategies: unknown {', '.join(unknown)} (known: {', '.join(ALL_STRATEGIES)})"
        )
    if "ar" not in names:
        names.insert(0, "ar")  # the baseline every comparison needs
    return list(dict.fromkeys(names))


def parse_lengths(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        lengths = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(
            f"--sweep-draft-length: expected numbers like 1,2,4,8, got {value!r}"
        ) from None
    if not lengths or lengths[0] < 1 or lengths[-1] > 64:
        raise ConfigError(f"--sweep-draft-length: lengths must be between 1 and 64, got {value!r}")
    return lengths


@dataclass
class BenchOptions:
    repo: Path
    out: Path
    holes: int = 24
    languages: list[str] | None = None
    strategies: list[str] = field(default_factory=lambda: list(ALL_STRATEGIES))
    max_new_tokens: int = 64
    seed: int = 0
    sweep: list[int] | None = None
    replay: bool = True
    candidates: int = 1
    """Suggestions asked per hole of the primary strategy (`Completer.alternatives` after the
    first): which of them was right, and what the others cost."""
    warmup: bool = True
    progress: bool = True


def describe_environment(completer: Any, options: BenchOptions) -> dict[str, Any]:
    import torch  # torch and transformers are heavy: `quickdraft serve` imports this module

    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:  # pragma: no cover
        transformers_version = None

    models = getattr(completer, "models", None)
    described: Any = None
    if models is not None:
        describe = getattr(models, "describe", None)
        described = describe() if callable(describe) else None
    config = getattr(completer, "config", None)
    env: dict[str, Any] = {
        "device": str(getattr(models, "device", "cpu")),
        "dtype": str(getattr(models, "dtype", "")),
        "torch": torch.__version__,
        "transformers": transformers_version,
        **provenance(),
        "torch_threads": torch.get_num_threads(),
        "models": described,
        "preset": getattr(models, "preset", None) and getattr(models.preset, "name", models.preset),
        "repo": str(options.repo),
        "seed": options.seed,
        "holes_requested": options.holes,
        "max_new_tokens": options.max_new_tokens,
        "strategies": list(options.strategies),
        "sweep_draft_lengths": options.sweep,
        "decoding": dataclasses.asdict(config.decoding) if config is not None else None,
        "context": dataclasses.asdict(config.context) if config is not None else None,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "interrupted": False,
        "skipped": {},
        "peers": {},
        "notes": [],
    }
    return env


def make_peers(completer: Any, strategies: list[str], gguf_path: str | None) -> dict[str, Peer]:
    models = getattr(completer, "models", None)
    target = getattr(models, "target", None)
    draft = getattr(models, "draft", None)
    tokenizer = getattr(models, "tokenizer", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    threads = getattr(models, "threads", None)
    peers: dict[str, Peer] = {}
    for name in strategies:
        if name in ("hf-assisted", "hf-prompt-lookup"):
            peers[name] = HFPeer(
                name, target, draft if name == "hf-assisted" else None, pad_token_id=pad
            )
        elif name in ("llama-cpp", "llama-cpp-lookup"):
            peers[name] = LlamaCppPeer(name, gguf_path, threads=threads)
    return peers


def _run_record(outcome: Outcome, truth: str) -> dict[str, Any]:
    alternatives = [
        {
            **other,
            "exact_match": report.exact_match(other["completion"], truth),
            "prefix_match": report.prefix_match(other["completion"], truth),
        }
        for other in outcome.extra.get("alternatives") or ()
    ]
    return {
        "completion": outcome.completion,
        "tokens": outcome.tokens,
        "latency_ms": round(outcome.latency_ms, 3),
        "prefill_ms": None if outcome.prefill_ms is None else round(outcome.prefill_ms, 3),
        "decode_ms": None if outcome.decode_ms is None else round(outcome.decode_ms, 3),
        "new_tokens": outcome.new_tokens,
        "target_forwards": outcome.target_forwards,
        "accepted_by_source": outcome.accepted_by_source,
        "drafted_by_source": outcome.drafted_by_source,
        "stages_ms": outcome.stages_ms,
        "repeated": outcome.repeated,
        "repeat_trimmed": outcome.repeat_trimmed,
        "identical_to_ar": None,
        "exact_match": report.exact_match(outcome.completion, truth),
        "prefix_match": report.prefix_match(outcome.completion, truth),
        "confidence": outcome.extra.get("confidence"),
        "line_confidence": outcome.extra.get("line_confidence"),
        "alternatives": alternatives,
    }


class Bench:
    """Runs the holes through a `Completer` (and the peers) and writes `options.out`."""

    def __init__(
        self,
        completer: Any,
        holes: list[Hole],
        options: BenchOptions,
        *,
        peers: dict[str, Peer] | None = None,
        env: dict[str, Any] | None = None,
        remote: Any | None = None,
        variants: dict[str, Any] | None = None,
    ) -> None:
        self.session = Session(completer)
        self.remote = Session(remote) if remote is not None else None
        """The `remote` strategy's Completer (over a `quickdraft.remote.RemoteBackend`)."""
        self.variants = {name: Session(other) for name, other in (variants or {}).items()}
        """Completers of further variants (`hybrid@llamacpp` runs on `variants["llamacpp"]`)."""
        self.completer = completer
        self.holes = holes
        self.options = options
        self.env = env if env is not None else describe_environment(completer, options)
        if self.variants:
            self.env["variants"] = {
                name: {
                    "models": session.completer.models.describe(),
                    "layout": session.completer.config.context.layout,
                    "tree": session.completer.config.decoding.tree,
                }
                for name, session in self.variants.items()
            }
        # The compute path of each runtime ("" is the first): identity with `ar` is a property
        # of the path (batch-invariant or not), so the report names it.
        self.env["paths"] = {
            name: getattr(session.completer, "compute_path", None)
            for name, session in (("", self.session), *self.variants.items())
        }
        self.peers = peers if peers is not None else make_peers(completer, options.strategies, None)
        self.records: list[dict[str, Any]] = []
        self.replay_records: list[dict[str, Any]] = []
        self.sweep_records: list[dict[str, Any]] = []
        self.strategies = self._usable_strategies()
        ours = [s for s in self.strategies if s in STRATEGIES]
        self.primary = next((s for s in ("hybrid", "ngram", "draft") if s in ours), None)
        self.out = Path(options.out)

    # --- which strategies can run ------------------------------------------------------

    def _skip(self, name: str, reason: str) -> None:
        self.env["skipped"][name] = reason

    def _usable_strategies(self) -> list[str]:
        usable = []
        models = getattr(self.completer, "models", None)
        has_draft = getattr(models, "draft", None) is not None
        for name in self.options.strategies:
            strategy, variant = split_variant(name)
            if variant is not None:
                if variant not in self.variants:
                    self._skip(name, f"the variant {variant} is not loaded")
                    continue
                if strategy == "draft" and self.variants[variant].completer.models.draft is None:
                    self._skip(name, f"no draft model is loaded in {variant}")
                    continue
            elif name == "draft" and not has_draft:
                self._skip(name, "no draft model is loaded")
                continue
            if name == REMOTE:
                reason, described = self._remote_state()
                if reason:
                    self._skip(name, reason)
                    continue
                self.env["peers"][name] = described
            if name in PEERS:
                peer = self.peers.get(name)
                reason = "not set up" if peer is None else peer.unavailable()
                if reason:
                    self._skip(name, reason)
                    continue
                self.env["peers"][name] = peer.describe()
                note = peer.note()
                if note:
                    self.env["notes"].append(note)
            usable.append(name)
        return usable

    def _remote_state(self) -> tuple[str | None, dict[str, Any]]:
        """(why the remote strategy cannot run or None, what the engine is)."""
        if self.remote is None:
            return "no serving engine given (--remote-url URL)", {}
        generator = self.remote.completer.backend.generator
        if generator.status.unavailable:
            return generator.status.message, {}
        return None, generator.describe()

    def _sessions(self) -> list[Session]:
        others = [self.remote] if self.remote is not None else []
        return [self.session, *self.variants.values(), *others]

    def _open(self, hole: Hole) -> None:
        for session in self._sessions():
            session.open(hole)

    def _close(self) -> None:
        for session in self._sessions():
            session.close()

    def _engine_session(self, name: str) -> tuple[Session, str] | None:
        """The session and engine strategy that run `name` (None: a peer or the remote)."""
        strategy, variant = split_variant(name)
        if strategy not in STRATEGIES:
            return None
        return (self.session if variant is None else self.variants[variant]), strategy

    # --- the loop ------------------------------------------------------------------------

    def _order(self, index: int) -> list[str]:
        shift = index % len(self.strategies)
        return self.strategies[shift:] + self.strategies[:shift]

    def _units_per_hole(self) -> int:
        units = len(self.strategies)
        if self.options.replay and self.primary:
            units += len(REPLAY_TYPED)
        if self.options.sweep:
            units += len(self.options.sweep) * len([s for s in self.strategies if s in DRAFTING])
        return units

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        bar = None
        if self.options.progress:
            bar = tqdm(
                total=len(self.holes) * self._units_per_hole(),
                unit="run",
                desc="bench",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        interrupted = False
        try:
            if self.options.warmup and self.holes:
                if bar is not None:
                    bar.set_postfix_str("warm-up")
                self._warmup(self.holes[0])
            for index, hole in enumerate(self.holes):
                if bar is not None:
                    bar.set_postfix_str(f"{hole.file}:{hole.line + 1} {hole.kind}")
                record = self._run_hole(index, hole, bar)
                if record is not None:
                    self.records.append(record)
                self._write(final=False)
        except KeyboardInterrupt:
            interrupted = True
            self.env["interrupted"] = True
        finally:
            self._close()
            for peer in self.peers.values():
                peer.close()
            if bar is not None:
                bar.close()
            results = self._write(final=True)
        if interrupted:
            raise KeyboardInterrupt
        return results

    def _warmup(self, hole: Hole) -> None:
        """One short untimed run per strategy: kernels, allocator and caches settle first."""
        budget = min(8, self.options.max_new_tokens)
        self._open(hole)
        try:
            plan = None
            for name in list(self.strategies):
                engine = self._engine_session(name)
                if engine is not None:
                    engine[0].reset_cache()
                    engine[0].complete(hole, engine[1], max_new_tokens=budget)
                elif name == REMOTE:
                    self.remote.complete(hole, name, max_new_tokens=budget)
                else:
                    plan = plan or self.session.plan(hole, max_new_tokens=budget)
                    try:
                        self.peers[name].run(
                            plan.prompt_ids, plan.max_new_tokens, plan.stop_ids, plan.new_stop()
                        )
                    except Exception as exc:  # a peer that breaks leaves the run, with a note
                        self._skip(name, f"failed in the warm-up: {type(exc).__name__}: {exc}")
                        self.strategies.remove(name)
        finally:
            for session in (self.session, *self.variants.values()):
                session.reset_cache()
            self._close()

    def _run_hole(self, index: int, hole: Hole, bar) -> dict[str, Any] | None:
        self._open(hole)
        runs: dict[str, dict[str, Any]] = {}
        plan = None
        prompt_tokens = None
        try:
            for name in self._order(index):
                if name not in self.strategies:
                    continue  # dropped after a failure on an earlier hole
                engine = self._engine_session(name)
                try:
                    if engine is not None:
                        engine[0].reset_cache()
                        candidates = self.options.candidates if name == self.primary else 1
                        outcome = engine[0].complete(hole, engine[1], candidates=candidates)
                        prompt_tokens = prompt_tokens or outcome.prompt_tokens
                    elif name == REMOTE:
                        outcome = self.remote.complete(hole, name)
                    else:
                        plan = plan or self.session.plan(hole)
                        outcome = self._run_peer(name, plan)
                        prompt_tokens = prompt_tokens or len(plan.prompt_ids)
                except Exception as exc:
                    # A peer that breaks, or one of ours the models cannot do, leaves the run
                    # with a note; `ar` is the baseline and a failure there ends the bench.
                    if name == "ar" or (
                        engine is not None and not isinstance(exc, QuickdraftError)
                    ):
                        raise
                    self._skip(
                        name, f"failed on {hole.file}:{hole.line + 1}: {type(exc).__name__}: {exc}"
                    )
                    self.strategies.remove(name)
                    continue
                finally:
                    if bar is not None:
                        bar.update(1)
                runs[name] = _run_record(outcome, hole.truth)
                if name == self.primary and self.options.replay:
                    self._replay(hole, outcome, bar)
            if self.options.sweep:
                self._sweep(index, hole, bar)
        finally:
            self._close()
        first_ar = runs.get("ar")
        for name, run in runs.items():
            baseline = runs.get(baseline_of(name))
            run["identical_to_ar"] = (
                None if baseline is None else run["tokens"] == baseline["tokens"]
            )
            if self.variants and first_ar is not None:
                run["same_text_as_ar"] = run["completion"] == first_ar["completion"]
        ordered = {name: runs[name] for name in self.options.strategies if name in runs}
        return {
            **hole.to_dict(),
            # Where plain decoding's own output stands in an open file: the model copies.
            "ar_copied_from": hole.open_file_with(runs["ar"]["completion"]),
            "prompt_tokens": prompt_tokens,
            "truth": hole.truth,
            "runs": ordered,
        }

    def _run_peer(self, name: str, plan) -> Outcome:
        out = self.peers[name].run(
            plan.prompt_ids, plan.max_new_tokens, plan.stop_ids, plan.new_stop()
        )
        return Outcome(
            completion=plan.finish(out.tokens),
            tokens=out.tokens,
            latency_ms=out.latency_ms + plan.build_ms,
            prefill_ms=out.prefill_ms,
            decode_ms=out.decode_ms,
            new_tokens=len(out.tokens),
            target_forwards=out.target_forwards,
            accepted_by_source=None,
            drafted_by_source=None,
            prompt_tokens=len(plan.prompt_ids),
        )

    # --- keystroke replay ----------------------------------------------------------------

    def _replay(self, hole: Hole, cold: Outcome, bar) -> None:
        steps = []
        for typed in REPLAY_TYPED:
            if len(hole.truth) <= typed:
                if bar is not None:
                    bar.update(1)
                continue
            outcome = self.session.complete(hole, self.primary, typed=typed)
            if bar is not None:
                bar.update(1)
            steps.append(
                {
                    "chars": typed,
                    "latency_ms": round(outcome.latency_ms, 3),
                    "prefill_ms": outcome.prefill_ms,
                    "prompt_tokens": outcome.prompt_tokens,
                    "reused_tokens": outcome.reused_tokens,
                    "prefill_tokens": outcome.prefill_tokens,
                    "new_tokens": outcome.new_tokens,
                    "exact_match": report.exact_match(outcome.completion, hole.truth[typed:]),
                }
            )
        self.replay_records.append(
            {
                "file": hole.file,
                "language": hole.language,
                "line": hole.line,
                "col": hole.col,
                "strategy": self.primary,
                "cold": {
                    "chars": 0,
                    "latency_ms": round(cold.latency_ms, 3),
                    "prefill_ms": cold.prefill_ms,
                    "prompt_tokens": cold.prompt_tokens,
                    "reused_tokens": cold.reused_tokens,
                    "prefill_tokens": cold.prefill_tokens,
                    "new_tokens": cold.new_tokens,
                },
                "typed": steps,
            }
        )

    # --- draft-length sweep --------------------------------------------------------------

    def _sweep(self, index: int, hole: Hole, bar) -> None:
        drafting = [s for s in self.strategies if s in DRAFTING]
        cells = [(s, k) for s in drafting for k in self.options.sweep]
        shift = index % len(cells) if cells else 0
        runs: dict[str, dict[str, Any]] = {}
        try:
            for strategy, length in cells[shift:] + cells[:shift]:
                self.session.set_draft_length(hole.language, length)
                self.session.reset_cache()
                outcome = self.session.complete(hole, strategy)
                if bar is not None:
                    bar.update(1)
                runs.setdefault(strategy, {})[str(length)] = {
                    "latency_ms": round(outcome.latency_ms, 3),
                    "tokens": outcome.tokens,
                    "new_tokens": outcome.new_tokens,
                    "target_forwards": outcome.target_forwards,
                    "drafted_by_source": outcome.drafted_by_source,
                    "accepted_by_source": outcome.accepted_by_source,
                }
        finally:
            self.session.set_draft_length(hole.language, None)
        self.sweep_records.append(
            {
                "file": hole.file,
                "language": hole.language,
                "line": hole.line,
                "col": hole.col,
                "runs": {
                    s: dict(sorted(r.items(), key=lambda kv: int(kv[0]))) for s, r in runs.items()
                },
            }
        )

    # --- output --------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        summary = report.summarize(self.records, self.env.get("paths"))
        summary["confidence"] = summarize_confidence(self.records, self.primary)
        return {"env": self.env, "holes": self.records, "summary": summary}

    def _write(self, *, final: bool) -> dict[str, Any]:
        self.env["holes_finished"] = len(self.records)
        self.env.update(peak_memory())
        if final:
            self.env["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        results = self.results()
        write_json_atomic(self.out / "results.json", results)
        replay = None
        if self.replay_records:
            replay = {
                "strategy": self.primary,
                "holes": self.replay_records,
                "summary": report.summarize_replay(self.replay_records),
            }
            write_json_atomic(self.out / "replay.json", replay)
        sweep = None
        if self.sweep_records:
            sweep = report.summarize_sweep(self.sweep_records, self.records, self.primary)
            sweep["holes"] = self.sweep_records
            write_json_atomic(self.out / "sweep.json", sweep)
            if sweep["best"]:
                write_json_atomic(self.out / "draft_length.json", report.config_snippet(sweep))
        if final:
            plots = report.write_plots(self.out, results, sweep)
            markdown = report.render_markdown(
                results,
                replay=replay,
                sweep=sweep,
                plots=plots,
                extra=render_confidence(results["summary"]["confidence"]),
            )
            (self.out / "report.md").write_text(markdown, encoding="utf-8")
        return results

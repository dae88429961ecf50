"""Numbers from the bench's raw runs: the summary in results.json, report.md and the plots.

Everything here is a pure function of the recorded holes (and, for the optional parts, the
keystroke replay and the draft-length sweep), so a report can be regenerated from results.json.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quickdraft.bench.variants import split_variant
from quickdraft.config import DRAFT_MODEL_STRATEGIES, STRATEGIES

PEER_NAMES = ("hf-assisted", "hf-prompt-lookup", "llama-cpp", "llama-cpp-lookup")
FIRST_TOKEN_TIMED = (*PEER_NAMES, "remote")
"""Strategies whose "prefill" is the time to their first token (which it therefore includes)."""

GROUPS = ("by_language", "copy_heavy", "model_copies", "identity_by_path", "confidence")
"""Keys of results.json's summary that hold groups of holes (or, `confidence`, a table over
them: bench/confidence_report.py) rather than one strategy."""

SUMMARY_KEYS = (
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
)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def prefix_match(completion: str, truth: str) -> bool:
    """A non-empty completion the user could accept as it is: the truth starts with it."""
    body = completion.rstrip()
    return bool(body.strip()) and truth.startswith(body)


def exact_match(completion: str, truth: str) -> bool:
    return completion.rstrip() == truth.rstrip()


def strategies_in(holes: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for hole in holes:
        for name in hole["runs"]:
            if name not in seen:
                seen.append(name)
    return seen


STAGES = ("context_ms", "tokenize_ms", "index_ms", "prefill_ms", "decode_ms", "postprocess_ms")
"""The pipeline's stages, in order (`Completion.stages`)."""


def stage_medians(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median of each stage over runs that were timed per stage (None: no such run)."""
    timed = [run["stages_ms"] for run in runs if run.get("stages_ms")]
    if not timed:
        return None
    return {
        stage: _rounded(statistics.median(t.get(stage, 0.0) for t in timed)) for stage in STAGES
    }


def summarize_strategy(holes: list[dict[str, Any]], strategy: str) -> dict[str, Any]:
    runs = [hole["runs"][strategy] for hole in holes if strategy in hole["runs"]]
    latencies = [run["latency_ms"] for run in runs]
    forwards = [run for run in runs if run.get("target_forwards")]
    tokens_per_forward = (
        sum(run["new_tokens"] for run in forwards) / sum(run["target_forwards"] for run in forwards)
        if forwards
        else None
    )
    ratios = [
        hole["runs"]["ar"]["latency_ms"] / hole["runs"][strategy]["latency_ms"]
        for hole in holes
        if strategy in hole["runs"]
        and "ar" in hole["runs"]
        and hole["runs"][strategy]["latency_ms"] > 0
    ]
    identical = [run["identical_to_ar"] for run in runs if run.get("identical_to_ar") is not None]
    same_text = [run["same_text_as_ar"] for run in runs if run.get("same_text_as_ar") is not None]
    return {
        "p50_ms": _rounded(percentile(latencies, 50)),
        "p90_ms": _rounded(percentile(latencies, 90)),
        "p99_ms": _rounded(percentile(latencies, 99)),
        "tokens_per_forward": _rounded(tokens_per_forward),
        "speedup_vs_ar": _rounded(statistics.median(ratios)) if ratios else None,
        "identical_to_ar": _rounded(sum(identical) / len(identical)) if identical else None,
        "same_text_as_ar": _rounded(sum(same_text) / len(same_text)) if same_text else None,
        "exact_match": _rounded(sum(run["exact_match"] for run in runs) / len(runs))
        if runs
        else None,
        "stages_p50_ms": stage_medians(runs),
        "repeated": _share(runs, "repeated"),
        "repeat_trimmed": _share(runs, "repeat_trimmed"),
    }


def _share(runs: list[dict[str, Any]], key: str) -> float | None:
    """The share of runs where `key` is true, among those that judged it."""
    judged = [run[key] for run in runs if run.get(key) is not None]
    return _rounded(sum(judged) / len(judged)) if judged else None


def render_repeats(holes: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """How often each strategy's raw output re-typed existing code, and how often cutting it
    changed what was shown."""
    rows = [
        [f"`{name}`", _pct(summary[name]["repeated"]), _pct(summary[name]["repeat_trimmed"])]
        for name in strategies_in(holes)
        if (summary.get(name) or {}).get("repeated") is not None
    ]
    if not rows:
        return []
    return [
        "## Repeats of existing code",
        "",
        *_table(["strategy", "raw output repeated the next line", "shown text changed"], rows),
        "",
        "A suggestion never repeats what the document already has: the stop rule cuts a line"
        " that is the suffix's next line, and suggests nothing when the cursor's line, completed,"
        " would be that line. Shown text changed: without the rule the repeat would have been"
        " shown.",
        "",
    ]


def render_stages(holes: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """Where each strategy's time goes: the median of every pipeline stage."""
    rows = []
    for name in strategies_in(holes):
        stages = (summary.get(name) or {}).get("stages_p50_ms")
        if stages:
            rows.append([f"`{name}`", *(_ms(stages[stage]) for stage in STAGES)])
    if not rows:
        return []
    header = ["strategy", *(stage.removesuffix("_ms") for stage in STAGES)]
    return [
        "## Where the time goes",
        "",
        *_table(header, rows),
        "",
        "Medians over holes, in ms, of each stage of `Completer.complete`: the prompt and the"
        " cursor's context, tokenizing (with the continuation lookup), indexing open documents"
        " for n-gram drafting, the engine's prefill, decoding (the rest of generation), and"
        " post-processing. Peers are timed whole, so they have no row.",
        "",
    ]


def identity_by_path(
    holes: list[dict[str, Any]], paths: dict[str, str | None] | None
) -> dict[str, dict[str, Any]]:
    """Identity with `ar` per compute path (runtime, dtype, device, KV cache; `paths` maps a
    variant, "" for the first, to its path's name) and engine strategy:
    {path: {strategy: {"identical", "holes", "rate"}}}. Identity is a property of the path:
    exact where its forward is batch-invariant, measured elsewhere."""
    out: dict[str, dict[str, Any]] = {}
    for name in strategies_in(holes):
        strategy, variant = split_variant(name)
        if strategy not in ENGINE_STRATEGIES or strategy == "ar":
            continue
        values = [
            hole["runs"][name]["identical_to_ar"]
            for hole in holes
            if name in hole["runs"] and hole["runs"][name].get("identical_to_ar") is not None
        ]
        if not values:
            continue
        path = (paths or {}).get(variant or "") or f"variant {variant or 'default'}"
        if variant and path == (paths or {}).get(""):
            path = f"{path} @{variant}"  # a layout variant on the same path: rates kept apart
        out.setdefault(path, {})[strategy] = {
            "identical": sum(values),
            "holes": len(values),
            "rate": _rounded(sum(values) / len(values)),
        }
    return out


def summarize(
    holes: list[dict[str, Any]], paths: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """results.json's `summary`: per strategy, per language then strategy, per strategy
    over the holes whose hidden text (`copy_heavy`) or whose `ar` output (`model_copies`)
    stands verbatim in an open file, and identity with `ar` per compute path (`paths`: see
    `identity_by_path`)."""
    summary: dict[str, Any] = {}
    for strategy in strategies_in(holes):
        summary[strategy] = summarize_strategy(holes, strategy)
    by_language: dict[str, Any] = {}
    for language in sorted({hole["language"] for hole in holes}):
        subset = [hole for hole in holes if hole["language"] == language]
        by_language[language] = {s: summarize_strategy(subset, s) for s in strategies_in(subset)}
    summary["by_language"] = by_language
    for key, field in (("copy_heavy", "copied_from"), ("model_copies", "ar_copied_from")):
        subset = [hole for hole in holes if hole.get(field)]
        summary[key] = {
            s: {**summarize_strategy(subset, s), "holes": len(subset)}
            for s in strategies_in(subset)
        }
    summary["identity_by_path"] = identity_by_path(holes, paths)
    return summary


# --- details for the report (not in results.json's summary, derived from its holes) ----------


def details(holes: list[dict[str, Any]], strategy: str) -> dict[str, Any]:
    runs = [(hole, hole["runs"][strategy]) for hole in holes if strategy in hole["runs"]]
    prefill = [run["prefill_ms"] for _, run in runs if run.get("prefill_ms") is not None]
    decode_runs = [run for _, run in runs if run.get("decode_ms")]
    # The engine's prefill emits no token (its first decode forward does); a peer's "prefill"
    # is its time to the first token, so that token is not part of its decode rate.
    first = 1 if strategy in FIRST_TOKEN_TIMED else 0
    decode_ms = sum(run["decode_ms"] for run in decode_runs)
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for _, run in runs:
        for source, count in (run.get("drafted_by_source") or {}).items():
            drafted[source] = drafted.get(source, 0) + count
        for source, count in (run.get("accepted_by_source") or {}).items():
            accepted[source] = accepted.get(source, 0) + count
    return {
        "holes": len(runs),
        "prefill_ms_p50": percentile(prefill, 50),
        "decode_tokens_per_s": (
            sum(run["new_tokens"] - first for run in decode_runs) / (decode_ms / 1000)
            if decode_ms
            else None
        ),
        "new_tokens_mean": statistics.mean(run["new_tokens"] for _, run in runs) if runs else None,
        "drafted": drafted,
        "accepted": accepted,
        "prefix_match": (
            sum(prefix_match(run["completion"], hole["truth"]) for hole, run in runs) / len(runs)
            if runs
            else None
        ),
    }


ENGINE_STRATEGIES = STRATEGIES  # the engine's strategies: config.STRATEGIES, one definition
NOISY_PREFILL_SPREAD = 1.5


def timing_noise(holes: list[dict[str, Any]]) -> float | None:
    """A gauge of machine noise: per hole, the slowest cold prefill of the engine strategies over
    the fastest (they prefill the very same prompt), then the median over holes."""
    spreads = []
    for hole in holes:
        values = [
            run["prefill_ms"]
            for name, run in hole["runs"].items()
            if name in ENGINE_STRATEGIES and run.get("prefill_ms")
        ]
        if len(values) >= 2:
            spreads.append(max(values) / min(values))
    return statistics.median(spreads) if spreads else None


def acceptance_text(
    drafted: dict[str, int], accepted: dict[str, int], strategy: str | None = None
) -> str:
    """Accepted/drafted per source; for a strategy that may ask the draft model, whether it did
    (the cost model declines it where its step costs more than its tokens bring)."""
    parts = [
        f"{source} {accepted.get(source, 0)}/{count} ({accepted.get(source, 0) / count:.0%})"
        for source, count in sorted(drafted.items())
        if count
    ]
    if split_variant(strategy or "")[0] in DRAFT_MODEL_STRATEGIES and not drafted.get("draft"):
        parts.append("draft model never asked")
    return ", ".join(parts) or "–"


def _fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return f"{value:{spec}}{suffix}"


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def strategy_rows(holes: list[dict[str, Any]], summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for strategy in strategies_in(holes):
        s, d = summary[strategy], details(holes, strategy)
        rows.append(
            [
                f"`{strategy}`",
                str(d["holes"]),
                _ms(s["p50_ms"]),
                _ms(s["p90_ms"]),
                _ms(s["p99_ms"]),
                _ms(d["prefill_ms_p50"]),
                _fmt(d["decode_tokens_per_s"], ".1f"),
                _fmt(s["tokens_per_forward"], ".2f"),
                acceptance_text(d["drafted"], d["accepted"], strategy),
                _fmt(s["speedup_vs_ar"], ".2f", "×"),
                _pct(s["identical_to_ar"]),
                _pct(s.get("same_text_as_ar")),
                _pct(s["exact_match"]),
                _pct(d["prefix_match"]),
            ]
        )
    return rows


STRATEGY_HEADER = [
    "strategy",
    "holes",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "prefill ms (p50)",
    "decode tok/s",
    "tokens/forward",
    "accepted/drafted by source",
    "speedup vs ar (median)",
    "identical to ar (its variant's)",
    "same text as the first `ar`",
    "exact match",
    "prefix match",
]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB ({n // 1024:,} kB)"


def memory_rows(env: dict[str, Any]) -> list[list[str]]:
    """The environment table's peak memory rows (`provenance.peak_memory`), where recorded."""
    rows = []
    if env.get("peak_rss_bytes"):
        rows.append(["peak RSS", f"{_gib(env['peak_rss_bytes'])}, the bench process"])
    if env.get("children_peak_rss_bytes"):
        rows.append(
            ["peak RSS, children", f"{_gib(env['children_peak_rss_bytes'])}, the largest child"]
        )
    return rows


def render_markdown(
    results: dict[str, Any],
    *,
    replay: dict[str, Any] | None = None,
    sweep: dict[str, Any] | None = None,
    plots: list[str] | None = None,
    extra: list[str] | None = None,
) -> str:
    """report.md; `extra`: further sections, after the per-strategy ones."""
    env, holes, summary = results["env"], results["holes"], results["summary"]
    lines = ["# quickdraft bench", ""]
    state = "interrupted" if env.get("interrupted") else "complete"
    lines.append(
        f"{len(holes)} holes ({state}) from `{env.get('repo')}`, seed {env.get('seed')}, "
        f"at most {env.get('max_new_tokens')} new tokens, greedy."
    )
    lines.append("")
    env_rows = [
        [key, f"`{env[key]}`"]
        for key in ("device", "dtype", "torch", "transformers", "cpu", "torch_threads", "models")
        if key in env
    ]
    env_rows += memory_rows(env)
    for name, peer in (env.get("peers") or {}).items():
        note = peer.get("buffers_note") if isinstance(peer, dict) else None
        if note:  # how the peer loaded, e.g. llama.cpp with or without its extra buffers
            env_rows.append([f"peer `{name}`", note])
    lines += _table(["environment", ""], env_rows)
    lines.append("")
    if not holes:
        lines += ["No hole finished, so there is nothing to report.", ""]
        return "\n".join(lines)
    lines += ["## Per strategy", ""]
    lines += _table(STRATEGY_HEADER, strategy_rows(holes, summary))
    lines += [
        "",
        "Latency is end to end: `Completer.complete` from request to post-processed text (the"
        " typed-ahead cache bypassed), every strategy from a cold start: no KV cache, and no"
        " earlier completion remembered by the n-gram drafter, nor runner-up tokens kept for"
        " trees. Peers run `generate` on the same"
        " prompt ids, token budget, stop tokens and stop rule; the time `Completer` took to build"
        " those ids is added to theirs. Speedup: the median over holes of `ar`'s latency divided"
        " by the strategy's. Tokens per forward: new tokens / target forwards (the engine's decode"
        " forwards; for peers every target forward, the first of which gives their first token)."
        " Prefill: the engine's prompt prefill; for peers, the time to their first token. Exact"
        " match: the inserted text is the hidden truth (trailing whitespace aside); prefix match:"
        " the truth starts with the (non-empty) suggestion. `remote`: the same `Completer`"
        " pipeline with a serving engine generating (`--remote-url`), timed from request to"
        " post-processed text, network included; its prefill is the time to the first streamed"
        " text, and its tokens are its text re-encoded with the local tokenizer.",
        "",
    ]
    lines += render_identity(summary.get("identity_by_path") or {})
    lines += render_stages(holes, summary)
    lines += render_repeats(holes, summary)
    lines += ["## Per language", ""]
    lines += grouped_table(holes, "language", lambda hole: hole["language"])
    lines += ["## Per kind of hole", ""]
    lines += grouped_table(holes, "kind", lambda hole: hole["kind"])
    copied = [hole for hole in holes if hole.get("copied_from")]
    lines += ["## Copy-heavy holes", ""]
    if copied:
        lines += [
            f"{len(copied)} of {len(holes)} holes hide text that stands verbatim in a file open"
            " in the editor (another file, or elsewhere in the same one): what prompt lookup"
            " is for.",
            "",
        ]
        lines += grouped_table(
            copied, "copied from", lambda hole: f"`{hole['copied_from']}`", total=True
        )
    else:
        lines += ["No hole's hidden text stands verbatim in an open file.", ""]
    copies = [hole for hole in holes if hole.get("ar_copied_from")]
    if copies:
        lines += [
            f"On {len(copies)} holes the model's own output (`ar`) stands verbatim in an open"
            " file, whatever the hidden text was:",
            "",
        ]
        lines += grouped_table(
            copies, "copied from", lambda hole: f"`{hole['ar_copied_from']}`", total=True
        )
    lines += extra or []
    if replay and replay.get("holes"):
        lines += render_replay(replay)
    if sweep and sweep.get("summary"):
        lines += render_sweep(sweep)
    notes = env.get("skipped") or {}
    noise = timing_noise(holes)
    noisy = noise is not None and noise >= NOISY_PREFILL_SPREAD
    if notes or env.get("notes") or noisy:
        lines += ["## Notes", ""]
        if noisy:
            lines.append(
                f"- **Timing noise.** Every engine strategy prefills the same prompt from a cold"
                f" cache, yet on a typical hole the slowest of those prefills took {noise:.1f}×"
                f" the fastest (median over holes): the machine was busy with other work, so"
                f" latencies and speedups here are unreliable. Tokens per forward, acceptance,"
                f" identity and matches do not depend on timing."
            )
        for name, reason in notes.items():
            lines.append(f"- `{name}` skipped: {reason}")
        for note in env.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
        lines.append("")
    return "\n".join(lines)


def render_identity(by_path: dict[str, dict[str, Any]]) -> list[str]:
    """The identity table: one row per compute path, one column per engine strategy."""
    if not by_path:
        return []
    strategies = [s for s in ENGINE_STRATEGIES if any(s in row for row in by_path.values())]
    rows = []
    for path, cells in by_path.items():
        row = [f"`{path}`"]
        for strategy in strategies:
            cell = cells.get(strategy)
            row.append(
                "–"
                if cell is None
                else f"{_pct(cell['rate'])} ({cell['identical']}/{cell['holes']})"
            )
        rows.append(row)
    return [
        "## Identity with `ar`, per compute path",
        "",
        *_table(["compute path", *(f"`{s}`" for s in strategies)], rows),
        "",
        "Share of holes where the strategy's tokens equal `ar`'s on the same path. Where the"
        " target's forward is batch-invariant (torch int8 on CPU) this is 100 % by"
        " construction; elsewhere a last-bit difference between one k-token verify forward and"
        " k one-token steps can flip a near tie (docs/performance.md has measured rates).",
        "",
    ]


def grouped_table(
    holes: list[dict[str, Any]], label: str, group_of, *, total: bool = False
) -> list[str]:
    """A table of groups of holes by strategy; with `total`, all of them last as "all"."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for hole in holes:
        groups.setdefault(group_of(hole), []).append(hole)
    ordered = sorted(groups.items())
    if total and len(groups) > 1:
        ordered.append(("all", holes))
    rows = []
    for group, subset in ordered:
        for strategy in strategies_in(subset):
            s, d = summarize_strategy(subset, strategy), details(subset, strategy)
            rows.append(
                [
                    group,
                    f"`{strategy}`",
                    str(d["holes"]),
                    _ms(s["p50_ms"]),
                    _fmt(s["speedup_vs_ar"], ".2f", "×"),
                    _fmt(s["tokens_per_forward"], ".2f"),
                    _pct(s["identical_to_ar"]),
                    _pct(s["exact_match"]),
                    _pct(d["prefix_match"]),
                ]
            )
    header = [label, "strategy", "holes", "p50 ms", "speedup vs ar", "tokens/forward"]
    return [*_table([*header, "identical to ar", "exact", "prefix"], rows), ""]


# --- keystroke replay -------------------------------------------------------------------------


def summarize_replay(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per number of typed characters: median latency, reused and prefill tokens."""
    out: dict[str, Any] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        steps.setdefault("0", []).append(record["cold"])
        for step in record["typed"]:
            steps.setdefault(str(step["chars"]), []).append(step)
    for chars, items in sorted(steps.items(), key=lambda kv: int(kv[0])):
        out[chars] = {
            "holes": len(items),
            "latency_ms_p50": _rounded(percentile([i["latency_ms"] for i in items], 50)),
            "prefill_ms_p50": _rounded(percentile([i["prefill_ms"] or 0 for i in items], 50)),
            "reused_tokens_mean": _rounded(
                statistics.mean(i["reused_tokens"] or 0 for i in items), 1
            ),
            "prefill_tokens_mean": _rounded(
                statistics.mean(i["prefill_tokens"] or 0 for i in items), 1
            ),
            "prompt_tokens_mean": _rounded(
                statistics.mean(i["prompt_tokens"] or 0 for i in items), 1
            ),
        }
    return out


def render_replay(replay: dict[str, Any]) -> list[str]:
    lines = [
        "## Keystroke replay",
        "",
        f"Each hole asked again with `{replay.get('strategy')}` after typing 1 and then 3 more"
        " characters of the truth, without resetting the cache: the prompt shares its start with"
        " the previous one, so only the tail is prefilled. (In `serve`, a keystroke that matches"
        " the shown suggestion is answered from the typed-ahead cache before reaching the"
        " Completer; this measures the path when it does reach it.)",
        "",
    ]
    rows = []
    for chars, item in replay["summary"].items():
        rows.append(
            [
                "cold" if chars == "0" else f"+{chars}",
                str(item["holes"]),
                _fmt(item["prompt_tokens_mean"], ".0f"),
                _fmt(item["reused_tokens_mean"], ".0f"),
                _fmt(item["prefill_tokens_mean"], ".0f"),
                _ms(item["prefill_ms_p50"]),
                _ms(item["latency_ms_p50"]),
            ]
        )
    lines += _table(
        [
            "typed",
            "holes",
            "prompt tokens",
            "reused (mean)",
            "prefilled (mean)",
            "prefill ms (p50)",
            "latency ms (p50)",
        ],
        rows,
    )
    lines.append("")
    return lines


# --- draft-length sweep -----------------------------------------------------------------------


def summarize_sweep(
    records: list[dict[str, Any]], holes: list[dict[str, Any]], primary: str | None
) -> dict[str, Any]:
    """Per language, strategy and fixed draft length: speedup vs `ar`, tokens per forward,
    acceptance; plus the adaptive policy's speedup from the main run, and the best length."""
    ar = {(h["file"], h["line"], h["col"]): h["runs"].get("ar") for h in holes}
    adaptive = summarize(holes) if holes else {}
    table: dict[str, Any] = {}
    for record in records:
        key = (record["file"], record["line"], record["col"])
        base = ar.get(key)
        for strategy, by_length in record["runs"].items():
            for length, run in by_length.items():
                cell = (
                    table.setdefault(record["language"], {})
                    .setdefault(strategy, {})
                    .setdefault(
                        str(length),
                        {
                            "ratios": [],
                            "tokens": 0,
                            "forwards": 0,
                            "drafted": 0,
                            "accepted": 0,
                            "identical": [],
                        },
                    )
                )
                if base and run["latency_ms"] > 0:
                    cell["ratios"].append(base["latency_ms"] / run["latency_ms"])
                    cell["identical"].append(run["tokens"] == base["tokens"])
                cell["tokens"] += run["new_tokens"]
                cell["forwards"] += run["target_forwards"] or 0
                cell["drafted"] += sum((run.get("drafted_by_source") or {}).values())
                cell["accepted"] += sum((run.get("accepted_by_source") or {}).values())
    summary: dict[str, Any] = {}
    best: dict[str, int] = {}
    recommended: dict[str, int | None] = {}
    for language, per in table.items():
        summary[language] = {}
        for strategy, lengths in per.items():
            out = {}
            for length, cell in sorted(lengths.items(), key=lambda kv: int(kv[0])):
                out[length] = {
                    "speedup_vs_ar": _rounded(statistics.median(cell["ratios"]))
                    if cell["ratios"]
                    else None,
                    "tokens_per_forward": _rounded(cell["tokens"] / cell["forwards"])
                    if cell["forwards"]
                    else None,
                    "acceptance": _rounded(cell["accepted"] / cell["drafted"])
                    if cell["drafted"]
                    else None,
                    "identical_to_ar": _rounded(sum(cell["identical"]) / len(cell["identical"]))
                    if cell["identical"]
                    else None,
                }
            lang_adaptive = adaptive.get("by_language", {}).get(language, {}).get(strategy, {})
            out["adaptive"] = {"speedup_vs_ar": lang_adaptive.get("speedup_vs_ar")}
            summary[language][strategy] = out
        choose = primary if primary in per else next(iter(per))
        scored = [
            (cell["speedup_vs_ar"], int(length))
            for length, cell in summary[language][choose].items()
            if length != "adaptive" and cell["speedup_vs_ar"] is not None
        ]
        if scored:
            speedup, length = max(scored, key=lambda item: (item[0], -item[1]))
            best[language] = length
            adaptive_speedup = summary[language][choose]["adaptive"]["speedup_vs_ar"]
            # Fix the length only where that beat letting the cost model choose.
            recommended[language] = (
                None if adaptive_speedup is not None and adaptive_speedup >= speedup else length
            )
    return {"summary": summary, "best": best, "recommended": recommended, "strategy": primary}


def config_snippet(sweep: dict[str, Any]) -> dict[str, Any]:
    """Per language, the draft length to ship: the best fixed one where it beat the adaptive
    policy, else null (adaptive), as configuration (`load_config` accepts it)."""
    chosen = sweep.get("recommended", sweep["best"])
    return {"languages": {lang: {"draft_length": k} for lang, k in sorted(chosen.items())}}


def render_sweep(sweep: dict[str, Any]) -> list[str]:
    lines = ["## Draft-length sweep", ""]
    lines.append(
        "Speedup vs `ar` (median of per-hole ratios) at each fixed draft length, next to the"
        " adaptive policy's (the cost model picks k each step). Acceptance: accepted / drafted."
    )
    lines.append("")
    for language, per in sweep["summary"].items():
        lengths = sorted({k for cells in per.values() for k in cells if k != "adaptive"}, key=int)
        header = ["strategy", *[f"k={k}" for k in lengths], "adaptive"]
        rows = []
        for strategy, cells in per.items():
            row = [f"`{strategy}`"]
            for k in lengths:
                cell = cells.get(k, {})
                row.append(
                    f"{_fmt(cell.get('speedup_vs_ar'), '.2f', '×')} ({_pct(cell.get('acceptance'))})"
                )
            row.append(_fmt(cells.get("adaptive", {}).get("speedup_vs_ar"), ".2f", "×"))
            rows.append(row)
        lines += [f"**{language}**", ""] + _table(header, rows) + [""]
        if language in sweep["best"]:
            best = sweep["best"][language]
            adaptive = (
                per.get(sweep.get("strategy") or "", {}).get("adaptive", {}).get("speedup_vs_ar")
            )
            fixed = per.get(sweep.get("strategy") or "", {}).get(str(best), {}).get("speedup_vs_ar")
            verdict = ""
            if adaptive is not None and fixed is not None and adaptive >= fixed:
                verdict = " The adaptive policy did at least as well here, so leaving `draft_length` unset is as good."
            lines += [
                f"Best fixed length for `{sweep.get('strategy')}` in {language}: {best}.{verdict}",
                "",
            ]
    return lines


# --- plots ------------------------------------------------------------------------------------


def write_plots(
    directory: Path, results: dict[str, Any], sweep: dict[str, Any] | None = None
) -> list[str]:
    """latency_cdf.png, speedup_by_language.png and (with a sweep) acceptance_vs_draft_length.png."""
    try:
        import matplotlib  # optional (the `bench` extra); heavy for every other command

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    holes = results["holes"]
    written: list[str] = []
    if not holes:
        return written
    strategies = strategies_in(holes)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for strategy in strategies:
        values = sorted(h["runs"][strategy]["latency_ms"] for h in holes if strategy in h["runs"])
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=strategy)
    every = [h["runs"][s]["latency_ms"] for h in holes for s in h["runs"]]
    if every and min(every) > 0 and max(every) / min(every) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("share of holes")
    ax.set_title("Latency CDF per strategy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = directory / "latency_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

    by_language = results["summary"].get("by_language", {})
    languages = list(by_language)
    others = [s for s in strategies if s != "ar"]
    if languages and others:
        fig, ax = plt.subplots(
            figsize=(max(6, 1.3 * len(languages) * max(1, len(others)) / 2), 4.5)
        )
        width = 0.8 / len(others)
        for i, strategy in enumerate(others):
            values = [
                by_language[lang].get(strategy, {}).get("speedup_vs_ar") or 0 for lang in languages
            ]
            ax.bar([x + i * width for x in range(len(languages))], values, width, label=strategy)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(others) - 1) / 2 for x in range(len(languages))], languages)
        ax.set_ylabel("speedup vs ar (median)")
        ax.set_title("Speedup per language")
        ax.legend(fontsize=8)
        path = directory / "speedup_by_language.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    if sweep and sweep.get("summary"):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
        for language, per in sweep["summary"].items():
            for strategy, cells in per.items():
                lengths = sorted((k for k in cells if k != "adaptive"), key=int)
                xs = [int(k) for k in lengths]
                acc = [cells[k]["acceptance"] for k in lengths]
                spd = [cells[k]["speedup_vs_ar"] for k in lengths]
                label = f"{language}/{strategy}"
                left.plot(
                    xs, [a if a is not None else float("nan") for a in acc], marker="o", label=label
                )
                right.plot(
                    xs, [s if s is not None else float("nan") for s in spd], marker="o", label=label
                )
        left.set_xlabel("draft length k")
        left.set_ylabel("acceptance (accepted / drafted)")
        left.set_title("Acceptance vs draft length")
        right.set_xlabel("draft length k")
        right.set_ylabel("speedup vs ar (median)")
        right.set_title("Speedup vs draft length")
        for axis in (left, right):
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        path = directory / "acceptance_vs_draft_length.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written

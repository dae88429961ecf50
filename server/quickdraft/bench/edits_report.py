"""Numbers from `quickdraft bench --edits`: the per-strategy summary (speed, and per rule as
the rules bench scores: edits_cases.py), report.md and the terminal tables. Pure functions of
the recorded runs, so a report can be rebuilt from results.json.

One run is one strategy's answer for one case: its edits applied to the file as the server saw
it (`current`) give `applied`, scored against the `truth` (the file as the commit left it) by
`edits_cases.score`:

- exact: every change the answer made is one the commit made;
- helpful / harmful: `applied` is nearer to / further from the truth than `current` was, by
  character edit distance over the region where the three texts differ;
- no edit: the server answered `{edits: []}`;
- error: an error answer, no answer, or edits that could not be applied (a range outside the
  document, another document or version, overlapping edits).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from quickdraft.bench.edits_cases import per_rule, rule_table
from quickdraft.bench.report import _fmt, _ms, _pct, _rounded, _table, memory_rows, percentile

BASELINE = "ar"


def edits_key(edits: list[dict[str, Any]] | None) -> str | None:
    """What identity compares: the edits' ranges and texts, in order (commands aside)."""
    if edits is None:
        return None
    return json.dumps([[e.get("range"), e.get("text")] for e in edits], sort_keys=True)


# --- the summary ----------------------------------------------------------------------------


def _share(part: int, whole: int) -> float | None:
    return _rounded(part / whole) if whole else None


def _p(values: list[float], q: float) -> float | None:
    return _rounded(percentile(values, q))


def _answered(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("error") and r.get("edits") is not None]


def summarize_strategy(
    runs: list[dict[str, Any]], baseline: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """One strategy's numbers; `baseline`: `ar`'s runs of the same pairs (None for ar)."""
    answered = _answered(runs)
    # An answer with no edit is none of exact, helpful, harmful (even where no edit is right).
    scored = [r for r in answered if r.get("exact") is not None and r["edits"]]
    latencies = [r["latency_ms"] for r in answered if r.get("latency_ms") is not None]
    with_stats = [r for r in answered if r.get("stats")]
    tokens = sum(int(r.get("tokens") or 0) for r in with_stats)
    forwards = sum(int(r.get("target_forwards") or 0) for r in with_stats)
    copied = sum(int(r.get("copied_tokens") or 0) for r in with_stats)
    by_pair = {r["pair"]: r for r in _answered(baseline or runs)}
    ratios = [
        by_pair[r["pair"]]["latency_ms"] / r["latency_ms"]
        for r in answered
        if r["pair"] in by_pair and r.get("latency_ms") and by_pair[r["pair"]].get("latency_ms")
    ]
    arrivals = [
        r["arrival"]["latency_ms"]
        for r in runs
        if r.get("arrival") and not r["arrival"].get("error")
    ]
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in with_stats)
    prefilled = sum(int(r.get("prefill_tokens") or 0) for r in with_stats)
    same = [r for r in answered if r["pair"] in by_pair]
    identical = sum(
        1 for r in same if edits_key(r["edits"]) == edits_key(by_pair[r["pair"]]["edits"])
    )
    return {
        "pairs": len(runs),
        "answered": len(answered),
        "errors": len(runs) - len(answered),
        "no_edit": sum(1 for r in answered if not r["edits"]),
        "p50_ms": _p(latencies, 50),
        "p90_ms": _p(latencies, 90),
        "arrival_p50_ms": _p(arrivals, 50),
        "prefilled_share": _share(prefilled, prompt),
        "server_p50_ms": _p([r["server_ms"] for r in with_stats if r.get("server_ms")], 50),
        "tokens": tokens,
        "target_forwards": forwards,
        "tokens_per_forward": _rounded(tokens / forwards) if forwards else None,
        "copied_tokens": copied,
        "copied_share": _share(copied, tokens),
        "exact": _share(sum(1 for r in scored if r["exact"]), len(runs)),
        "helpful": _share(sum(1 for r in scored if r["helpful"]), len(runs)),
        "harmful": _share(sum(1 for r in scored if r["harmful"]), len(runs)),
        "identical_to_ar": _share(identical, len(same)),
        "speedup_vs_ar": _rounded(statistics.median(ratios)) if ratios else None,
    }


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    strategies = results.get("strategies", {})
    baseline = strategies.get(BASELINE, {}).get("runs")
    summary = {}
    for name, record in strategies.items():
        runs = record.get("runs", [])
        summary[name] = {
            **summarize_strategy(runs, None if name == BASELINE else baseline),
            "error": record.get("error"),
        }
        if runs and all("kind" in run for run in runs):
            summary[name]["cases"] = per_rule(runs)
    return summary


def cases_table(summary: dict[str, Any]) -> list[str]:
    """One strategy's runs scored per rule, as the rules bench reports them (none: [])."""
    cases = summary.get("cases")
    return rule_table(cases["overall"], cases["rules"]) if cases else []


def outcome(run: dict[str, Any]) -> str:
    """One word for a run: error, no edit, exact, helpful, harmful, neutral."""
    if run.get("error") or run.get("edits") is None:
        return "error"
    if not run["edits"]:
        return "no edit"
    if run.get("exact"):
        return "exact"
    return "helpful" if run.get("helpful") else "harmful" if run.get("harmful") else "neutral"


def failures(results: dict[str, Any]) -> list[str]:
    """What went wrong, one line each: strategies that stopped, answers that failed."""
    lines = []
    for name, summary in results.get("summary", {}).items():
        if summary.get("error"):
            lines.append(f"strategy {name} stopped: {str(summary['error']).splitlines()[0]}")
        elif summary.get("errors"):
            lines.append(f"strategy {name}: {summary['errors']} of {summary['pairs']} cases failed")
    return lines


def pair_line(run: dict[str, Any]) -> str:
    """The terminal's line about one finished run."""
    parts = [outcome(run)]
    if run.get("latency_ms") is not None:
        parts.append(f"{_ms(run['latency_ms'])} ms")
    if run.get("edits"):
        parts.append(f"{len(run['edits'])} edits")
    if run.get("stats"):
        parts.append(
            f"{run.get('tokens')} tokens, {run.get('copied_tokens')} copied, "
            f"{_fmt(run.get('tokens_per_forward'), '.2f')} tokens/forward"
        )
    if run.get("error"):
        parts.append(str(run["error"]).splitlines()[0])
    return ", ".join(parts)


# --- report.md ------------------------------------------------------------------------------

HEADER = [
    "strategy",
    "cases",
    "p50 ms",
    "p90 ms",
    "speedup vs ar",
    "tokens/forward",
    "prefilled",
    "copied",
    "same as ar",
    "exact",
    "helpful",
    "harmful",
    "no edit",
    "errors",
    "arrival p50 ms",
]


def _x(value: Any) -> str:
    return _fmt(value, ".2f", "×")


def strategy_rows(summary: dict[str, Any]) -> list[list[str]]:
    return [
        [
            f"`{name}`",
            str(s["pairs"]),
            _ms(s["p50_ms"]),
            _ms(s["p90_ms"]),
            _x(s["speedup_vs_ar"]),
            _fmt(s["tokens_per_forward"], ".2f"),
            _pct(s.get("prefilled_share")),
            _pct(s["copied_share"]),
            _pct(s["identical_to_ar"]),
            _pct(s["exact"]),
            _pct(s["helpful"]),
            _pct(s["harmful"]),
            str(s["no_edit"]),
            str(s["errors"]),
            _ms(s.get("arrival_p50_ms")),
        ]
        for name, s in summary.items()
    ]


def render_markdown(results: dict[str, Any]) -> str:
    env, summary = results["env"], results["summary"]
    strategies = results.get("strategies", {})
    pairs = env.get("pairs", [])
    lines = ["# quickdraft bench --edits", ""]
    state = "interrupted" if env.get("interrupted") else "complete"
    heads = env.get("heads") or {}
    histories = ", ".join(
        f"`{repository}` (head `{str(heads.get(repository) or '?')[:12]}`)"
        for repository in env.get("repositories", [])
    )
    lines.append(
        f"{len(pairs)} next-edit cases ({state}) mined from the git histories of {histories} "
        f"(commits since {env.get('since')}, seed {env.get('seed')}) as the rules bench mines "
        "them: a commit changing at most 3 source files, each file changed in 1–6 small hunks "
        "close together, is a case per file; one whose file changed in one hunk is a case where "
        "the right answer is no edit. "
        + (
            "A next edit is first asked where the cursor arrives, at the start of the first "
            "hunk, before the edit (as editors ask when the cursor rests; awaited, not scored: "
            "the arrival). Then the first hunk"
            if env.get("arrival")
            else "The first hunk"
        )
        + " is sent as the user's edit (an incremental `didChange`), "
        + (
            f"{env['rest_ms']:g} ms later (editors ask once the person rests) "
            if env.get("rest_ms")
            else ""
        )
        + "`textDocument/copilotInlineEdit` is asked at the end of its new text, and the answer is "
        "scored against the file as the commit left it (a commit loses the order of its hunks, "
        "so a step toward any of the others counts)."
    )
    lines.append("")
    env_rows = [["CPU", f"`{env.get('cpu')}` ({env.get('cpu_count')} cores)"]]
    env_rows += [
        [key, f"`{env[key]}`"] for key in ("platform", "quickdraft", "git_commit") if env.get(key)
    ]
    servers = {name: record.get("server", {}).get("models") for name, record in strategies.items()}
    models = next((m for m in servers.values() if m), None)
    if models:
        env_rows.append(["models", f"`{json.dumps(models, sort_keys=True)}`"])
    if env.get("server_command"):
        env_rows.append(["server", f"`{' '.join(env['server_command'][1:])}`"])
    if env.get("settings"):
        env_rows.append(["settings", f"`{json.dumps(env['settings'], sort_keys=True)}`"])
    env_rows += memory_rows(env)
    lines += _table(["environment", ""], env_rows)
    lines.append("")
    if not summary:
        lines += ["No strategy ran, so there is nothing to report.", ""]
        return "\n".join(lines)
    lines += ["## Per strategy", ""]
    lines += _table(HEADER, strategy_rows(summary))
    lines += [
        "",
        "Latency is end to end, as the editor sees it: from the `copilotInlineEdit` request to"
        " its answer, each strategy on its own `quickdraft serve` (the same models and settings"
        " but `decoding.strategy`), all in this run on this machine. Speedup: the median over"
        " cases of `ar`'s latency divided by the strategy's. Tokens per forward: output tokens"
        " over target forwards, summed over cases (from `$/quickdraft/stats`); copied: the share"
        " of output tokens that were accepted copy drafts (`copiedTokens`); prefilled: the share"
        " of the prompts' tokens the timed requests computed (the rest was cached). Same as ar: the"
        " answer's edits (ranges and texts) are `ar`'s for the pair. Exact: the file with the"
        " edits applied is the commit's file or a step toward it (every change the answer made"
        " is one the commit made). Helpful / harmful: nearer to / further from that file than"
        " before the answer, by character edit distance over the region where they differ."
        " Shares are of all cases; errors count as neither.",
        "",
    ]
    for name, item in summary.items():
        table = cases_table(item)
        if table:
            lines += [f"## `{name}`, scored per rule", "", *table, ""]
    lines += render_pairs(results)
    stopped = {n: s["error"] for n, s in summary.items() if s.get("error")}
    if stopped:
        lines += ["## Stopped strategies", ""]
        lines += [f"- `{name}`: {str(error).splitlines()[0]}" for name, error in stopped.items()]
        lines.append("")
    return "\n".join(lines)


def render_pairs(results: dict[str, Any]) -> list[str]:
    env = results["env"]
    strategies = results.get("strategies", {})
    names = list(strategies)
    header = ["#", "commit", "date", "path", "hunks", "next hunk", *[f"`{n}`" for n in names]]
    header[0] = "case"
    rows = []
    for index, pair in enumerate(env.get("pairs", [])):
        cells = []
        for name in names:
            run = next((r for r in strategies[name].get("runs", []) if r["pair"] == index), None)
            cells.append("–" if run is None else f"{outcome(run)}, {_ms(run.get('latency_ms'))} ms")
        rows.append(
            [
                str(index + 1),
                f"`{pair['commit'][:10]}`",
                str(pair.get("date", ""))[:10],
                f"`{pair['path']}`",
                str(pair.get("hunks", "")),
                f"{pair['next_lines']} lines down"
                if pair.get("hunks", 2) > 1 and "next_lines" in pair
                else "–",
                *cells,
            ]
        )
    return ["## Per case", "", *_table(header, rows), ""]


def summary_table(results: dict[str, Any]) -> str:
    """A short plain-text table for the terminal (report.md has the full one)."""
    rows = [["strategy", "p50 ms", "p90 ms", "speedup", "tok/fwd", "copied", "same as ar"]]
    rows[0] += ["exact", "helpful", "harmful", "no edit", "errors"]
    for name, s in results["summary"].items():
        rows.append(
            [
                name,
                _ms(s["p50_ms"]),
                _ms(s["p90_ms"]),
                _fmt(s["speedup_vs_ar"], ".2f"),
                _fmt(s["tokens_per_forward"], ".2f"),
                _pct(s["copied_share"]),
                _pct(s["identical_to_ar"]),
                _pct(s["exact"]),
                _pct(s["helpful"]),
                _pct(s["harmful"]),
                str(s["no_edit"]),
                str(s["errors"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )

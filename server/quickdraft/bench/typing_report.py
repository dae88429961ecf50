"""Numbers from `quickdraft bench --typing`: the per-variant summary, report.md, the plot and
the terminal table. Pure functions of the recorded requests, so a report can be rebuilt from
results.json.

Request kinds (typing_replay.py): `cold`; the keystrokes `char`, `enter`, `indent`; `accept-wait`,
`accept-now`; `other-file`, `back-same`, `back-enter`. Outcomes: `shown`, `empty`,
`superseded` (the next keystroke came first; `$/cancelRequest` was sent), `error`,
`unanswered`, `late` (answered after the bench stopped looking).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from quickdraft.bench.report import _fmt, _ms, _pct, _rounded, _table, percentile

KEYSTROKES = ("char", "enter", "indent")
ANSWERED = ("shown", "empty")
PLOT = "typing_latency_cdf.png"


def _p(values: list[float], q: float) -> float | None:
    return _rounded(percentile([v for v in values if v is not None], q))


def _share(part: int, whole: int) -> float | None:
    return _rounded(part / whole) if whole else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return _rounded(a / b, 6) if a is not None and b else None


def _of(requests: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [r for r in requests if r["kind"] in kinds]


def _answered(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if r.get("outcome") in ANSWERED]


def _model(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answered with model work (not from the typed-ahead or prefetch cache)."""
    return [r for r in _answered(requests) if r.get("stats") and not r.get("cached")]


def _tokens(requests: list[dict[str, Any]], key: str = "prefill_tokens") -> list[float]:
    return [r[key] for r in requests if r.get(key) is not None]


def _latencies(requests: list[dict[str, Any]]) -> list[float]:
    return [r["latency_ms"] for r in requests if r.get("latency_ms") is not None]


def _step(requests: list[dict[str, Any]], kind: str, cold_by_hole: dict[int, float]):
    """p50 latency, p50 prefill, share from cache and p50 ratio to the hole's cold latency of
    the answered requests of one kind."""
    done = _answered(_of(requests, kind))
    ratios = [
        r["latency_ms"] / cold_by_hole[r["hole"]]
        for r in done
        if cold_by_hole.get(r["hole"]) and r.get("latency_ms") is not None
    ]
    with_stats = [r for r in done if r.get("stats")]
    return {
        "count": len(done),
        "p50_ms": _p(_latencies(done), 50),
        "to_cold": _rounded(statistics.median(ratios), 6) if ratios else None,
        "prefill_p50": _p(_tokens(with_stats), 50),
        "cached_share": _share(sum(1 for r in with_stats if r.get("cached")), len(with_stats)),
        "sources": sorted({str(r.get("source")) for r in with_stats}),
    }


def summarize_variant(variant: dict[str, Any]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = variant.get("requests", [])
    cold = _answered(_of(requests, "cold"))
    cold_by_hole = {r["hole"]: r["latency_ms"] for r in cold if r.get("latency_ms")}
    keys = _of(requests, *KEYSTROKES)
    answered = _answered(keys)
    model = _model(keys)
    typed_model = [r for r in model if r["kind"] != "enter"]
    enters = _model(_of(keys, "enter"))
    with_stats = [r for r in answered if r.get("stats")]
    comparable = [r for r in answered if r.get("matched") is not None]
    cold_p50 = _p(_latencies(cold), 50)
    keystroke_p50 = _p(_latencies(answered), 50)
    model_p50 = _p(_latencies(model), 50)
    return {
        "holes": len(variant.get("holes", [])),
        "requests": len(requests),
        "keystrokes": len(keys),
        "answered": len(answered),
        "superseded": sum(1 for r in keys if r.get("outcome") == "superseded"),
        "superseded_share": _share(
            sum(1 for r in keys if r.get("outcome") == "superseded"), len(keys)
        ),
        "unanswered": sum(1 for r in requests if r.get("response") in ("none", "exited")),
        "errors": sum(1 for r in requests if r.get("response") == "error"),
        "cancel_without_request": sum(
            1 for r in requests if r.get("outcome") == "superseded" and not r.get("cancel_sent")
        ),
        "cold_p50_ms": cold_p50,
        "cold_p90_ms": _p(_latencies(cold), 90),
        "cold_prompt_tokens_p50": _p(_tokens(cold, "prompt_tokens"), 50),
        "cold_prefill_p50": _p(_tokens(cold), 50),
        "keystroke_p50_ms": keystroke_p50,
        "keystroke_p90_ms": _p(_latencies(answered), 90),
        "keystroke_to_cold": _ratio(keystroke_p50, cold_p50),
        "model_keystroke_p50_ms": model_p50,
        "model_keystroke_p90_ms": _p(_latencies(model), 90),
        "model_keystroke_to_cold": _ratio(model_p50, cold_p50),
        "prefill_p50": _p(_tokens(typed_model), 50),
        "prefill_p90": _p(_tokens(typed_model), 90),
        "enter_prefill_p50": _p(_tokens(enters), 50),
        "enter_p50_ms": _p(_latencies(enters), 50),
        "cached_share": _share(sum(1 for r in with_stats if r.get("cached")), len(with_stats)),
        "match_rate": _share(sum(1 for r in comparable if r["matched"]), len(comparable)),
        "shown_share": _share(sum(1 for r in answered if r["outcome"] == "shown"), len(answered)),
        "cold_match_rate": _share(
            sum(1 for r in cold if r.get("matched")), len([r for r in cold if "matched" in r])
        ),
        "accept_wait": _step(requests, "accept-wait", cold_by_hole),
        "accept_now": _step(requests, "accept-now", cold_by_hole),
        "other_file": _step(requests, "other-file", cold_by_hole),
        "back_same": _step(requests, "back-same", cold_by_hole),
        "back_enter": _step(requests, "back-enter", cold_by_hole),
        "error": variant.get("error"),
    }


def failures(results: dict[str, Any]) -> list[str]:
    """What went wrong, one line each: variants that stopped, requests never answered."""
    lines: list[str] = []
    for name, summary in results.get("summary", {}).items():
        if summary.get("error"):
            first = str(summary["error"]).splitlines()[0]
            lines.append(f"variant {name} stopped: {first}")
        if summary.get("unanswered"):
            lines.append(f"variant {name}: {summary['unanswered']} requests never answered")
    return lines


# --- progress -------------------------------------------------------------------------------


def hole_line(requests: list[dict[str, Any]], hole: int) -> str:
    """One line for the terminal about a finished hole."""
    mine = [r for r in requests if r.get("hole") == hole]
    cold = _answered(_of(mine, "cold"))
    keys = _of(mine, *KEYSTROKES)
    answered = _answered(keys)
    cached = sum(1 for r in answered if r.get("cached"))
    superseded = sum(1 for r in keys if r.get("outcome") == "superseded")
    parts = [f"cold {_ms(cold[0]['latency_ms'])} ms" if cold else "cold –"]
    parts.append(
        f"{len(keys)} keystrokes: {len(answered)} answered ({cached} from cache, p50 "
        f"{_ms(percentile(_latencies(answered), 50))} ms), {superseded} superseded"
    )
    for kind in ("accept-wait", "accept-now", "back-enter"):
        done = _answered(_of(mine, kind))
        if done:
            prefill = done[0].get("prefill_tokens")
            parts.append(f"{kind} {_ms(done[0]['latency_ms'])} ms (prefill {_fmt(prefill, 'd')})")
    unanswered = sum(1 for r in mine if r.get("response") in ("none", "exited"))
    if unanswered:
        parts.append(f"{unanswered} UNANSWERED")
    return "; ".join(parts)


# --- report.md ------------------------------------------------------------------------------


def _tok(value: Any) -> str:
    return _fmt(value, ".0f")


def _x(value: Any) -> str:
    """A ratio to the cold latency, as a percentage with the digits that matter."""
    if value is None:
        return "–"
    percent = value * 100
    return (
        f"{percent:.0f}%"
        if percent >= 10
        else f"{percent:.1f}%"
        if percent >= 1
        else f"{percent:.2f}%"
    )


def render_markdown(results: dict[str, Any], plots: list[str] | None = None) -> str:
    env = results["env"]
    summary = results["summary"]
    variants = results["variants"]
    mode = (
        "each keystroke awaited its answer, then"
        if env.get("await_answers")
        else "a keystroke every"
    )
    lines = [
        "# quickdraft typing benchmark",
        "",
        "Typing sessions replayed through `quickdraft serve` over stdio LSP as VS Code sends "
        "them: incremental didChange per character, an automatic inlineCompletion after each, "
        "`$/cancelRequest` for superseded requests, Enter with the editor's indentation.",
        "",
        f"- CPU: {env.get('cpu')} ({env.get('cpu_count')} logical cores; "
        f"{', '.join(env.get('cpu_flags') or []) or 'no AVX2/AVX-512/AMX listed'})",
        f"- repository: `{env.get('repo')}`, {len(env.get('holes', []))} holes, "
        f"up to {env.get('max_lines')} hidden lines typed per hole",
        f"- pace: {mode} {env.get('pace_ms'):.0f} ms",
        f"- server: `{' '.join(str(a) for a in env.get('server_command', [])[3:])}`",
        f"- quickdraft {env.get('quickdraft')} ({env.get('git_commit')}), "
        f"started {env.get('started_at')}"
        + (", **interrupted**" if env.get("interrupted") else ""),
        "",
        "| variant | runtime | dtype | device | models loaded in |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, variant in variants.items():
        server = variant.get("server", {})
        lines.append(
            f"| {name} | {server.get('runtime', '-')} | {server.get('dtype', '-')} | "
            f"{server.get('device', '-')} | {_fmt(server.get('warmup_s'), '.1f', ' s')} |"
        )
    lines += ["", "## Keystrokes", ""]
    lines += _table(
        [
            "variant",
            "keystrokes",
            "superseded",
            "from cache",
            "p50",
            "p90",
            "p50 / cold",
            "model p50",
            "model p90",
            "model / cold",
            "prefill p50",
            "prefill p90",
            "Enter prefill p50",
            "match",
        ],
        (
            [
                name,
                str(s["keystrokes"]),
                _pct(s["superseded_share"]),
                _pct(s["cached_share"]),
                _ms(s["keystroke_p50_ms"]),
                _ms(s["keystroke_p90_ms"]),
                _x(s["keystroke_to_cold"]),
                _ms(s["model_keystroke_p50_ms"]),
                _ms(s["model_keystroke_p90_ms"]),
                _x(s["model_keystroke_to_cold"]),
                _tok(s["prefill_p50"]),
                _tok(s["prefill_p90"]),
                _tok(s["enter_prefill_p50"]),
                _pct(s["match_rate"]),
            ]
            for name, s in summary.items()
        ),
    )
    lines += [
        "",
        "Latencies are from the keystroke's request to its answer, over the keystrokes answered "
        "before the next one came; *model* ones were not answered from a cache (the server's "
        "`$/quickdraft/stats` says `cached: false`). Prefill: tokens the server computed for "
        "the keystroke (`prefillTokens`), typed characters and indentation fixes not answered "
        "from cache; Enter (not from cache) separately. Match: the suggestion is the start of the hidden text "
        "still to type, or the rest of its line starts the suggestion.",
        "",
        "## Cold requests",
        "",
    ]
    lines += _table(
        ["variant", "p50", "p90", "prompt tokens p50", "prefill p50", "match"],
        (
            [
                name,
                _ms(s["cold_p50_ms"]),
                _ms(s["cold_p90_ms"]),
                _tok(s["cold_prompt_tokens_p50"]),
                _tok(s["cold_prefill_p50"]),
                _pct(s["cold_match_rate"]),
            ]
            for name, s in summary.items()
        ),
    )
    lines += [
        "",
        "## Accept, then the next suggestion",
        "",
        "Tab (a didChange inserting the suggestion), then a request: after waiting one "
        "cold-request time (`accept-wait`, on the suggestion after the last Enter), and at once "
        "(`accept-now`, on the suggestion after `back-enter`).",
        "",
    ]
    lines += _steps_table(summary, ("accept_wait", "accept_now"))
    lines += [
        "",
        "## Another file and back",
        "",
        "A request in another open file, then back: at the same spot (`back-same`), then after "
        "Enter (`back-enter`).",
        "",
    ]
    lines += _steps_table(summary, ("other_file", "back_same", "back_enter"))
    lines += ["", "## Answers", ""]
    lines += _table(
        ["variant", "requests", "unanswered", "errors", "superseded without $/cancelRequest"],
        (
            [
                name,
                str(s["requests"]),
                str(s["unanswered"]),
                str(s["errors"]),
                str(s["cancel_without_request"]),
            ]
            for name, s in summary.items()
        ),
    )
    lines += problems_section(variants, summary)
    lines += ["", "## Holes", ""]
    lines += _table(
        ["#", "file", "line", "kind", "typed"],
        (
            [
                str(n + 1),
                f"`{hole['file']}`",
                str(hole["line"] + 1),
                hole["kind"],
                f"`{_short(hole.get('truth', ''))}`",
            ]
            for n, hole in enumerate(env.get("holes", []))
        ),
    )
    for plot in plots or []:
        lines += ["", f"![{Path(plot).stem}]({Path(plot).name})"]
    return "\n".join(lines) + "\n"


def problems_section(variants: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Markdown lines: the errors the server showed the user, and the variants that stopped."""
    lines: list[str] = []
    shown = [
        (name, message)
        for name, variant in variants.items()
        for message in variant.get("server", {}).get("errors", [])
    ]
    if shown:
        lines += ["", "Errors the server showed the user (`window/showMessage`):", ""]
        lines += [f"- {name}: {message}" for name, message in shown]
    stopped = [(name, s["error"]) for name, s in summary.items() if s.get("error")]
    if stopped:
        lines += ["", "## Stopped variants", ""]
        for name, error in stopped:
            lines += [f"- **{name}**:", "", "```", str(error), "```"]
    return lines


def _short(text: str, limit: int = 60) -> str:
    line = text.split("\n", 1)[0].replace("|", "\\|").replace("`", "'")
    return line if len(line) <= limit and "\n" not in text else line[: limit - 1] + "…"


def _steps_table(summary: dict[str, Any], steps: tuple[str, ...]) -> list[str]:
    header = ["variant"]
    for step in steps:
        label = step.replace("_", "-")
        header += [f"{label} p50", "/ cold", "prefill p50", "from cache"]
    rows = []
    for name, s in summary.items():
        row = [name]
        for step in steps:
            cell = s[step]
            row += [
                _ms(cell["p50_ms"]),
                _x(cell["to_cold"]),
                _tok(cell["prefill_p50"]),
                _pct(cell["cached_share"]),
            ]
        rows.append(row)
    return _table(header, rows)


# --- the plot -------------------------------------------------------------------------------


def _cdf(axis, values: list[float], label: str) -> None:
    """A step curve from 0 to 1 (dots too: a handful of points must show)."""
    if not values:
        return
    ordered = sorted(values)
    shares = [(i + 1) / len(ordered) for i in range(len(ordered))]
    axis.step([ordered[0], *ordered], [0.0, *shares], where="post", marker=".", label=label)


def write_plot(directory: Path, results: dict[str, Any]) -> list[str]:
    """typing_latency_cdf.png: keystroke latency and prefill tokens, one curve per variant."""
    try:
        import matplotlib  # optional (the `bench` extra); heavy for every other command

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    variants = results.get("variants", {})
    if not any(v.get("requests") for v in variants.values()):
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    every: list[float] = []
    for name, variant in variants.items():
        keys = _of(variant.get("requests", []), *KEYSTROKES)
        values = _latencies(_answered(keys))
        every += values
        _cdf(left, values, name)
        _cdf(right, _tokens(_model(keys)), name)
    if every and min(every) > 0 and max(every) / min(every) > 20:
        left.set_xscale("log")
    left.set_xlabel("keystroke latency, request to answer (ms)")
    left.set_ylabel("share of answered keystrokes")
    left.set_title("Keystroke latency CDF")
    right.set_xlabel("prefill tokens (keystrokes and Enter not answered from cache)")
    right.set_ylabel("share")
    right.set_title("Prefill per keystroke CDF")
    for axis in (left, right):
        axis.set_ylim(0, 1.05)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    path = directory / PLOT
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


# --- the terminal ---------------------------------------------------------------------------


def summary_table(results: dict[str, Any]) -> str:
    rows = [
        [
            "variant",
            "keys p50",
            "p90",
            "model p50",
            "/ cold",
            "prefill p50",
            "Enter",
            "cached",
            "match",
            "accept(wait)",
            "back+Enter prefill",
            "unanswered",
        ]
    ]
    for name, s in results.get("summary", {}).items():
        rows.append(
            [
                name,
                _ms(s["keystroke_p50_ms"]),
                _ms(s["keystroke_p90_ms"]),
                _ms(s["model_keystroke_p50_ms"]),
                _x(s["model_keystroke_to_cold"]),
                _tok(s["prefill_p50"]),
                _tok(s["enter_prefill_p50"]),
                _pct(s["cached_share"]),
                _pct(s["match_rate"]),
                _ms(s["accept_wait"]["p50_ms"]),
                _tok(s["back_enter"]["prefill_p50"]),
                str(s["unanswered"]) + (" (stopped)" if s.get("error") else ""),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )

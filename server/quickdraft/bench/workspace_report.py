"""Numbers from the workspace scenario of `quickdraft bench --typing` (workspace.py plans it):
the first suggestion in each file opened together, against a file never opened before; coming
back to a file; moving within one; where the reused prompt tokens came from. Pure functions of
the recorded requests, in typing_report's style, so a report can be rebuilt from results.json.

Request kinds: `visit` (the first suggestion in a file opened with the others, after the open
pause, didFocus and a thought pause), `revisit` (back in a visited file, at once), `move` (20-40
lines away in that file, after a thought pause), `cold` (a file never opened before, opened and
asked at once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.bench.report import _fmt, _ms, _pct, _rounded, _table
from quickdraft.bench.typing_replay import REUSE_SPLIT
from quickdraft.bench.typing_report import (
    _answered,
    _latencies,
    _of,
    _p,
    _ratio,
    _tok,
    _x,
    problems_section,
)
from quickdraft.bench.workspace import ASK_KINDS

TOKENS = ("prompt_tokens", "prefill_tokens", "reused_tokens", *REUSE_SPLIT)


def _prefill_share(requests: list[dict[str, Any]]) -> float | None:
    """Prefill tokens over prompt tokens, over the requests whose stats say both."""
    counted = [
        r for r in requests if r.get("prompt_tokens") and r.get("prefill_tokens") is not None
    ]
    if not counted:
        return None
    return _rounded(
        sum(r["prefill_tokens"] for r in counted) / sum(r["prompt_tokens"] for r in counted)
    )


def _first_ms(requests: list[dict[str, Any]]) -> float | None:
    return requests[0]["latency_ms"] if requests else None


def reuse_split(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The tokens of the answered requests with stats, summed: prompt, prefill, reused and the
    split of reused ones (None where the server did not send that field)."""
    with_stats = [r for r in requests if r.get("stats")]
    split: dict[str, Any] = {"requests": len(with_stats)}
    for key in TOKENS:
        values = [r[key] for r in with_stats if r.get(key) is not None]
        split[key] = sum(values) if values else None
    return split


def summarize_variant(variant: dict[str, Any]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = variant.get("requests", [])
    visits = _of(requests, "visit")
    answered = {kind: _answered(_of(requests, kind)) for kind in ASK_KINDS}
    cold_ms = _first_ms(answered["cold"])
    visit_p50 = _p(_latencies(answered["visit"]), 50)
    per_file = [
        {
            "file": r.get("file"),
            "language": r.get("language"),
            "outcome": r.get("outcome"),
            "latency_ms": r.get("latency_ms"),
            "source": r.get("source"),
            **{key: r.get(key) for key in TOKENS if key in r},
        }
        for r in visits
    ]
    return {
        "files": len(visits),
        "requests": len(requests),
        "answered": sum(len(done) for done in answered.values()),
        "unanswered": sum(1 for r in requests if r.get("response") in ("none", "exited")),
        "errors": sum(1 for r in requests if r.get("response") == "error"),
        "visits": per_file,
        "visit_p50_ms": visit_p50,
        "visit_p90_ms": _p(_latencies(answered["visit"]), 90),
        "cold_ms": cold_ms,
        "cold_prompt_tokens": next((r.get("prompt_tokens") for r in answered["cold"]), None),
        "cold_prefill_tokens": next((r.get("prefill_tokens") for r in answered["cold"]), None),
        "visit_to_cold": _ratio(visit_p50, cold_ms),
        "visit_prefill_share": _prefill_share(answered["visit"]),
        "revisit_p50_ms": _p(_latencies(answered["revisit"]), 50),
        "revisit_prefill_share": _prefill_share(answered["revisit"]),
        "move_p50_ms": _p(_latencies(answered["move"]), 50),
        "move_prefill_share": _prefill_share(answered["move"]),
        "cold_prefill_share": _prefill_share(answered["cold"]),
        "reuse": {kind: reuse_split(answered[kind]) for kind in ASK_KINDS},
        "sources": {
            kind: sorted({str(r["source"]) for r in answered[kind] if r.get("source")})
            for kind in ASK_KINDS
        },
        "error": variant.get("error"),
    }


def progress_line(requests: list[dict[str, Any]]) -> str:
    """One line for the terminal once the scenario has run on a variant."""
    summary = summarize_variant({"requests": requests})
    return (
        f"visits p50 {_ms(summary['visit_p50_ms'])} ms over {summary['files']} files; cold "
        f"{_ms(summary['cold_ms'])} ms; revisit {_ms(summary['revisit_p50_ms'])} ms; move "
        f"{_ms(summary['move_p50_ms'])} ms (prefill share {_pct(summary['move_prefill_share'])})"
        + (f"; {summary['unanswered']} UNANSWERED" if summary["unanswered"] else "")
    )


# --- report.md ------------------------------------------------------------------------------


def render_markdown(results: dict[str, Any], plots: list[str] | None = None) -> str:
    env = results["env"]
    workspace = env.get("workspace") or {}
    summary = results["summary"]
    variants = results["variants"]
    lines = [
        "# quickdraft typing benchmark: workspace",
        "",
        f"{len(workspace.get('files') or [])} held-out files opened together (didOpen), a pause "
        f"of {_fmt(workspace.get('open_pause_s'), 'g', ' s')}, then each visited in turn: "
        "`textDocument/didFocus` at a hole's cursor, a thought pause of "
        f"{_fmt(workspace.get('think_s'), 'g', ' s')}, one character typed, an inline completion "
        "request (`visit`). Then back to a visited file, one more character, a request at once "
        "(`revisit`); 20-40 lines away in it, a thought pause, the rest of that line replaced "
        "by its first character, a request (`move`). Baseline: a file never opened before, "
        "opened, focused, one character typed and asked at once (`cold`). A server that does not "
        "handle didFocus yet ignores it: then the visits show what didOpen and the pause do.",
        "",
        f"- CPU: {env.get('cpu')} ({env.get('cpu_count')} logical cores; "
        f"{', '.join(env.get('cpu_flags') or []) or 'no AVX2/AVX-512/AMX listed'})",
        f"- repository: `{env.get('repo')}`; files: "
        + ", ".join(
            f"`{f}` ({lang})"
            for f, lang in zip(
                workspace.get("files") or [], workspace.get("languages") or [], strict=True
            )
        )
        + f"; cold: `{workspace.get('cold')}`; back to `{workspace.get('revisit')}`",
        f"- server: `{' '.join(str(a) for a in env.get('server_command', [])[3:])}`",
        f"- quickdraft {env.get('quickdraft')} ({env.get('git_commit')}), "
        f"started {env.get('started_at')}"
        + (", **interrupted**" if env.get("interrupted") else ""),
    ]
    move = workspace.get("move")
    if move:
        lines.append(f"- move: to line {move['line'] + 1} ({move['distance']:+d} lines)")
    lines += [f"- note: {note}" for note in workspace.get("notes") or []]
    lines += ["", "## Summary", ""]
    lines += _table(
        [
            "variant",
            "files",
            "visit p50",
            "visit p90",
            "cold",
            "cold prompt",
            "visit p50 / cold",
            "visit prefill share",
            "revisit p50",
            "revisit from",
            "move p50",
            "move prefill share",
            "cold prefill share",
            "unanswered",
        ],
        (
            [
                name,
                str(s["files"]),
                _ms(s["visit_p50_ms"]),
                _ms(s["visit_p90_ms"]),
                _ms(s["cold_ms"]),
                _tok(s["cold_prompt_tokens"]),
                _x(s["visit_to_cold"]),
                _pct(s["visit_prefill_share"]),
                _ms(s["revisit_p50_ms"]),
                ", ".join(s["sources"]["revisit"]) or "–",
                _ms(s["move_p50_ms"]),
                _pct(s["move_prefill_share"]),
                _pct(s["cold_prefill_share"]),
                str(s["unanswered"]),
            ]
            for name, s in summary.items()
        ),
    )
    lines += [
        "",
        "Latencies (ms) are from the request to its answer. Prefill share: the prompt tokens the "
        "server computed for the request (`prefillTokens` / `promptTokens` of its "
        "`$/quickdraft/stats`). Cold prompt: the cold request's prompt tokens (the visits' are "
        "below), as a cold request costs by its prompt's length. Revisit from: `model`, or the cache "
        "that answered it (`typed-ahead` when the character typed is the start of the "
        "suggestion shown before).",
        "",
        "## First suggestion per file",
        "",
    ]
    lines += _table(
        ["variant", "file", "language", "latency", "prompt", "prefill", "reused", "source"],
        (
            [
                name,
                f"`{v.get('file')}`",
                str(v.get("language")),
                _ms(v.get("latency_ms")) if v.get("outcome") in ("shown", "empty") else "–",
                _tok(v.get("prompt_tokens")),
                _tok(v.get("prefill_tokens")),
                _tok(v.get("reused_tokens")),
                str(v.get("source") or "–"),
            ]
            for name, s in summary.items()
            for v in s["visits"]
        ),
    )
    lines += ["", "## Reused tokens", ""]
    lines += _table(
        ["variant", "request", "n", "prompt", "prefill", "reused", "shared", "warm", "own"],
        (
            [
                name,
                kind,
                str(split["requests"]),
                *(_tok(split[key]) for key in TOKENS),
            ]
            for name, s in summary.items()
            for kind, split in s["reuse"].items()
        ),
    )
    lines += [
        "",
        "Sums over the answered requests of each kind. Shared, warm, own: where the reused "
        "tokens came from (`reused_shared_tokens`, `reused_warm_tokens`, `reused_own_tokens` "
        "in the stats; – where the server does not send them).",
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
    lines += problems_section(variants, summary)
    for plot in plots or []:
        lines += ["", f"![{Path(plot).stem}]({Path(plot).name})"]
    return "\n".join(lines) + "\n"


def write_plot(directory: Path, results: dict[str, Any]) -> list[str]:
    """No plot: a handful of requests per variant read better in the tables."""
    return []


# --- the terminal ---------------------------------------------------------------------------


def summary_table(results: dict[str, Any]) -> str:
    rows = [
        [
            "variant",
            "visit p50",
            "cold",
            "/ cold",
            "revisit",
            "move",
            "move prefill",
            "unanswered",
        ]
    ]
    for name, s in results.get("summary", {}).items():
        rows.append(
            [
                name,
                _ms(s["visit_p50_ms"]),
                _ms(s["cold_ms"]),
                _x(s["visit_to_cold"]),
                _ms(s["revisit_p50_ms"]),
                _ms(s["move_p50_ms"]),
                _pct(s["move_prefill_share"]),
                str(s["unanswered"]) + (" (stopped)" if s.get("error") else ""),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )

"""Confidence and candidates in the bench: the floor table, the floor it supports, and which
candidate was right.

Every suggestion carries the target's probability of the tokens shown (`Completion.confidence`).
A floor hides suggestions below it. The table gives, for a range of floors, the share of
suggestions still shown and, among those, the share exactly right and right by prefix; the
floor the data supports is the one where the exact share among shown suggestions is highest
while at most a tenth of the exactly right suggestions are lost (`choose_floor`).
"""

from __future__ import annotations

from statistics import median
from typing import Any

FLOORS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MAX_RIGHT_LOST = 0.1
"""The most of the exactly right suggestions a floor may hide."""


def _scored(run: dict[str, Any] | None) -> bool:
    """Whether a run showed something and says how sure it was."""
    return run is not None and bool(run["completion"].strip()) and run.get("confidence") is not None


def _first_line_right(hole: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether the first line of a multi-line suggestion is what was typed next."""
    line = run["completion"].split("\n", 1)[0]
    return bool(line.strip()) and hole["truth"].startswith(line)


def floor_table(holes: list[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    pairs = [
        (hole, hole["runs"][strategy]) for hole in holes if _scored(hole["runs"].get(strategy))
    ]
    runs = [run for _, run in pairs]
    if not runs:
        return []
    right = sum(run["exact_match"] for run in runs)
    rows = []
    for floor in FLOORS:
        shown = [run for run in runs if run["confidence"] >= floor]
        exact = sum(run["exact_match"] for run in shown)
        prefix = sum(run.get("prefix_match", False) or run["exact_match"] for run in shown)
        # "The line so far": below the floor, a multi-line suggestion whose first line scores
        # above it would show that line.
        lines = [
            (hole, run)
            for hole, run in pairs
            if run["confidence"] < floor and (run.get("line_confidence") or 0.0) >= floor
        ]
        lines_right = sum(_first_line_right(hole, run) for hole, run in lines)
        rows.append(
            {
                "floor": floor,
                "shown": len(shown),
                "shown_share": len(shown) / len(runs),
                "exact_share": exact / len(shown) if shown else None,
                "prefix_share": prefix / len(shown) if shown else None,
                "right_lost": (right - exact) / right if right else 0.0,
                "first_lines": len(lines),
                "first_lines_right": lines_right,
                "wrong_hidden": (
                    (len(runs) - right - (len(shown) - exact)) / (len(runs) - right)
                    if len(runs) > right
                    else 0.0
                ),
            }
        )
    return rows


def choose_floor(table: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the floor the data supports: the highest exact share among shown
    suggestions losing at most `MAX_RIGHT_LOST` of the right ones (the lowest such floor on a
    tie); None without data."""
    allowed = [row for row in table if row["right_lost"] <= MAX_RIGHT_LOST and row["shown"]]
    if not allowed:
        return None
    return max(allowed, key=lambda row: (row["exact_share"], -row["floor"]))


def candidates_summary(holes: list[dict[str, Any]], strategy: str) -> dict[str, Any] | None:
    """Over the holes that asked for alternatives: how many items each had, which one was
    exactly right first (0: the greedy one), and what the alternatives cost."""
    asked = [
        hole["runs"][strategy]
        for hole in holes
        if strategy in hole["runs"] and hole["runs"][strategy].get("alternatives") is not None
    ]
    with_items = [run for run in asked if run["completion"].strip()]
    if not with_items or not any(run["alternatives"] for run in with_items):
        return None
    taken: dict[str, int] = {}
    for run in with_items:
        items = [run, *run["alternatives"]]
        index = next((i for i, item in enumerate(items) if item["exact_match"]), None)
        key = "none" if index is None else str(index)
        taken[key] = taken.get(key, 0) + 1
    others = [other for run in with_items for other in run["alternatives"]]
    return {
        "holes": len(with_items),
        "items_per_hole": (len(with_items) + len(others)) / len(with_items),
        "exact_index": taken,
        "alternative_prefill_tokens": sum(other["prefill_tokens"] or 0 for other in others),
        "alternative_new_tokens_p50": median(other["new_tokens"] for other in others)
        if others
        else None,
        "alternative_decode_ms_p50": median(other["decode_ms"] for other in others)
        if others
        else None,
    }


def summarize_confidence(holes: list[dict[str, Any]], strategy: str | None) -> dict[str, Any]:
    """results.json's `summary.confidence`, for the main strategy: the floor table overall and
    per language, the floor chosen from it, and the candidates."""
    if strategy is None:
        return {}
    table = floor_table(holes, strategy)
    by_language = {
        language: floor_table([h for h in holes if h["language"] == language], strategy)
        for language in sorted({hole["language"] for hole in holes})
    }
    return {
        "strategy": strategy,
        "floors": table,
        "chosen": choose_floor(table),
        "by_language": by_language,
        "candidates": candidates_summary(holes, strategy),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def render_confidence(confidence: dict[str, Any]) -> list[str]:
    table = confidence.get("floors") or []
    if not table:
        return []
    strategy = confidence["strategy"]
    shown_at_zero = table[0]["shown"]
    lines = [
        "## Confidence floor",
        "",
        f"`{strategy}`'s {shown_at_zero} non-empty suggestions, by the target's probability of"
        " the tokens shown (the product of their probabilities). A floor hides suggestions"
        " below it; exact and prefix shares are among those still shown; right lost: the"
        " exactly right suggestions it hides; wrong hidden: the others it hides; first lines:"
        " suggestions below the floor whose first line alone scores above it (multi-line ones),"
        " and how many of those lines are what was typed next.",
        "",
        "| floor | shown | exact | prefix | right lost | wrong hidden | first lines (right) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        lines.append(
            f"| {row['floor']:.2f} | {row['shown']} ({_pct(row['shown_share'])}) |"
            f" {_pct(row['exact_share'])} | {_pct(row['prefix_share'])} |"
            f" {_pct(row['right_lost'])} | {_pct(row['wrong_hidden'])} |"
            f" {row['first_lines']} ({row['first_lines_right']}) |"
        )
    chosen = confidence.get("chosen")
    lines.append("")
    if chosen is not None:
        lines.append(
            f"The data supports a floor of **{chosen['floor']:.2f}**: exact among shown"
            f" {_pct(chosen['exact_share'])} (no floor: {_pct(table[0]['exact_share'])}),"
            f" {_pct(chosen['shown_share'])} of suggestions still shown, {_pct(chosen['right_lost'])}"
            f" of the right ones lost (at most {MAX_RIGHT_LOST:.0%} allowed)."
        )
        lines.append("")
    by_language = confidence.get("by_language") or {}
    if len(by_language) > 1 and chosen is not None:
        lines += [
            "Per language, at that floor:",
            "",
            "| language | suggestions | shown | exact (no floor) | exact | right lost |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for language, rows in by_language.items():
            row = next((r for r in rows if r["floor"] == chosen["floor"]), None)
            if not rows or row is None:
                continue
            lines.append(
                f"| {language} | {rows[0]['shown']} | {row['shown']} |"
                f" {_pct(rows[0]['exact_share'])} | {_pct(row['exact_share'])} |"
                f" {_pct(row['right_lost'])} |"
            )
        lines.append("")
    candidates = confidence.get("candidates")
    if candidates:
        taken = ", ".join(
            f"{'none' if k == 'none' else 'item ' + str(int(k) + 1)}: {v}"
            for k, v in sorted(candidates["exact_index"].items())
        )
        lines += [
            "## Candidates",
            "",
            f"{candidates['holes']} holes, {candidates['items_per_hole']:.2f} items each after"
            f" dropping duplicates. The first exactly right item: {taken}. The alternatives"
            f" computed {candidates['alternative_prefill_tokens']} prompt tokens in all (forks of"
            f" the first answer's cache), {candidates['alternative_new_tokens_p50']} new tokens"
            f" and {candidates['alternative_decode_ms_p50']:.0f} ms of decode each (median), after"
            " the first answer's latency was measured.",
            "",
        ]
    return lines

"""`quickdraft bench --edits --edits-rules`: next-edit cases mined as the literature mines them,
scored per rule, with no model (issue #32).

Mining (`mine_cases`): commits since `since` that change at most MAX_FILES source files; in
each, a file whose change is 1-MAX_HUNKS small hunks close together is a case. The first hunk is
the user's edit; the truth is the file as the commit left it, so an answer that moves toward any
remaining hunk counts as helpful. A file changed by one hunk is a case whose right answer is no
edit; they are kept at NO_EDIT_SHARE of the cases (the rest are edit cases).

Replay (`replay_case`): the file is opened in the language server's own document store, the
first hunk is sent as one incremental change (the store records the history as it does for an
editor), and the next-edit rules and vetoes run exactly as `next_edit.suggest` runs them
(`next_edit.decide`), the cursor at the end of the edit. The one edit shown, if any, is applied
and scored (`score`): exact, helpful, harmful. `latency_ms` is the rules' own time,
server-side (what the answer adds to an LSP round trip when no model is asked).

Report: per rule and overall, coverage (proposals / edit cases), precision (helpful /
proposals), harmful rate (harmful / all cases), exact (exact / edit cases), each with a 95 %
Wilson interval; latency p50/p90.
"""

from __future__ import annotations

import difflib
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.bench.edits import (
    Candidate,
    EditPair,
    Hunk,
    _hunks,
    commit_files,
    edit_pair,
    git_dir,
    is_source,
)
from quickdraft.bench.report import percentile
from quickdraft.context.syntax import language_for_path
from quickdraft.errors import ConfigError

if TYPE_CHECKING:  # the pipeline imports torch; the rules' bench runs without it
    from quickdraft.next_edit import EditSources

MAX_FILES = 3
MAX_HUNKS = 6
MAX_HUNK_LINES = 8
MAX_SPAN_LINES = 80
NO_EDIT_SHARE = 0.25
Z95 = 1.959964


@dataclass(frozen=True)
class FileChange:
    commit: str
    date: str
    path: str


def changes(directory: Path, since: str) -> list[FileChange]:
    """(commit, file) of the commits since `since` (newest first, no merges) that change at most
    MAX_FILES source files, each file in text and by few enough lines."""
    found: list[FileChange] = []
    limit = MAX_HUNKS * MAX_HUNK_LINES
    for commit, date, files in commit_files(directory, since):
        sources = [f for f in files if is_source(f[2])]
        if not sources or len(sources) > MAX_FILES:
            continue
        for added, deleted, path in sources:
            if added.isdigit() and deleted.isdigit() and max(int(added), int(deleted)) <= limit:
                found.append(FileChange(commit, date, path))
    return found


def close_hunks(hunks: list[Hunk]) -> bool:
    if not 1 <= len(hunks) <= MAX_HUNKS:
        return False
    if any(max(h.old_count, h.new_count) > MAX_HUNK_LINES for h in hunks):
        return False
    return max(h.old_end for h in hunks) - min(h.old_start for h in hunks) <= MAX_SPAN_LINES


def case_of(directory: Path, repository: str, change: FileChange) -> EditPair | None:
    """The case a commit's change to one file gives, or None when it does not qualify."""
    candidate = Candidate(change.commit, change.date, change.path)
    hunks = _hunks(directory, candidate)
    if not close_hunks(hunks):
        return None
    return edit_pair(directory, repository, candidate, hunks)


def mine_cases(
    repo: Path,
    *,
    since: str,
    max_cases: int,
    seed: int = 0,
    languages: frozenset[str] | None = frozenset({"python"}),
) -> list[EditPair]:
    """Up to `max_cases` cases from `repo` since `since`: edit cases (2+ hunks) and, at
    NO_EDIT_SHARE, one-hunk cases; a seeded shuffle picks them, oldest first."""
    if max_cases < 1:
        raise ConfigError(f"--edits-max-pairs: must be at least 1, got {max_cases}")
    directory = git_dir(repo)
    repository = str(Path(repo).expanduser().resolve())
    found = changes(directory, since)
    if languages is not None:
        found = [c for c in found if (lang := language_for_path(c.path)) and lang.id in languages]
    order = list(range(len(found)))
    random.Random(seed).shuffle(order)
    want_none = round(max_cases * NO_EDIT_SHARE)
    want_edit = max_cases - want_none
    edit_cases: list[tuple[int, EditPair]] = []
    none_cases: list[tuple[int, EditPair]] = []
    for index in order:
        if len(edit_cases) >= want_edit and len(none_cases) >= want_none:
            break
        case = case_of(directory, repository, found[index])
        if case is None:
            continue
        bucket = none_cases if case.hunks == 1 else edit_cases
        if len(bucket) < (want_none if case.hunks == 1 else want_edit):
            bucket.append((index, case))
    return [case for _, case in sorted(edit_cases + none_cases, key=lambda item: -item[0])]


# --- scoring one answer ---------------------------------------------------------------------


def region(*texts: str) -> tuple[int, int]:
    """(common prefix length, common suffix length) of all `texts`: outside them they agree."""
    shortest = min(len(t) for t in texts)
    prefix = 0
    while prefix < shortest and len({t[prefix] for t in texts}) == 1:
        prefix += 1
    suffix = 0
    while suffix < shortest - prefix and len({t[len(t) - 1 - suffix] for t in texts}) == 1:
        suffix += 1
    return prefix, suffix


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Characters (or, given lists, tokens) inserted, deleted or replaced to turn `a` into `b`,
    by difflib's alignment (each replaced block counts its longer side): Levenshtein's distance
    or a little over it."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(
        max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    )


def score(current: str, truth: str, applied: str) -> dict[str, Any]:
    """exact (`exact`), helpful, harmful, and the distances to the truth before (`current`)
    and after (`applied`) the answer, over the region where the three differ."""
    prefix, suffix = region(current, truth, applied)

    def cut(text: str) -> str:
        return text[prefix : len(text) - suffix]

    before = edit_distance(cut(current), cut(truth))
    after = edit_distance(cut(applied), cut(truth))
    return {
        "exact": exact(current, truth, applied, (prefix, suffix)),
        "distance_before": before,
        "distance_after": after,
        "helpful": after < before,
        "harmful": after > before,
    }


TOKENS = re.compile(r"\w+|\s+|[^\w\s]")


def exact(current: str, truth: str, applied: str, differ: tuple[int, int]) -> bool:
    """Whether every change the answer made is one the commit made: the answer is the truth, or
    a step toward it, token for token (the way from `current` through `applied` to `truth` is
    no longer than the straight one, counted in tokens over the lines where they differ). A
    next edit shows one change of several, so it can be exact without being all of them; half
    a word is not a change the commit made. `differ`: the three texts' `region`."""
    if applied == truth:
        return True
    if applied == current:
        return False
    prefix, suffix = differ
    prefix = current.rfind("\n", 0, prefix) + 1  # whole lines: no token cut in two
    newline = current.find("\n", len(current) - suffix)
    suffix = len(current) - newline - 1 if newline >= 0 else 0

    def tokens(text: str) -> list[str]:
        return TOKENS.findall(text[prefix : len(text) - suffix])

    before, through, after = tokens(current), tokens(applied), tokens(truth)
    return edit_distance(before, through) + edit_distance(through, after) == edit_distance(
        before, after
    )


# --- replay -------------------------------------------------------------------------------------


def replay_case(case: EditPair, sources: EditSources | None = None) -> dict[str, Any]:
    """One case through the document store and the rules as the server runs them; with
    `sources` (a loaded model's), the likelihood veto and the model's arguments too, as the
    server asks them."""
    from quickdraft.generation import NextEditRequest, StageClock
    from quickdraft.lsp.documents import DocumentStore
    from quickdraft.next_edit import argument_filler, decide, likelihood_judge

    uri = "file:///bench/" + case.path
    store = DocumentStore()
    store.open(uri, case.before, case.language, 1)
    document = store.get(uri)
    start_line, start_col = document.position_at(case.edit_start)
    end_line, end_col = document.position_at(case.edit_end)
    store.change(uri, [(case.edit_text, (start_line, start_col, end_line, end_col))], 2)
    current = store.get(uri).text
    run: dict[str, Any] = {"case": case.name, "hunks": case.hunks, "kind": kind(case)}
    if current != case.current:
        run["error"] = "the store's text is not the case's"
        return run
    hunks = store.history.hunks(uri)
    clock = StageClock()
    judge = filler = None
    if sources is not None:
        line, character = store.get(uri).position_at(case.edit_start + len(case.edit_text))
        request = NextEditRequest(uri, current, line, character, case.language, hunks=hunks)
        judge = likelihood_judge(sources, request, None, clock)
        filler = argument_filler(sources, request, None, clock)
    began = time.perf_counter()
    decision = decide(uri, current, hunks, case.language, judge=judge, filler=filler)
    run["latency_ms"] = round((time.perf_counter() - began) * 1000, 3)
    run["veto_ms"] = clock.stages.get("veto_ms", 0.0)
    run["fill_ms"] = clock.stages.get("fill_ms", 0.0)
    run["judged"] = decision.scored
    run["candidates"] = decision.candidates
    run["vetoed"] = dict(decision.vetoed)
    # The best candidate whatever its confidence: what each floor would show (the sweep; the
    # rules' vetoes only, no model).
    best = decide(uri, current, hunks, case.language, floor=0.0).shown
    if best is not None:
        run["best"] = {
            "rule": best.rule,
            "confidence": best.confidence,
            "note": best.note,
            **score(current, case.truth, _applied(current, best.edit)),
        }
    if decision.shown is None:
        run.update(rule=None, proposed=False, exact=False, helpful=False, harmful=False)
        return run
    run.update(
        rule=decision.rule,
        confidence=decision.confidence,
        proposed=True,
        note=decision.shown.note,
        **score(current, case.truth, _applied(current, decision.shown.edit)),
    )
    return run


def verdict(run: dict[str, Any]) -> str:
    """A proposal's score in a word: exact, helpful, harmful or neutral."""
    if run["exact"]:
        return "exact"
    if run["helpful"]:
        return "helpful"
    return "harmful" if run["harmful"] else "neutral"


def _applied(text: str, edit: Any) -> str:
    return text[: edit.start] + edit.text + text[edit.end :]


def kind(case: EditPair) -> str:
    return "edit" if case.hunks > 1 else "none"


# --- the report ---------------------------------------------------------------------------------


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (None without trials)."""
    if trials <= 0:
        return None
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(successes: int, trials: int) -> dict[str, Any]:
    interval = wilson(successes, trials)
    return {
        "n": successes,
        "of": trials,
        "rate": round(successes / trials, 4) if trials else None,
        "ci95": [round(interval[0], 4), round(interval[1], 4)] if interval else None,
    }


def summarize_runs(runs: list[dict[str, Any]], rule: str | None = None) -> dict[str, Any]:
    """Coverage, precision, harmful rate and exact, overall (`rule` None) or for one rule (its
    proposals; the denominators of coverage and harmful stay all edit cases / all cases).
    Latency: of all answers overall, of the rule's proposals for a rule; `scored_*`: of the
    answers the likelihood veto's model scored (no model: none), `scored_ahead` of them
    decided before the request came (the server's work ahead)."""
    answered = [r for r in runs if not r.get("error")]
    edit_cases = [r for r in answered if r["kind"] == "edit"]
    proposals = [r for r in answered if r.get("proposed") and (rule is None or r["rule"] == rule)]
    on_edit = [r for r in proposals if r["kind"] == "edit"]
    timed = answered if rule is None else proposals
    latencies = [r["latency_ms"] for r in timed if r.get("latency_ms") is not None]
    judged = [r for r in timed if r.get("judged") and r.get("latency_ms") is not None]
    scored = [r["latency_ms"] for r in judged]
    return {
        "cases": len(runs),
        "edit_cases": len(edit_cases),
        "no_edit_cases": len(answered) - len(edit_cases),
        "errors": len(runs) - len(answered),
        "proposals": len(proposals),
        "coverage": rate(len(on_edit), len(edit_cases)),
        "precision": rate(sum(1 for r in proposals if r["helpful"]), len(proposals)),
        "harmful": rate(sum(1 for r in proposals if r["harmful"]), len(answered)),
        "exact": rate(sum(1 for r in on_edit if r["exact"]), len(edit_cases)),
        "p50_ms": round(percentile(latencies, 50), 3) if latencies else None,
        "p90_ms": round(percentile(latencies, 90), 3) if latencies else None,
        "scored": len(scored),
        "scored_p50_ms": round(percentile(scored, 50), 3) if scored else None,
        "scored_p90_ms": round(percentile(scored, 90), 3) if scored else None,
        "scored_ahead": sum(1 for r in judged if r.get("decided_ahead")),
    }


SWEEP = (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.85, 0.9)


def at_floor(runs: list[dict[str, Any]], floor: float) -> list[dict[str, Any]]:
    """The runs as they would be with `floor` in place of the frozen one (from `best`)."""
    out = []
    for run in runs:
        best = run.get("best")
        base = {k: v for k, v in run.items() if k != "best"}
        if best is not None and best["confidence"] >= floor:
            out.append({**base, "proposed": True, **best})
        else:
            out.append(
                {
                    **base,
                    "rule": None,
                    "proposed": False,
                    "exact": False,
                    "helpful": False,
                    "harmful": False,
                }
            )
    return out


def per_rule(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """`summarize_runs` overall and for each rule that made a proposal (both benches)."""
    rules = sorted({r["rule"] for r in runs if r.get("proposed") and r.get("rule")})
    return {
        "overall": summarize_runs(runs),
        "rules": {rule: summarize_runs(runs, rule) for rule in rules},
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    sweep = {}
    for floor in SWEEP:
        item = summarize_runs(at_floor(runs, floor))
        sweep[str(floor)] = {
            key: item[key] for key in ("proposals", "coverage", "precision", "harmful", "exact")
        }
    by_rule = {}
    for rule in sorted({r["best"]["rule"] for r in runs if r.get("best")}):
        for floor in SWEEP:
            item = summarize_runs(at_floor(runs, floor), rule)
            by_rule.setdefault(rule, {})[str(floor)] = {
                key: item[key] for key in ("proposals", "precision", "harmful")
            }
    return {**per_rule(runs), "floor_sweep": sweep, "floor_sweep_by_rule": by_rule}


def _cell(value: dict[str, Any]) -> str:
    if value["rate"] is None:
        return "-"
    low, high = value["ci95"]
    return f"{value['rate']:.0%} ({value['n']}/{value['of']}; {low:.0%}-{high:.0%})"


def rule_table(overall: dict[str, Any], rules: dict[str, dict[str, Any]]) -> list[str]:
    """Per rule and overall (`summarize_runs`'s): the markdown table, the latency of the
    answers the model scored, and the case counts."""
    rows = [
        "Latency: a rule's row, its proposals'; overall, every answer's.",
        "",
        "| rule | proposals | coverage | precision | harmful | exact | p50 ms | p90 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, item in [*rules.items(), ("overall", overall)]:
        rows.append(
            f"| {name} | {item['proposals']} | {_cell(item['coverage'])} | "
            f"{_cell(item['precision'])} | {_cell(item['harmful'])} | {_cell(item['exact'])} | "
            f"{item['p50_ms']} | {item['p90_ms']} |"
        )
    if overall.get("scored"):
        rows += [
            "",
            f"Answers the likelihood veto's model scored: {overall['scored']}, "
            f"p50 {overall['scored_p50_ms']:.0f} ms, p90 {overall['scored_p90_ms']:.0f} ms "
            "(the others answered from the rules alone)"
            + (
                f"; {overall['scored_ahead']} of them decided by the server before the request "
                "came (after the edit, while it waited)."
                if overall.get("scored_ahead")
                else "."
            ),
        ]
    rows.append("")
    rows.append(
        f"{overall['cases']} cases ({overall['edit_cases']} edit cases, "
        f"{overall['no_edit_cases']} one-hunk, {overall['errors']} errors)"
    )
    return rows


def render(summary: dict[str, Any]) -> str:
    """The summary as markdown: `rule_table`, then the floor sweep."""
    rows = rule_table(summary["overall"], summary["rules"])
    rows += ["", "Floor sweep (the frozen floor is edit_rules.FLOOR):", ""]
    rows += [
        "| floor | proposals | coverage | precision | harmful | exact |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for floor, item in summary.get("floor_sweep", {}).items():
        rows.append(
            f"| {floor} | {item['proposals']} | {_cell(item['coverage'])} | "
            f"{_cell(item['precision'])} | {_cell(item['harmful'])} | {_cell(item['exact'])} |"
        )
    return "\n".join(rows)

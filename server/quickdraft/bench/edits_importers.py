"""`quickdraft bench --edits --edits-importers`: next edits in the file that imports what the
latest edit changed (context/edit_importers.py), on real histories.

A case is a commit since `--edits-since` that changes 2 to edits_cases.MAX_FILES Python files,
and in it an ordered pair of them (the source, the importer) where the importer, as it was,
imports the source's module. The source's hunks are typed one at a time, in file order, each
alone on the source as it was (the person's latest edit); after each, a next edit is asked in
the importer, as the server asks it (`next_edit.decide_importer`: the source edited last). The
first that proposes is scored against the importer as the commit left it (helpful, harmful,
exact: bench/edits_cases.py's `score`); a pair where none proposes is a case with no proposal.
Every case is one where the commit changed the importer, so coverage counts proposals over all
cases: most commits change an importer for other reasons than the source's rename.
"""

from __future__ import annotations

import argparse
import difflib
import random
import sys
import time
from pathlib import Path
from typing import Any

from quickdraft.bench import edits_cases
from quickdraft.bench.edits import commit_files, git_dir, is_source, texts_at
from quickdraft.bench.edits_rules_cli import history_name, write_results
from quickdraft.bench.provenance import provenance
from quickdraft.context import OpenDocument
from quickdraft.context.edit_history import EditHistory
from quickdraft.context.edit_importers import imports_source
from quickdraft.context.edit_vetoes import applied
from quickdraft.errors import ConfigError

PREFIX = "quickdraft bench --edits --edits-importers"
DEFAULT_CASES = 60
"""Cases per history."""
ROOT = "file:///repo/"
"""Where a history's files stand for the rules (imports resolve by path)."""


def mine_importer_cases(repo: Path, *, since: str, max_cases: int, seed: int = 0) -> list[dict]:
    """Up to `max_cases` (source, importer) pairs of `repo`'s commits since `since`, a seeded
    shuffle of the commits picking them, each with both files before and after."""
    if max_cases < 1:
        raise ConfigError(f"--edits-max-pairs: must be at least 1, got {max_cases}")
    directory = git_dir(repo)
    commits = []
    for commit, date, files in commit_files(directory, since):
        paths = [f[2] for f in files if is_source(f[2]) and f[2].endswith(".py")]
        sources = [f for f in files if is_source(f[2])]
        if len(paths) >= 2 and len(sources) <= edits_cases.MAX_FILES:
            commits.append((commit, date, paths))
    random.Random(seed).shuffle(commits)
    cases: list[dict] = []
    for commit, date, paths in commits:
        texts = {p: t for p in paths if (t := texts_at(directory, commit, p)) is not None}
        for source in texts:
            for importer in texts:
                if source == importer or not imports_source(
                    ROOT + source, ROOT + importer, texts[importer][0]
                ):
                    continue
                cases.append(
                    {
                        "repository": str(Path(repo).expanduser().resolve()),
                        "commit": commit,
                        "date": date,
                        "source": source,
                        "importer": importer,
                        "source_texts": texts[source],
                        "importer_texts": texts[importer],
                    }
                )
        if len(cases) >= max_cases:
            break
    return cases[:max_cases]


def source_hunks(before: str, after: str) -> list[str]:
    """The source as it was with each of its commit's line hunks alone applied, in file order."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        "".join(old[:i1] + new[j1:j2] + old[i2:])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def replay_importer_case(case: dict) -> dict[str, Any]:
    """One case as the server answers it (see the module's docstring); a run as
    edits_cases.summarize_runs reads it (every case an edit case)."""
    # The pipeline imports torch: imported here, as edits_cases.replay_case does, so that the
    # bench's other modes start without it.
    from quickdraft.generation import NextEditRequest
    from quickdraft.next_edit import decide_importer

    source_uri, importer_uri = ROOT + case["source"], ROOT + case["importer"]
    before, _ = case["source_texts"]
    importer, truth = case["importer_texts"]
    run: dict[str, Any] = {
        "case": f"{case['commit'][:10]}:{case['source']} -> {case['importer']}",
        "kind": "edit",
        "proposed": False,
        "rule": None,
        "exact": False,
        "helpful": False,
        "harmful": False,
    }
    took = 0.0
    for typed in source_hunks(*case["source_texts"]):
        history = EditHistory()
        history.record_full(source_uri, before, typed)
        request = NextEditRequest(
            importer_uri,
            importer,
            0,
            0,
            "python",
            0,
            (),
            history.hunks(source_uri),
            edited_elsewhere_since=True,
        )
        began = time.perf_counter()
        decision = decide_importer(request, {source_uri: OpenDocument(source_uri, typed, "python")})
        took += time.perf_counter() - began
        if decision.shown is not None:
            shown = decision.shown
            run.update(
                proposed=True,
                rule=shown.rule,
                confidence=shown.confidence,
                note=shown.note,
                **edits_cases.score(importer, truth, applied(importer, shown)),
            )
            break
    run["latency_ms"] = round(took * 1000, 3)
    return run


def run_importers_bench(args: argparse.Namespace, repos: str) -> int:
    wanted = args.edits_max_pairs or DEFAULT_CASES
    histories = [Path(part) for part in repos.split(",") if part]
    cases = []
    for history in histories:
        mined = mine_importer_cases(
            history, since=args.edits_since, max_cases=wanted, seed=args.seed
        )
        print(f"{PREFIX}: {len(mined)} cases from {history}", file=sys.stderr)
        cases.extend(mined)
    if not cases:
        raise ConfigError(
            f"--edits-repo: no case since {args.edits_since} (a commit changing 2-"
            f"{edits_cases.MAX_FILES} Python files, one of which imports another)"
        )
    if args.edits_list:
        for case in cases:
            print(
                f"{case['commit'][:10]} {case['date'][:10]} {case['source']} -> {case['importer']}"
            )
        return 0
    runs = []
    for case in cases:
        run = replay_importer_case(case)
        run["repository"] = history_name(Path(case["repository"]))
        runs.append(run)
        if run["proposed"]:
            print(f"  {run['rule']:9} {edits_cases.verdict(run):7} {run['case']}  {run['note']}")
    summary = edits_cases.per_rule(runs)
    results = {
        "env": {
            **provenance(),
            "histories": [str(h) for h in histories],
            "since": args.edits_since,
            "seed": args.seed,
            "cases_per_history": wanted,
        },
        "cases": [{k: v for k, v in case.items() if not k.endswith("_texts")} for case in cases],
        "runs": runs,
        "summary": summary,
    }
    table = "\n".join(edits_cases.rule_table(summary["overall"], summary["rules"]))
    write_results(args, "edits-importers", results, "Next edits in importing files", table)
    return 0

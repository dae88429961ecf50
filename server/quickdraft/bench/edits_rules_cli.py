"""`quickdraft bench --edits --edits-rules`: mine cases from one or more histories, replay them
through the next-edit rules (bench/edits_cases.py), write results.json and report.md."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from quickdraft.bench import edits_cases
from quickdraft.bench.provenance import provenance
from quickdraft.errors import ConfigError
from quickdraft.models.store import write_json_atomic

PREFIX = "quickdraft bench --edits --edits-rules"
DEFAULT_CASES = 60
"""Cases per history."""


def run_rules_bench(args: argparse.Namespace, repos: str) -> int:
    wanted = args.edits_max_pairs or DEFAULT_CASES
    histories = [Path(part) for part in repos.split(",") if part]
    cases = []
    for history in histories:
        mined = edits_cases.mine_cases(
            history, since=args.edits_since, max_cases=wanted, seed=args.seed
        )
        print(f"{PREFIX}: {len(mined)} cases from {history}", file=sys.stderr)
        cases.extend(mined)
    if not cases:
        raise ConfigError(f"--edits-repo: no case since {args.edits_since} in {repos}")
    if args.edits_list:
        for case in cases:
            kind = edits_cases.kind(case)
            print(f"{kind:4} {case.hunks} hunks {case.name} {case.date[:10]}")
        return 0
    runs = []
    for case in cases:
        run = edits_cases.replay_case(case)
        run["repository"] = Path(case.repository).name
        runs.append(run)
        if run.get("proposed"):
            verdict = (
                "exact"
                if run["exact"]
                else "helpful"
                if run["helpful"]
                else ("harmful" if run["harmful"] else "neutral")
            )
            print(f"  {run['kind']:4} {run['rule']:9} {verdict:7} {case.name}  {run['note']}")
    summary = edits_cases.summarize(runs)
    per_history = {
        name: edits_cases.summarize([r for r in runs if r["repository"] == name])["overall"]
        for name in dict.fromkeys(r["repository"] for r in runs)
    }
    results: dict[str, Any] = {
        "env": {
            **provenance(),
            "histories": [str(h) for h in histories],
            "since": args.edits_since,
            "seed": args.seed,
            "cases_per_history": wanted,
        },
        "cases": [case.to_dict() for case in cases],
        "runs": runs,
        "summary": summary,
        "per_history": per_history,
    }
    out = Path(args.out or Path("bench-out") / datetime.now().strftime("edits-rules-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", results)
    table = edits_cases.render(summary)
    (out / "report.md").write_text(f"# Next-edit rules\n\n{table}\n", encoding="utf-8")
    print(table)
    print(f"\nresults: {out / 'results.json'}  report: {out / 'report.md'}")
    return 0

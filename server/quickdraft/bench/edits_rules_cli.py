"""`quickdraft bench --edits --edits-rules`: mine cases from one or more histories, replay them
through the next-edit rules (bench/edits_cases.py), write results.json and report.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.bench import edits_cases
from quickdraft.bench.edits import EditPair
from quickdraft.bench.provenance import provenance
from quickdraft.cli_args import ProgressLines, config_dict_from_args, config_file_from_args
from quickdraft.config import load_config
from quickdraft.errors import ConfigError
from quickdraft.models.store import write_json_atomic

if TYPE_CHECKING:
    from quickdraft.next_edit import EditSources

PREFIX = "quickdraft bench --edits --edits-rules"
DEFAULT_CASES = 60
"""Cases per history."""


def mine_histories(
    histories: list[Path], since: str, wanted: int, seed: int, *, say: Callable[[str], None]
) -> list[EditPair]:
    """Each history's cases (edits_cases.mine_cases), `wanted` per history, in the order given;
    both next-edit benches take their cases from here."""
    cases = []
    for history in histories:
        mined = edits_cases.mine_cases(history, since=since, max_cases=wanted, seed=seed)
        say(f"{len(mined)} cases from {history}")
        cases.extend(mined)
    if not cases:
        where = ", ".join(str(h) for h in histories)
        raise ConfigError(
            f"--edits-repo: no case since {since} in {where} (a commit changing at most "
            f"{edits_cases.MAX_FILES} source files, each in 1-{edits_cases.MAX_HUNKS} small "
            "hunks close together)"
        )
    return cases


def run_rules_bench(args: argparse.Namespace, repos: str) -> int:
    wanted = args.edits_max_pairs or DEFAULT_CASES
    histories = [Path(part) for part in repos.split(",") if part]
    cases = mine_histories(
        histories,
        args.edits_since,
        wanted,
        args.seed,
        say=lambda message: print(f"{PREFIX}: {message}", file=sys.stderr),
    )
    if args.edits_list:
        for case in cases:
            kind = edits_cases.kind(case)
            print(f"{kind:4} {case.hunks} hunks {case.name} {case.date[:10]}")
        return 0

    sources = model_sources(args) if args.edits_veto else None
    runs = []
    for case in cases:
        run = edits_cases.replay_case(case, sources)
        run["repository"] = history_name(Path(case.repository))
        runs.append(run)
        if run.get("proposed"):
            verdict = edits_cases.verdict(run)
            print(f"  {run['kind']:4} {run['rule']:9} {verdict:7} {case.name}  {run['note']}")
        if run.get("judged"):
            vetoed = run["vetoed"].get("likelihood", 0)
            print(
                f"  {run['kind']:4} the model scored {run['judged']} candidates in "
                f"{run['veto_ms']:.0f} ms, vetoed {vetoed}: {case.name}"
            )
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
            "likelihood_veto": sources.config.edits.likelihood_veto if sources else "off",
            "model": sources.model_names[0]
            if sources is not None and sources.model_names
            else None,
        },
        "cases": [case.to_dict() for case in cases],
        "runs": runs,
        "summary": summary,
        "per_history": per_history,
    }
    write_results(args, "edits-rules", results, "Next-edit rules", edits_cases.render(summary))
    return 0


def write_results(
    args: argparse.Namespace, stem: str, results: dict[str, Any], title: str, table: str
) -> Path:
    """A next-edit bench's results.json and report.md (`title`, then `table`) in --out (else
    bench-out/`stem`-<time>); the table printed, and where both went."""
    out = Path(args.out or Path("bench-out") / datetime.now().strftime(f"{stem}-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", results)
    (out / "report.md").write_text(f"# {title}\n\n{table}\n", encoding="utf-8")
    print(table)
    print(f"\nresults: {out / 'results.json'}  report: {out / 'report.md'}")
    return out


def history_name(path: Path) -> str:
    """What a history is called in the report: its folder's name, or the folder above a bare
    mirror's `repo` or a checkout's `.git` (two histories must not both be "repo")."""
    return path.parent.name if path.name in ("repo", ".git") and path.parent.name else path.name


def model_sources(args: argparse.Namespace, *, veto: bool = True) -> EditSources:
    """The next-edit pipeline's sources over the models the bench's flags name, loaded as
    `quickdraft serve` loads them; the veto scores with the model the settings name (`veto`:
    the bench is of the veto, which the settings must not turn off)."""
    # These import torch: the rules' bench without a model never pays for it.
    from quickdraft.backends import edit_sources, load_completer

    config = load_config(config_dict_from_args(args), config_file_from_args(args))
    if veto and config.edits.likelihood_veto == "off":
        raise ConfigError("--edits-veto: the settings turn the veto off (edits.likelihood_veto)")
    print(f"{PREFIX}: loading the model…", file=sys.stderr)
    return edit_sources(load_completer(config, progress=ProgressLines(PREFIX)))

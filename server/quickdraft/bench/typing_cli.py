"""`quickdraft bench --typing`'s arguments, their checks, and the run: the variants chosen,
the settings tree every variant starts from, the holes, the `quickdraft serve` command line
with the bench's model flags, then the scenario and its summary: the hole replay
(typing_replay.py) or, with `--typing-scenario workspace`, files opened together and visited
(workspace.py, workspace_replay.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from quickdraft.bench import typing_report
from quickdraft.bench.holes import resolve_languages, sample_holes
from quickdraft.bench.typing_plan import typing_truth
from quickdraft.bench.typing_replay import (
    PREFIX,
    TypingBench,
    TypingOptions,
    Variant,
    merge_settings,
)
from quickdraft.bench.workspace import plan_workspace
from quickdraft.bench.workspace_replay import WorkspaceScenario
from quickdraft.cli_args import add_model_arguments
from quickdraft.config import STRATEGIES, load_config
from quickdraft.errors import ConfigError

LAYOUTS = ("pinned", "append", "classic")
DEFAULT_TYPING_LAYOUTS = "pinned,append"
"""The default layout and the one before it (whole prefix windows), side by side."""
WORK_AHEAD = {"on": True, "off": False}
DEFAULT_HOLES = 4
QUICK_HOLES = 2
HOLE_KINDS = ("line", "block")
SCENARIOS = ("holes", "workspace")
DEFAULT_PACE_MS = 120.0
DEFAULT_LINES = 3
WORKSPACE_FILES = 5
WORKSPACE_OPEN_PAUSE_S = 90.0
WORKSPACE_THINK_S = 3.0
HOLES_ONLY = {
    "holes": "--holes",
    "typing_pace_ms": "--typing-pace-ms",
    "typing_await": "--typing-await",
    "typing_lines": "--typing-lines",
}
"""The flags of the hole replay that mean nothing to the workspace scenario."""
WORKSPACE_ONLY = {
    "typing_files": "--typing-files",
    "typing_open_pause_s": "--typing-open-pause-s",
    "typing_think_s": "--typing-think-s",
}


def parse_names(value: str | None, default: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """A comma-separated flag's names (`default` when not given), each once, in order; a
    ConfigError naming `flag` for an unknown name or an empty list."""
    names = [n.strip() for n in (value or default).split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ConfigError(
            f"{flag}: unknown {', '.join(unknown) or 'empty list'} (known: {', '.join(allowed)})"
        )
    return list(dict.fromkeys(names))


def parse_counts(value: str, flag: str, *, minimum: int = 1, what: str = "a count") -> list[int]:
    """A comma-separated flag's whole numbers of at least `minimum`, each once, in order; a
    ConfigError naming `flag` and the item for anything else."""
    counts: list[int] = []
    for item in (part.strip() for part in value.split(",")):
        if not item.isdigit() or int(item) < minimum:
            raise ConfigError(f"{flag}: {item!r} is not {what} >= {minimum}")
        if int(item) not in counts:
            counts.append(int(item))
    return counts


def parse_variants(
    layouts: str | None,
    strategies: str | None,
    work_ahead: str | None,
    candidates: str | None = None,
) -> list[Variant]:
    """Every combination of the comma-separated choices, layouts outermost."""
    chosen_layouts = parse_names(layouts, DEFAULT_TYPING_LAYOUTS, LAYOUTS, "--typing-layouts")
    chosen_strategies = parse_names(strategies, "ar,hybrid", STRATEGIES, "--strategies")
    ahead = parse_names(work_ahead, "on,off", tuple(WORK_AHEAD), "--typing-work-ahead")
    # Not given: the setting stays as it is (the default's, or --config's).
    counts: list[int | None] = (
        [None] if candidates is None else list(parse_counts(candidates, "--typing-candidates"))
    )
    return [
        Variant(layout, strategy, WORK_AHEAD[on], count)
        for layout in chosen_layouts
        for strategy in chosen_strategies
        for on in ahead
        for count in counts
    ]


def add_typing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "typing",
        "with --typing: replay typing sessions through `quickdraft serve` over stdio LSP, as VS"
        " Code drives it (--strategies picks strategies; default ar,hybrid)",
    )
    group.add_argument(
        "--typing",
        action="store_true",
        help="the typing benchmark: a fresh server per variant, keystrokes over LSP",
    )
    group.add_argument(
        "--typing-layouts",
        metavar="L,L",
        help=f"context.layout values (default {DEFAULT_TYPING_LAYOUTS})",
    )
    group.add_argument(
        "--typing-work-ahead",
        metavar="on,off",
        help="cache.warmup and cache.prefetch on and/or off (default on,off)",
    )
    group.add_argument(
        "--typing-candidates",
        metavar="N,N",
        help="decoding.candidates values side by side (e.g. 1,3: does computing the "
        "alternatives after each answer delay the next keystroke's?); default: as configured",
    )
    group.add_argument(
        "--typing-scenario",
        choices=SCENARIOS,
        default="holes",
        help="holes: type each hole's hidden text (default); workspace: open files together, "
        "pause, visit each (didFocus, a thought, one character, a request), come back, move, "
        "and a never-opened file as the cold baseline",
    )
    group.add_argument(
        "--typing-pace-ms",
        type=float,
        help=f"holes: time between keystrokes (default {DEFAULT_PACE_MS:.0f})",
    )
    group.add_argument(
        "--typing-await",
        action="store_true",
        help="holes: wait for each keystroke's answer before the next (then the pace)",
    )
    group.add_argument(
        "--typing-lines",
        type=int,
        help=f"holes: hidden lines typed per hole (default {DEFAULT_LINES})",
    )
    group.add_argument(
        "--typing-files",
        type=int,
        metavar="N",
        help=f"workspace: files opened together and visited (default {WORKSPACE_FILES})",
    )
    group.add_argument(
        "--typing-open-pause-s",
        type=float,
        metavar="S",
        help="workspace: pause after opening the files, before the first visit "
        f"(default {WORKSPACE_OPEN_PAUSE_S:g})",
    )
    group.add_argument(
        "--typing-think-s",
        type=float,
        metavar="S",
        help="workspace: pause after didFocus, before the character is typed "
        f"(default {WORKSPACE_THINK_S:g})",
    )
    group.add_argument(
        "--typing-timeout-s",
        type=float,
        default=600.0,
        help="longest wait for one answer before the server counts as stuck (default 600)",
    )
    group.add_argument(
        "--typing-load-timeout-s",
        type=float,
        default=1800.0,
        help="longest wait for the server to load its models (default 1800)",
    )


def model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags the bench got, to start `quickdraft serve` with (every flag that
    `add_model_arguments` defines, so new ones travel without changes here)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_model_arguments(probe)
    flags: list[str] = []
    for action in probe._actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False:
            continue
        flag = max(action.option_strings, key=len)
        flags += [flag] if action.nargs == 0 else [flag, str(value)]
    return flags


def base_settings(
    args: argparse.Namespace, *, max_tokens_section: str = "decoding"
) -> dict[str, Any]:
    """The settings tree from --config and --max-tokens (`<max_tokens_section>.maxNewTokens`:
    `decoding` for completions, `edits` for next edits), validated here, at the edge."""
    settings: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        try:
            settings = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--config: cannot read {args.config}: {exc}") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"--config: {args.config} must hold a JSON object")
    if getattr(args, "max_new_tokens", None):
        settings = merge_settings(
            settings, {max_tokens_section: {"maxNewTokens": args.max_new_tokens}}
        )
    load_config(settings)  # ConfigError names the key
    return settings


def check_scenario_flags(args: argparse.Namespace) -> None:
    """A flag of one scenario given with the other is a ConfigError naming it."""
    workspace = args.typing_scenario == "workspace"
    wrong = HOLES_ONLY if workspace else WORKSPACE_ONLY
    for dest, flag in wrong.items():
        value = getattr(args, dest, None)
        if value is not None and value is not False:
            other = "holes" if workspace else "workspace"
            raise ConfigError(f"{flag}: only with --typing-scenario {other}")


def non_negative_seconds(value: float | None, default: float, flag: str) -> float:
    value = default if value is None else value
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{flag}: must be a number of seconds, 0 or more, got {value}")
    return value


def run_typing(args: argparse.Namespace) -> int:
    """`quickdraft bench --typing ...`: returns the exit status."""
    repo = Path(args.repo).expanduser()
    if not repo.is_dir():
        raise ConfigError(f"--repo: {repo} is not a directory")
    if args.sweep_draft_length:
        raise ConfigError(
            "--sweep-draft-length: not with --typing (it times strategies in-process)"
        )
    check_scenario_flags(args)
    workspace = args.typing_scenario == "workspace"
    pace_ms = DEFAULT_PACE_MS if args.typing_pace_ms is None else args.typing_pace_ms
    if not math.isfinite(pace_ms) or pace_ms < 0:
        raise ConfigError(f"--typing-pace-ms: must not be negative, got {pace_ms}")
    max_lines = DEFAULT_LINES if args.typing_lines is None else args.typing_lines
    if max_lines < 1:
        raise ConfigError(f"--typing-lines: must be at least 1, got {max_lines}")
    files = WORKSPACE_FILES if args.typing_files is None else args.typing_files
    if files < 1:
        raise ConfigError(f"--typing-files: must be at least 1, got {files}")
    open_pause_s = non_negative_seconds(
        args.typing_open_pause_s, WORKSPACE_OPEN_PAUSE_S, "--typing-open-pause-s"
    )
    think_s = non_negative_seconds(args.typing_think_s, WORKSPACE_THINK_S, "--typing-think-s")
    wanted = (
        args.holes if args.holes is not None else (QUICK_HOLES if args.quick else DEFAULT_HOLES)
    )
    if wanted < 1:
        raise ConfigError(f"--holes: must be at least 1, got {wanted}")
    variants = parse_variants(
        args.typing_layouts, args.strategies, args.typing_work_ahead, args.typing_candidates
    )
    settings = base_settings(args)
    for variant in variants:
        load_config(merge_settings(settings, variant.settings()))
    languages = resolve_languages(args.languages) if args.languages else None

    def sample(count: int):
        return sample_holes(
            repo,
            count,
            languages=languages,
            seed=args.seed,
            kinds=HOLE_KINDS,
            open_files=0 if workspace else args.open_files,
        )

    scenario = None
    if workspace:
        # Each file once before any is used again: enough holes for the files and the cold one.
        plan = plan_workspace(
            sample(4 * (files + 1)), files, open_pause_s=open_pause_s, think_s=think_s
        )
        if not plan.visits:
            raise ConfigError(f"--repo: found no completion points in {repo}")
        scenario = WorkspaceScenario(plan, open_pause_s=open_pause_s, think_s=think_s)
        holes = [*plan.visits, *([plan.cold] if plan.cold else [])]
    else:
        holes = [
            hole
            for hole in sample(wanted * 2)
            if "\r" not in hole.text and typing_truth(hole.truth, max_lines).strip()
        ][:wanted]
        if not holes:
            raise ConfigError(f"--repo: found no completion points in {repo}")
    flags = model_flags(args)
    if args.quick and "--no-calibrate" not in flags:
        flags.append("--no-calibrate")
    out = args.out or Path("bench-out") / datetime.now().strftime("typing-%Y%m%d-%H%M%S")
    options = TypingOptions(
        repo=repo.resolve(),
        out=Path(out),
        variants=variants,
        server_command=[sys.executable, "-m", "quickdraft.cli", "serve", *flags],
        settings=settings,
        pace_ms=pace_ms,
        await_answers=args.typing_await,
        max_lines=max_lines,
        request_timeout_s=args.typing_timeout_s,
        load_timeout_s=args.typing_load_timeout_s,
        progress=not args.no_progress,
    )
    bench = TypingBench(holes, options, scenario)
    names = f"{len(variants)} variants ({', '.join(v.name for v in variants)})"
    if scenario is not None:
        bench.say(
            f"workspace: {len(plan.visits)} files open together "
            f"({', '.join(sorted({h.language for h in plan.visits}))}) from {repo}, a "
            f"{open_pause_s:g} s pause, {think_s:g} s thoughts; cold baseline "
            f"{plan.cold.file if plan.cold else 'none'}; {names}"
        )
        for note in plan.notes:
            bench.say(f"  note: {note}")
    else:
        bench.say(
            f"{len(holes)} holes from {repo}, {names}, "
            + (
                "each keystroke awaited"
                if args.typing_await
                else f"a keystroke every {pace_ms:.0f} ms"
            )
        )
    try:
        results = bench.run()
    except KeyboardInterrupt:
        bench.say(f"interrupted; what was measured is in {options.out}")
        raise
    print(bench.report.summary_table(results))
    print(f"\nresults: {options.out / 'results.json'}  report: {options.out / 'report.md'}")
    failed = typing_report.failures(results)
    for line in failed:
        print(f"{PREFIX}: {line}", file=sys.stderr)
    return 1 if failed else 0

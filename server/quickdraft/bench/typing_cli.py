"""`quickdraft bench --typing`'s arguments, their checks, and the run: the variants chosen,
the settings tree every variant starts from, the holes, the `quickdraft serve` command line
with the bench's model flags, then the replay (typing_replay.py) and its summary."""

from __future__ import annotations

import argparse
import json
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
from quickdraft.cli_args import add_model_arguments
from quickdraft.config import STRATEGIES, load_config
from quickdraft.errors import ConfigError

LAYOUTS = ("append", "classic")
WORK_AHEAD = {"on": True, "off": False}
DEFAULT_HOLES = 4
QUICK_HOLES = 2
HOLE_KINDS = ("line", "block")


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


def parse_variants(
    layouts: str | None, strategies: str | None, work_ahead: str | None
) -> list[Variant]:
    """Every combination of the comma-separated choices, layouts outermost."""
    chosen_layouts = parse_names(layouts, ",".join(LAYOUTS), LAYOUTS, "--typing-layouts")
    chosen_strategies = parse_names(strategies, "ar,hybrid", STRATEGIES, "--strategies")
    ahead = parse_names(work_ahead, "on,off", tuple(WORK_AHEAD), "--typing-work-ahead")
    return [
        Variant(layout, strategy, WORK_AHEAD[on])
        for layout in chosen_layouts
        for strategy in chosen_strategies
        for on in ahead
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
        "--typing-layouts", metavar="L,L", help="context.layout values (default append,classic)"
    )
    group.add_argument(
        "--typing-work-ahead",
        metavar="on,off",
        help="cache.warmup and cache.prefetch on and/or off (default on,off)",
    )
    group.add_argument(
        "--typing-pace-ms",
        type=float,
        default=120.0,
        help="time between keystrokes (default 120)",
    )
    group.add_argument(
        "--typing-await",
        action="store_true",
        help="wait for each keystroke's answer before the next (then the pace)",
    )
    group.add_argument(
        "--typing-lines", type=int, default=3, help="hidden lines typed per hole (default 3)"
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


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings tree from --config and --max-tokens (validated here, at the edge)."""
    settings: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        try:
            settings = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--config: cannot read {args.config}: {exc}") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"--config: {args.config} must hold a JSON object")
    if getattr(args, "max_new_tokens", None):
        settings = merge_settings(settings, {"decoding": {"maxNewTokens": args.max_new_tokens}})
    load_config(settings)  # ConfigError names the key
    return settings


def run_typing(args: argparse.Namespace) -> int:
    """`quickdraft bench --typing ...`: returns the exit status."""
    repo = Path(args.repo).expanduser()
    if not repo.is_dir():
        raise ConfigError(f"--repo: {repo} is not a directory")
    wanted = (
        args.holes if args.holes is not None else (QUICK_HOLES if args.quick else DEFAULT_HOLES)
    )
    if wanted < 1:
        raise ConfigError(f"--holes: must be at least 1, got {wanted}")
    if args.sweep_draft_length:
        raise ConfigError(
            "--sweep-draft-length: not with --typing (it times strategies in-process)"
        )
    if args.typing_pace_ms < 0:
        raise ConfigError(f"--typing-pace-ms: must not be negative, got {args.typing_pace_ms}")
    if args.typing_lines < 1:
        raise ConfigError(f"--typing-lines: must be at least 1, got {args.typing_lines}")
    variants = parse_variants(args.typing_layouts, args.strategies, args.typing_work_ahead)
    settings = base_settings(args)
    for variant in variants:
        load_config(merge_settings(settings, variant.settings()))
    languages = resolve_languages(args.languages) if args.languages else None
    holes = [
        hole
        for hole in sample_holes(
            repo,
            wanted * 2,
            languages=languages,
            seed=args.seed,
            kinds=HOLE_KINDS,
            open_files=args.open_files,
        )
        if "\r" not in hole.text and typing_truth(hole.truth, args.typing_lines).strip()
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
        pace_ms=args.typing_pace_ms,
        await_answers=args.typing_await,
        max_lines=args.typing_lines,
        request_timeout_s=args.typing_timeout_s,
        load_timeout_s=args.typing_load_timeout_s,
        progress=not args.no_progress,
    )
    bench = TypingBench(holes, options)
    bench.say(
        f"{len(holes)} holes from {repo}, {len(variants)} variants "
        f"({', '.join(v.name for v in variants)}), "
        + (
            "each keystroke awaited"
            if args.typing_await
            else f"a keystroke every {args.typing_pace_ms:.0f} ms"
        )
    )
    try:
        results = bench.run()
    except KeyboardInterrupt:
        bench.say(f"interrupted; what was measured is in {options.out}")
        raise
    print(typing_report.summary_table(results))
    print(f"\nresults: {options.out / 'results.json'}  report: {options.out / 'report.md'}")
    failed = typing_report.failures(results)
    for line in failed:
        print(f"{PREFIX}: {line}", file=sys.stderr)
    return 1 if failed else 0

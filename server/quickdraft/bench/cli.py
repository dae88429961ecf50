"""`quickdraft bench`: sample completion points from a repository and time every strategy on them.

quickdraft bench --repo . --preset qwen2.5-coder-1.5b --holes 24 --out bench-out
quickdraft bench --repo . --target t/ --draft d/ --quick          # 3-hole smoke run
quickdraft bench --repo . --preset P --sweep-draft-length 1,2,4,6,8,12
quickdraft bench --repo . --preset P --strategies ar,remote --remote-url http://gpu-box:8000/v1
quickdraft bench --repo . --preset P --runtime torch,llamacpp --strategies ar,ngram,hybrid
quickdraft bench --repo . --preset P --typing --typing-layouts append,classic --strategies ar,hybrid
quickdraft bench --edits --edits-repo path/to/repo-or-git-dir --preset P   # next-edit suggestions

Local strategies run on local models (`ar`, the baseline, always); `remote` runs the same holes
through the same Completer pipeline with a serving engine generating (quickdraft.remote).
`--backend openai --url URL` is the same as adding `remote` with `--remote-url URL`.
`--runtime torch,llamacpp` loads the models on both runtimes and runs every engine strategy on
each (`hybrid@llamacpp`), compared for identity with `ar` on the same runtime; `--layouts
classic,append` does the same for the prompt layouts (`hybrid@append`), and says how often each
inserts the same text as the first layout's `ar`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from quickdraft.bench import report
from quickdraft.bench.edits_replay import add_edits_arguments, run_edits
from quickdraft.bench.holes import resolve_languages, sample_holes
from quickdraft.bench.runner import (
    ALL_STRATEGIES,
    REMOTE,
    Bench,
    BenchOptions,
    make_peers,
    parse_lengths,
    parse_strategies,
)
from quickdraft.bench.typing_cli import (
    LAYOUTS,
    add_typing_arguments,
    parse_counts,
    parse_names,
    run_typing,
)
from quickdraft.bench.variants import with_variants
from quickdraft.cli_args import (
    REMOTE_MODEL_KEYS,
    ProgressLines,
    add_config_argument,
    add_model_arguments,
    config_dict_from_args,
    config_file_from_args,
    parse_runtimes,
)
from quickdraft.config import load_config
from quickdraft.errors import ConfigError

QUICK_HOLES = 3
QUICK_MAX_TOKENS = 16


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the strategies (and transformers/llama.cpp peers) on a repository",
        description=(
            "Hide spans of a repository's files (rest of a line, a block body, call arguments),"
            " ask for completions there exactly as `quickdraft serve` would, and compare every"
            " strategy: latency, tokens per forward, acceptance, identity to plain decoding and"
            " match with the hidden text. Writes results.json, report.md and plots."
        ),
    )
    parser.add_argument(
        "--repo", type=Path, help="repository to sample holes from (required but with --edits)"
    )
    add_model_arguments(parser, runtime_list=True)
    add_config_argument(parser)
    group = parser.add_argument_group("bench")
    group.add_argument(
        "--languages", help="comma-separated: py,ts,js,rs,go,java,c,cpp (default: all)"
    )
    group.add_argument("--holes", type=int, help="number of completion points (default 24)")
    group.add_argument(
        "--max-tokens",
        type=int,
        dest="max_new_tokens",
        help="new tokens per completion (default 64)",
    )
    group.add_argument(
        "--strategies",
        help=f"comma-separated, from {','.join(ALL_STRATEGIES)} (default: all; ar is always run)",
    )
    group.add_argument("--seed", type=int, default=0, help="hole sampling seed (default 0)")
    group.add_argument(
        "--remote-url",
        metavar="URL",
        help="the serving engine the `remote` strategy times (default: --url)",
    )
    group.add_argument("--out", type=Path, help="output directory (default bench-out/<time>)")
    group.add_argument(
        "--quick", action="store_true", help=f"{QUICK_HOLES}-hole smoke run, short completions"
    )
    group.add_argument(
        "--sweep-draft-length",
        metavar="K,K,...",
        help="also run ngram/draft/hybrid at each fixed draft length and write the best per language",
    )
    group.add_argument(
        "--open-files", type=int, default=4, help="other files open per hole (default 4)"
    )
    group.add_argument(
        "--layouts",
        metavar="LAYOUT[,LAYOUT]",
        help="prompt layouts to compare on the same holes (append, classic); the first is the "
        "baseline",
    )
    group.add_argument(
        "--heads",
        metavar="HEAD[,HEAD]",
        help="prompt heads to compare on the same holes (workspace, cursor: context.head); the "
        "first is the baseline",
    )
    group.add_argument(
        "--budgets",
        metavar="TOKENS[,TOKENS]",
        help="prompt budgets (context.max_prompt_tokens) to compare on the same holes; the "
        "first is the baseline",
    )
    group.add_argument(
        "--trees",
        metavar="MODE[,MODE]",
        help="tree verification settings (decoding.tree: auto, off or a token count) to compare "
        "on the same holes, e.g. off,auto; the first is the baseline",
    )
    group.add_argument(
        "--candidates",
        type=int,
        default=1,
        metavar="N",
        help="suggestions per hole for the main strategy (the greedy one, then forks of it): "
        "which one was right and what the others cost (default 1)",
    )
    group.add_argument("--no-replay", action="store_true", help="skip the keystroke replay")
    group.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_typing_arguments(parser)
    add_edits_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.edits:
        return run_edits(args)
    if args.repo is None:
        raise ConfigError("--repo: required (the repository to sample holes from)")
    if args.typing:
        return run_typing(args)
    repo = Path(args.repo).expanduser()
    if not repo.is_dir():
        raise ConfigError(f"--repo: {repo} is not a directory")
    holes_wanted = args.holes if args.holes is not None else (QUICK_HOLES if args.quick else 24)
    if holes_wanted < 1:
        raise ConfigError(f"--holes: must be at least 1, got {holes_wanted}")
    max_new = args.max_new_tokens or (QUICK_MAX_TOKENS if args.quick else 64)
    strategies = parse_strategies(args.strategies)
    runtimes = parse_runtimes(args.runtime)
    layouts = parse_layouts(args.layouts)
    heads = parse_names(args.heads, "", HEADS, "--heads") if args.heads else []
    budgets = parse_budgets(args.budgets)
    trees = parse_trees(args.trees)
    settings_variants = [
        *[(name, {"context": {"layout": name}}) for name in layouts],
        *[(name, {"context": {"head": name}}) for name in heads],
        *[(f"{tokens}t", {"context": {"max_prompt_tokens": tokens}}) for tokens in budgets],
        *[(tree_variant(mode), {"decoding": {"tree": mode}}) for mode in trees],
    ]
    # The first runtime, layout, head, budget and tree are the default ones; each further one is
    # a variant.
    groups = (layouts, heads, [f"{b}t" for b in budgets], [tree_variant(m) for m in trees])
    baselines = {group[0] for group in groups if group}
    further = [name for name, _ in settings_variants if name not in baselines]
    strategies = with_variants(strategies, [*runtimes[1:], *further])
    remote_url = args.remote_url or args.url
    if (args.backend == "openai" or args.remote_url) and REMOTE not in strategies:
        strategies.append(REMOTE)
    sweep = parse_lengths(args.sweep_draft_length)
    languages = resolve_languages(args.languages) if args.languages else None
    out = args.out or Path("bench-out") / datetime.now().strftime("%Y%m%d-%H%M%S")

    base = config_file_from_args(args)  # e.g. the draft_length.json a sweep wrote
    data = config_dict_from_args(args)
    if layouts:
        data.setdefault("context", {})["layout"] = layouts[0]
    if heads:
        data.setdefault("context", {})["head"] = heads[0]
    if budgets:
        data.setdefault("context", {})["max_prompt_tokens"] = budgets[0]
    remote_settings = remote_model_settings(data, remote_url)  # the rest is for local models
    data.setdefault("decoding", {})
    if trees:
        data["decoding"]["tree"] = trees[0]
    data["decoding"].update(max_new_tokens=max_new, temperature=0.0)
    data["decoding"].pop("seed", None)
    if args.quick:
        data.setdefault("model", {}).setdefault("calibrate", False)
    config = load_config(data, base)

    holes = sample_holes(
        repo, holes_wanted, languages=languages, seed=args.seed, open_files=args.open_files
    )
    if not holes:
        wanted = ", ".join(languages) if languages else "any supported language"
        raise ConfigError(f"--repo: found no completion points in {repo} ({wanted})")
    print(
        f"quickdraft bench: {len(holes)} holes from {repo} "
        f"({', '.join(sorted({h.language for h in holes}))}); loading models…",
        file=sys.stderr,
    )

    # These import torch: every other command would pay for it.
    from quickdraft.backends import load_completer, needs_step_costs
    from quickdraft.completer import Completer
    from quickdraft.local_backend import LocalBackend

    progress = ProgressLines("quickdraft bench")
    # Measured step costs (cached per machine and model) drive the adaptive draft length, as
    # in `quickdraft complete`; `ar` is always in the run, so calibrate whatever the default:
    # here when loading did not (plain `ar` with a fixed prompt budget).
    calibrate_after_load = config.model.calibrate and not needs_step_costs(config)
    completer = load_completer(config, progress=progress)
    if calibrate_after_load:
        completer.backend.calibrate(progress=progress)
    loaded = completer.models
    others = {}
    for runtime in runtimes[1:]:
        progress(f"loading the models again for the {runtime} runtime")
        other = load_completer(
            load_config({"model": {"runtime": runtime}}, config), progress=progress
        )
        if calibrate_after_load:
            other.backend.calibrate(progress=progress)
        others[runtime] = other
    for name, settings in settings_variants:
        if name in baselines:
            continue
        # The same models, another prompt or decoding setting (its own engine and caches).
        variant_config = load_config(settings, config)
        backend = LocalBackend(loaded, variant_config)
        backend.engine.cost_model = completer.backend.engine.cost_model
        others[name] = Completer(backend, variant_config)
    remote = None
    if REMOTE in strategies and remote_settings is not None:
        remote = load_completer(load_config({"model": remote_settings}, config), progress=progress)
    options = BenchOptions(
        repo=repo.resolve(),
        out=Path(out),
        holes=holes_wanted,
        languages=languages,
        strategies=strategies,
        max_new_tokens=max_new,
        seed=args.seed,
        sweep=sweep,
        replay=not args.no_replay,
        candidates=args.candidates,
        warmup=not args.no_warmup,
        progress=not args.no_progress,
    )
    peers = make_peers(completer, strategies, gguf_source(loaded))
    bench = Bench(completer, holes, options, peers=peers, remote=remote, variants=others)
    cost_model = completer.backend.engine.cost_model
    bench.env["calibrated"] = bool(config.model.calibrate)
    to_dict = getattr(cost_model, "to_dict", None)
    bench.env["cost_model"] = to_dict() if callable(to_dict) else None
    try:
        results = bench.run()
    except KeyboardInterrupt:
        print(
            f"quickdraft bench: interrupted; {len(bench.records)} finished holes are in {out}",
            file=sys.stderr,
        )
        raise
    print(summary_table(results))
    print(f"\nresults: {out / 'results.json'}  report: {out / 'report.md'}")
    if (Path(out) / "draft_length.json").exists():
        print(
            f"draft lengths to use (null: adaptive did as well): {Path(out) / 'draft_length.json'}"
        )
    return 0


def remote_model_settings(data: dict, url: str | None) -> dict | None:
    """Take the serving engine's settings out of `data["model"]` (the local models keep the
    rest): the `model` settings of the `remote` strategy, or None without a URL."""
    model = data.get("model", {})
    remote = {key: model.pop(key) for key in REMOTE_MODEL_KEYS if key in model}
    if url is None:
        return None
    return {**remote, "backend": "openai", "url": url}


HEADS = ("workspace", "cursor")


def tree_variant(mode: int | str) -> str:
    """The variant name of a `--trees` mode: `tree-off`, `tree-16`."""
    return f"tree-{mode}"


def parse_trees(value: str | None) -> list[int | str]:
    """`--trees off,auto,16`: decoding.tree settings (auto, off or 2-64 tokens), each once."""
    if not value:
        return []
    modes: list[int | str] = []
    for item in (part.strip() for part in value.split(",")):
        mode = int(item) if item.isdigit() else item
        try:
            load_config({"decoding": {"tree": mode}})
        except ConfigError as exc:
            raise ConfigError(f"--trees: {exc}") from None
        if mode not in modes:
            modes.append(mode)
    return modes


def parse_budgets(value: str | None) -> list[int]:
    """`--budgets 1536,768`: whole numbers of at least 64 tokens, each once."""
    if not value:
        return []
    return parse_counts(value, "--budgets", minimum=64, what="a number of tokens")


def parse_layouts(value: str | None) -> list[str]:
    return parse_names(value, "", LAYOUTS, "--layouts") if value else []


def gguf_source(loaded) -> str | None:
    """The `.gguf` file the target came from, if it is still on disk (the llama.cpp peers
    need one): a `--target x.gguf`, or a preset fetched by the PyPI route."""
    info = getattr(loaded, "target_info", None)
    gguf = getattr(info, "gguf", None)
    return str(gguf) if gguf is not None and Path(gguf).is_file() else None


def summary_table(results: dict) -> str:
    """A short plain-text table for the terminal (report.md has the full one)."""
    summary = results["summary"]
    rows = [("strategy", "p50 ms", "p90 ms", "tok/fwd", "speedup", "same as ar", "exact")]
    for name, s in summary.items():
        if name in report.GROUPS:
            continue

        def fmt(value, spec):
            return "-" if value is None else format(value, spec)

        rows.append(
            (
                name,
                fmt(s["p50_ms"], ".0f"),
                fmt(s["p90_ms"], ".0f"),
                fmt(s["tokens_per_forward"], ".2f"),
                fmt(s["speedup_vs_ar"], ".2f"),
                fmt(s["identical_to_ar"], ".0%"),
                fmt(s["exact_match"], ".0%"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )
    copy_heavy = summary.get("copy_heavy") or {}
    if copy_heavy:
        holes = next(iter(copy_heavy.values()))["holes"]
        per = ", ".join(
            f"{name} {s['tokens_per_forward']}"
            for name, s in copy_heavy.items()
            if s["tokens_per_forward"] is not None
        )
        table += f"\ncopy-heavy holes ({holes}), tokens per target forward: {per}"
    return table

"""`quickdraft serve | complete | bench | models`.

Each subcommand lives next to what it drives (`lsp/cli.py`, `bench/cli.py`, `models/cli.py`,
`complete_cli.py`) and registers itself here. Every deliberate error (`QuickdraftError`) ends the
command with one clear line on stderr and exit status 2; nothing prints a traceback at a user.
"""

from __future__ import annotations

import argparse
import os
import sys

from quickdraft import __version__, complete_cli
from quickdraft.bench import cli as bench_cli
from quickdraft.errors import QuickdraftError
from quickdraft.lsp import cli as lsp_cli
from quickdraft.models import cli as models_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickdraft",
        description="Local code completion over LSP, fast by speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"quickdraft {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each module adds its own subcommand and sets `func` on its parser.
    for module in (lsp_cli, complete_cli, bench_cli, models_cli):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except QuickdraftError as exc:
        print(f"quickdraft: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quickdraft: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

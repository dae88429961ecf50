"""`quickdraft complete FILE --line L --col C`: one completion at a cursor, from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quickdraft.cli_args import (
    ProgressLines,
    add_config_argument,
    add_decoding_arguments,
    add_model_arguments,
    config_dict_from_args,
    config_file_from_args,
)
from quickdraft.config import load_config
from quickdraft.context.syntax import language_id_for_path
from quickdraft.errors import InputError
from quickdraft.generation import CompletionRequest
from quickdraft.text import read_text_file, split_lines


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "complete",
        help="complete the code at a cursor position in a file",
        description=(
            "Print the completion at FILE:LINE:COL, built exactly as the language server builds "
            "it (FIM prompt, open files as context and n-gram sources, post-processing)."
        ),
    )
    parser.add_argument("file", type=Path, help="the file being edited")
    parser.add_argument("--line", type=int, required=True, help="cursor line, 1-based")
    parser.add_argument(
        "--col", type=int, required=True, help="cursor column, 1-based, in characters"
    )
    parser.add_argument(
        "--open",
        type=Path,
        action="append",
        default=[],
        metavar="OTHER_FILE",
        help="another open file (context and n-gram source); repeatable",
    )
    parser.add_argument("--language", help="language id (default: from the file extension)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--raw", action="store_true", help="skip post-processing rules")
    parser.add_argument(
        "--check-identity",
        action="store_true",
        help="also decode plainly (strategy ar) on the same prompt and report whether the "
        "tokens are the same (greedy)",
    )
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    add_config_argument(parser)
    parser.set_defaults(func=run)


def workspace_root(file: Path) -> str:
    """The workspace an editor would have open for `file`, as the server is told it at
    `initialize` (a `file://` URI): the nearest folder above it holding `.git`, else the
    current directory. Prompts name paths relative to it."""
    file = file.resolve()
    for folder in file.parents:
        if (folder / ".git").exists():
            return folder.as_uri()
    return Path.cwd().resolve().as_uri()


def run(args: argparse.Namespace) -> int:
    # Cheap checks first: a bad path, position or setting should not wait for models to load.
    # (load_config checks the settings, --max-tokens among them: nothing here checks them again.)
    config = load_config(config_dict_from_args(args), config_file_from_args(args))
    text = read_text_file(args.file)
    others = [(path, read_text_file(path)) for path in args.open]
    lines, _ = split_lines(text)
    if not 1 <= args.line <= len(lines):
        raise InputError(f"--line {args.line} is out of range: {args.file} has {len(lines)} lines")
    line_text = lines[args.line - 1]
    if not 1 <= args.col <= len(line_text) + 1:
        raise InputError(
            f"--col {args.col} is out of range: line {args.line} has {len(line_text)} characters "
            f"(columns 1..{len(line_text) + 1})"
        )

    # This imports torch (seconds): a bad path or position is reported before that.
    from quickdraft.backends import load_completer

    progress = ProgressLines("quickdraft complete")
    completer = load_completer(config, progress=progress)
    progress(f"ready: {completer.models.summary()}; completing")
    completer.root = workspace_root(args.file)  # as the server's, from the editor's workspace
    for path, other_text in others:
        completer.set_document(path.resolve().as_uri(), other_text, language_id_for_path(path.name))
    uri = args.file.resolve().as_uri()
    language = args.language or language_id_for_path(args.file.name)
    completer.set_document(uri, text, language)
    request = CompletionRequest(uri, text, args.line - 1, args.col - 1, language)
    completion = completer.complete(request)
    path = completer.compute_path
    identity: dict[str, object] = {"compute_path": path}
    if path is not None:
        identity["batch_invariant"] = completer.batch_invariant
    if args.check_identity:
        progress("decoding plainly (ar) on the same prompt, to compare")
        plain = completer.complete(request, strategy="ar")
        identity["identical_to_ar"] = plain.tokens == completion.tokens
        if not args.json:
            same = "the same tokens as" if identity["identical_to_ar"] else "other tokens than"
            print(f"quickdraft complete: {same} plain decoding (ar)", file=sys.stderr)
    if args.json:
        out = {
            "completion": completion.raw_text if args.raw else completion.text,
            "tokens": completion.tokens,
            "stop_reason": completion.stop_reason,
            "mode": completion.mode,
            "prompt_tokens": completion.prompt_tokens,
            "latency_ms": round(completion.latency_ms, 1),
            "confidence": completion.confidence,
            **completion.stats.to_dict(),
            **identity,
        }
        json.dump(out, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write((completion.raw_text if args.raw else completion.text) + "\n")
    return 0

"""`quickdraft serve`: the language server over stdio (default) or TCP."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from quickdraft.cli_args import add_decoding_arguments, add_model_arguments, config_dict_from_args
from quickdraft.config import load_config
from quickdraft.errors import ConfigError
from quickdraft.lsp.transport import Utf8SafeInput, serve_tcp


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the language server (stdio by default)",
        description=(
            "Run the quickdraft language server. The model and decoding flags are defaults; "
            "client settings (initializationOptions, workspace configuration section "
            "'quickdraft') override them."
        ),
    )
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)"
    )
    transport.add_argument("--tcp", metavar="HOST:PORT", help="listen on HOST:PORT instead")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="Python log level on stderr (default warning)",
    )
    parser.add_argument("--log-file", help="write the Python log here instead of stderr")
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.set_defaults(func=run)


def parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--tcp: expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    defaults = load_config(config_dict_from_args(args))  # ConfigError: one line, exit 2
    address = parse_host_port(args.tcp) if args.tcp else None

    route_library_output()
    configure_logging(args.log_level, args.log_file)

    # pygls' protocol types take a second to import: only `serve` pays for them.
    from quickdraft.lsp.assembly import create_server

    return serve(create_server(defaults), address)


def route_library_output() -> None:
    """Libraries speak through Python's logging, at their own level and in the server's format,
    so a client reads each stderr line's level (the Neovim plugin and VS Code do): no progress
    bars (loading reports its steps as LSP progress and log messages, lsp/status.py), and
    transformers' records go to the root logger instead of its own bare stderr handler.
    llama.cpp's log is routed in `decoding.llamacpp.library`."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm's own default, read at each bar
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        # transformers takes seconds to import; the server's worker imports it anyway.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def configure_logging(level: str = "warning", filename: str | None = None) -> None:
    target = {"filename": filename} if filename else {"stream": sys.stderr}
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        **target,
    )
    # pygls logs every message it sends at INFO; that is noise below debug.
    if level != "debug":
        logging.getLogger("pygls").setLevel(logging.WARNING)
    # httpx logs every request to a remote engine at INFO, httpcore every step at DEBUG.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def serve(server, address: tuple[str, int] | None = None) -> int:
    """Run `server` until the client exits: on stdio, or on TCP at `address`.

    On stdio the process ends here (status 0 after `shutdown`, 1 otherwise, as LSP says):
    pygls' stdin reader thread stays blocked in a read that only the client can end.
    """
    try:
        if address is not None:
            serve_tcp(server, *address)
        else:
            stdin, stdout = _claim_stdio()
            server.start_io(stdin, stdout)
    finally:
        server.stop()
    status = 0 if server.was_shut_down else 1
    if address is None:
        logging.shutdown()
        sys.stderr.flush()
        os._exit(status)
    return status


def _claim_stdio():
    """The LSP channel is stdout: take it for pygls alone and point file descriptor 1 (and
    `sys.stdout`) at stderr, so a stray print from any library cannot corrupt the stream."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return Utf8SafeInput(sys.stdin.buffer), out

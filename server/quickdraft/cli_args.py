"""Command-line arguments shared by `serve`, `complete` and `bench`, and their translation into
the configuration tree (`quickdraft.config.load_config` validates it).

Its own module so that `cli.py` (which registers the subcommands) and the subcommands' modules
(which add these arguments) never import each other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from quickdraft.config import RUNTIMES, STRATEGIES, QuickdraftConfig, load_config
from quickdraft.errors import ConfigError


def add_model_arguments(parser: argparse.ArgumentParser, *, runtime_list: bool = False) -> None:
    """The model flags shared by `complete`, `serve` and `bench` (whose `--runtime` takes a
    comma-separated list of runtimes to compare: `runtime_list`)."""
    group = parser.add_argument_group("models")
    group.add_argument("--preset", help="model preset (see `quickdraft models list`)")
    group.add_argument("--target", help="target model: preset, Hub id, directory or .gguf file")
    group.add_argument("--draft", help="draft model (same tokenizer); 'none' for n-gram only")
    group.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    runtime_help = (
        "llamacpp runs the GGUF files through llama.cpp (pip install -e '.[llama]'); "
        "auto (default): llama.cpp on a CPU when installed and estimated faster, else torch"
    )
    if runtime_list:
        group.add_argument(
            "--runtime",
            metavar="RUNTIME[,RUNTIME]",
            help=runtime_help + "; several (e.g. torch,llamacpp) are timed side by side",
        )
    else:
        group.add_argument("--runtime", choices=list(RUNTIMES), help=runtime_help)
    group.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16", "int8"],
        help="torch runtime: auto is bfloat16 on CUDA; on a CPU the fastest of exact int8, "
        "bfloat16 and float32 measured on this machine",
    )
    group.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    group.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        help="static KV cache + torch.compile'd decode/verify steps (auto: on with CUDA)",
    )
    group.add_argument(
        "--draft-format",
        choices=["auto", "as-is"],
        help="llama.cpp runs the draft from a Q4_0 copy made once where that is faster here "
        "(auto, default), or from its GGUF as given (as-is)",
    )
    group.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip measuring step costs at load (the adaptive draft length then uses estimates)",
    )
    add_remote_arguments(parser)


REMOTE_MODEL_KEYS = (
    "backend",
    "url",
    "api_key_env",
    "remote_model",
    "family",
    "tokenizer",
    "connect_timeout_s",
    "read_timeout_s",
)
"""The `model` settings of a serving engine (`--backend openai`), named as the flags' dests."""


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """A serving engine in place of local models (`quickdraft.remote`)."""
    group = parser.add_argument_group("remote engine (--backend openai)")
    group.add_argument(
        "--backend",
        choices=["local", "openai"],
        help="local models (default), or an OpenAI-compatible /v1/completions (vLLM, llama.cpp)",
    )
    group.add_argument("--url", help="the engine's base URL, e.g. http://gpu-box:8000/v1")
    group.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the environment variable holding the engine's API key (never the key itself)",
    )
    group.add_argument("--remote-model", help="the model name the engine serves (default: ask it)")
    group.add_argument("--family", help="FIM family, when no preset says it")
    group.add_argument(
        "--tokenizer", help="tokenizer files (directory or .gguf) when no preset has them"
    )
    group.add_argument(
        "--connect-timeout", type=float, dest="connect_timeout_s", help="seconds (default 3)"
    )
    group.add_argument(
        "--read-timeout", type=float, dest="read_timeout_s", help="seconds (default 30)"
    )


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decoding")
    group.add_argument("--strategy", choices=STRATEGIES, help="default hybrid")
    group.add_argument("--max-tokens", type=int, dest="max_new_tokens", help="default 64")
    group.add_argument("--temperature", type=float, help="0 (default) is greedy")
    group.add_argument("--top-p", type=float, dest="top_p")
    group.add_argument("--seed", type=int)
    group.add_argument(
        "--draft-length", type=int, help="tokens proposed per step (default: adaptive)"
    )
    group.add_argument(
        "--min-confidence",
        type=float,
        dest="min_confidence",
        help="the language server shows no suggestion the model gives a lower probability"
        " unless asked for (default 0.3; 0 shows all)",
    )


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="JSON",
        help="settings file (the configuration tree as JSON) laid under the flags",
    )


def config_file_from_args(args: argparse.Namespace) -> QuickdraftConfig | None:
    """The validated settings of `--config`, or None when it was not given."""
    path = getattr(args, "config", None)
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc}") from None
    return load_config(data)


def parse_runtimes(value: str | None) -> list[str]:
    """`--runtime torch,llamacpp` -> ["torch", "llamacpp"] (bench); ConfigError names the bad
    one."""
    if not value:
        return []
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in RUNTIMES]
    if unknown or not names:
        raise ConfigError(
            f"--runtime: unknown {', '.join(unknown) or 'empty list'} (known: {', '.join(RUNTIMES)})"
        )
    return list(dict.fromkeys(names))


def config_dict_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, as a dict for `load_config` (the first runtime
    of a bench's list)."""
    model = {
        key: getattr(args, key, None)
        for key in (
            "preset",
            "target",
            "draft",
            "device",
            "runtime",
            "dtype",
            "threads",
            "compile",
            "draft_format",
            *REMOTE_MODEL_KEYS,
        )
        if getattr(args, key, None) is not None
    }
    if isinstance(model.get("runtime"), str) and "," in model["runtime"]:
        model["runtime"] = parse_runtimes(model["runtime"])[0]
    if getattr(args, "no_calibrate", False):
        model["calibrate"] = False
    if model.get("draft") == "none":
        model["draft"] = None
    decoding = {
        key: getattr(args, key, None)
        for key in (
            "strategy",
            "max_new_tokens",
            "temperature",
            "top_p",
            "seed",
            "draft_length",
            "min_confidence",
        )
        if getattr(args, key, None) is not None
    }
    data: dict[str, Any] = {}
    if model:
        data["model"] = model
    if decoding:
        data["decoding"] = decoding
    return data


class ProgressLines:
    """Loading progress for the terminal: one line on stderr per step, with the time since
    start, so a wait of minutes always says what it is doing."""

    def __init__(self, prefix: str = "quickdraft"):
        self.prefix = prefix
        self._started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        print(f"{self.prefix}: [{elapsed:5.1f} s] {message}", file=sys.stderr, flush=True)

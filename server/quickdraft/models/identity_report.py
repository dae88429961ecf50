"""Measure greedy identity with `ar` on the paths quickdraft ships: dtypes, caches, devices.

    python -m quickdraft.models.identity_report [--paths int8,float32,bfloat16,int8+static]
        [--model tiny | random:PRESET | PRESET | DIR] [--prompts 50] [--max-new-tokens 32]
        [--device cpu] [--compile-backend inductor] [--json out.json]

A path is a dtype (`float32`, `bfloat16`, `float16`, `int8`) with flags: `+rowwise` (row-wise
attention, which int8 always has), `+static` (preallocated KV caches, `StaticModelRunner`),
`+compiled` (static caches with torch.compile'd steps, as `model.compile: on` runs them).

Models: `tiny` (default) is a random-init pair of real shape (Qwen2 with grouped-query
attention: a 4-layer target of hidden size 256, 8 heads and 2 key/value heads, and a 2-layer
draft), on byte tokens; `random:PRESET` a preset's architecture with random weights (its lm_head
scaled as for `tiny`); a preset or directory, the real weights with their tokenizer. Random
weights give nearly uniform logits, where last-bit differences flip argmaxes far more often
than with trained weights; `--logit-scale` widens them. At the default, 16, the tiny target's
top two logits on code lie within 0.01 of each other at 0.6 % of positions, the real 1.5B's
at 0.7 % (within 0.1: 6 % and 3 %; median gap 0.9 and 2.2): near ties, which are what a
last-bit difference can flip, are about as common.

Prompts are windows of quickdraft's own source files. Per path it prints (and writes as JSON)
`quickdraft.decoding.identity.measure_identity`'s counts: every strategy and draft length against
`ar`, warm against cold, and whether the logits behind them are bitwise equal.
This is a measurement tool for the README and docs/performance.md, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from quickdraft.config import ModelConfig
from quickdraft.decoding import Engine
from quickdraft.decoding.identity import measure_identity
from quickdraft.decoding.runner import ROWWISE_ATTENTION, StaticModelRunner
from quickdraft.models.loading import load_models
from quickdraft.models.presets import PRESETS, ArchConfig, get_preset
from quickdraft.models.quantize import quantize_model, use_rowwise_attention

TINY_TARGET = ArchConfig("qwen2", 256, 4, 8, 2, 704, 512, max_position_embeddings=4096)
TINY_DRAFT = ArchConfig("qwen2", 128, 2, 4, 2, 352, 512, max_position_embeddings=4096)
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.float32,
}
FLAGS = ("rowwise", "static", "compiled")
DEFAULT_PATHS = "int8,int8+static,int8+compiled,float32,float32+compiled,bfloat16,bfloat16+rowwise"


@dataclass(frozen=True)
class ComputePath:
    dtype: str
    rowwise: bool = False
    static: bool = False
    compiled: bool = False

    @classmethod
    def parse(cls, text: str) -> ComputePath:
        dtype, *flags = text.strip().split("+")
        if dtype not in DTYPES:
            raise SystemExit(
                f"unknown dtype {dtype!r} in path {text!r} (known: {', '.join(DTYPES)})"
            )
        for flag in flags:
            if flag not in FLAGS:
                raise SystemExit(
                    f"unknown flag {flag!r} in path {text!r} (known: {', '.join(FLAGS)})"
                )
        compiled = "compiled" in flags
        return cls(
            dtype, "rowwise" in flags or dtype == "int8", "static" in flags or compiled, compiled
        )

    @property
    def name(self) -> str:
        flags = [
            f for f in FLAGS if getattr(self, f) and not (f == "rowwise" and self.dtype == "int8")
        ]
        if self.compiled:
            flags.remove("static")
        return "+".join([self.dtype, *flags])


def code_prompts(
    count: int, encode, *, low: int = 150, high: int = 400, seed: int = 0
) -> list[list[int]]:
    """`count` windows of `low`..`high` tokens from quickdraft's own source files (a window
    starts at a line start, so prompts look like code being written)."""
    root = Path(__file__).resolve().parents[1]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))
    lines = text.splitlines(keepends=True)
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count:
        start = rng.randrange(len(lines))
        ids = encode("".join(lines[start : start + 200]))
        if len(ids) >= low:
            prompts.append(ids[: rng.randint(low, high)])
    return prompts


def _random_model(
    arch: ArchConfig, dtype: torch.dtype, device: torch.device, seed: int, scale: float
):
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(arch.to_hf_config(), dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    model = model.to(dtype).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


class PairBuilder:
    """Builds the target/draft pair of `spec` for a path (the same weights for every path)."""

    def __init__(self, spec: str, device: torch.device, logit_scale: float) -> None:
        self.spec, self.device, self.logit_scale = spec, device, logit_scale
        self.tokenizer = None
        if spec == "tiny":
            self.archs = (TINY_TARGET, TINY_DRAFT)
        elif spec.startswith("random:"):
            preset = get_preset(spec.removeprefix("random:"))
            self.archs = (preset.target.arch, preset.draft.arch if preset.draft else None)
        else:
            self.archs = None

    def encode(self, text: str) -> list[int]:
        if self.archs is not None:
            return list(text.encode("utf-8"))
        if self.tokenizer is None:
            self.build(ComputePath("float32"))  # loads the tokenizer with the models
        return self.tokenizer.encode(text)

    def build(self, path: ComputePath):
        dtype = DTYPES[path.dtype]
        if self.archs is not None:
            target_arch, draft_arch = self.archs
            target = _random_model(target_arch, dtype, self.device, 0, self.logit_scale)
            draft = (
                _random_model(draft_arch, dtype, self.device, 1, self.logit_scale)
                if draft_arch is not None
                else None
            )
            if path.dtype == "int8":
                target, draft = quantize_model(target), draft and quantize_model(draft)
        else:
            where = {"preset": self.spec} if self.spec in PRESETS else {"target": self.spec}
            loaded = load_models(
                ModelConfig(
                    **where,
                    dtype=path.dtype,
                    device=str(self.device),
                    runtime="torch",
                    calibrate=False,
                )
            )
            self.tokenizer = loaded.tokenizer
            target, draft = loaded.target, loaded.draft
        if path.rowwise and path.dtype != "int8":
            for model in (target, draft):
                if model is not None:
                    use_rowwise_attention(model)
        return target, draft


def measure_path(models: PairBuilder, path: ComputePath, prompts, args) -> dict[str, Any]:
    started = time.monotonic()
    target, draft = models.build(path)
    engine = Engine(
        target,
        draft,
        stop_token_ids=[],
        static_cache_tokens=args.static_cache_tokens if path.static else None,
        compile_steps=path.compiled,
    )
    if path.compiled and args.compile_backend != "inductor":
        for runner in (engine.target, engine.drafter.runner if engine.drafter else None):
            if isinstance(runner, StaticModelRunner):
                runner._step = torch.compile(
                    runner.model.forward,
                    backend=args.compile_backend,
                    fullgraph=True,
                    dynamic=False,
                )
    result = measure_identity(
        engine,
        prompts,
        draft_lengths=[None if k == "adaptive" else int(k) for k in args.draft_lengths.split(",")],
        max_new_tokens=args.max_new_tokens,
    )
    attention = target.config._attn_implementation
    return {
        "path": path.name,
        "model": models.spec,
        "device": str(models.device),
        "dtype": path.dtype,
        "attention": "rowwise" if attention == ROWWISE_ATTENTION else attention,
        "cache": "compiled" if path.compiled else "static" if path.static else "growing",
        "compile_backend": args.compile_backend if path.compiled else None,
        "int8_backend": getattr(target, "_quickdraft_int8", {}).get("backend"),
        "seconds": round(time.monotonic() - started, 1),
        **result,
    }


def _pct(tally: dict[str, Any]) -> str:
    if not tally["runs"]:
        return "–"
    return f"{tally['rate']:.1%} ({tally['same']}/{tally['runs']})"


def markdown(results: list[dict[str, Any]]) -> str:
    header = [
        "path",
        "strategies = `ar`",
        "warm = cold",
        "after a completion",
        "verify logits = steps",
        "prefill logits, any chunking",
        "max abs logit diff",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [
            f"`{r['path']}` ({r['device']})",
            _pct(r["identical_to_ar"]),
            _pct(r["warm_equals_cold"]),
            _pct(r["after_completion"]),
            _pct(r["verify_logits"]),
            _pct(r["prefill_logits"]),
            f"{r['max_abs_diff']:.3g}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--paths", default=DEFAULT_PATHS, help=f"comma-separated (default {DEFAULT_PATHS})"
    )
    parser.add_argument(
        "--model", default="tiny", help="tiny, random:PRESET, a preset, a directory"
    )
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--draft-lengths", default="adaptive,2,4,8", help="adaptive and/or integers"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument(
        "--logit-scale", type=float, default=16.0, help="random weights' lm_head scale"
    )
    parser.add_argument("--static-cache-tokens", type=int, default=1024)
    parser.add_argument("--compile-backend", default="inductor", help="inductor, aot_eager, eager")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    paths = [ComputePath.parse(p) for p in args.paths.split(",") if p.strip()]
    models = PairBuilder(args.model, device, args.logit_scale)
    prompts = code_prompts(args.prompts, models.encode)
    results = []
    for path in paths:
        print(
            f"identity: {path.name} on {device} ({len(prompts)} prompts)…",
            file=sys.stderr,
            flush=True,
        )
        try:
            results.append(measure_path(models, path, prompts, args))
        except Exception as exc:  # one path failing (a compile error) leaves the others
            print(f"identity: {path.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            results.append(
                {"path": path.name, "device": str(device), "error": f"{type(exc).__name__}: {exc}"}
            )
            continue
        r = results[-1]
        print(
            f"  {r['seconds']} s: strategies = ar {_pct(r['identical_to_ar'])}, "
            f"warm = cold {_pct(r['warm_equals_cold'])}, verify logits = steps {_pct(r['verify_logits'])}",
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    print(markdown([r for r in results if "error" not in r]))
    for r in results:
        if "error" in r:
            print(f"\n`{r['path']}` failed: {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What llama.cpp can do on this machine: which settings work, and what a forward costs.

Some builds crash in an "extra buffer type" (weights repacked for AMX) on some machines. So a
GGUF model is measured once per machine in a child process (`probe`), where a crash costs
nothing but a retry without the extra buffers; the result is cached (models/runtime.py uses it
to choose the runtime).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.decoding.costmodel import (
    BUSY_SHARE,
    CALIBRATION_FORMAT,
    MEASURED_SIZES,
    fill_sizes,
)
from quickdraft.decoding.llamacpp import LlamaCppRunner, version
from quickdraft.errors import ModelError
from quickdraft.machine import OtherLoad, cpu_flags, cpu_model
from quickdraft.models import store
from quickdraft.models.llamacpp import LlamaCppModel

log = logging.getLogger(__name__)


@dataclass
class ProbeResult:
    """What a child process measured of one GGUF model on this machine."""

    extra_bufts: bool
    target_ms: dict[int, float]
    """Forward time (ms) by new tokens, over a `context`-token cache."""
    prefill_tokens_per_s: float
    context: int
    threads: int
    load_seconds: float
    busy: bool = False
    crashed_with_extra_bufts: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_ms"] = {str(k): v for k, v in self.target_ms.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        data = dict(data)
        data["target_ms"] = {int(k): float(v) for k, v in data["target_ms"].items()}
        return cls(**data)


PROBE_CONTEXT = 256
"""Tokens in the cache under the forwards the probe times."""


def _measure(path: Path, threads: int, extra_bufts: bool, context: int) -> dict[str, Any]:
    """In the probe process: load, prefill `context` tokens, time forwards of MEASURED_SIZES."""
    started = time.perf_counter()
    model = LlamaCppModel(Path(path), threads=threads, extra_bufts=extra_bufts, n_ctx=context + 64)
    runner = LlamaCppRunner(model, n_ctx=context + 64)
    load_seconds = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    high = max(2, min(model.vocab_size, 30000))
    tokens = torch.randint(1, high, (context + max(MEASURED_SIZES),), generator=generator).tolist()
    runner.forward(tokens[:8], last_only=True)  # warm-up
    runner.reset()
    # One load figure for the whole probe: /proc/stat counts in 10 ms ticks, too coarse for
    # a share taken over a single forward of a few milliseconds.
    target_ms: dict[int, float] = {}
    with OtherLoad() as load:
        t0 = time.perf_counter()
        runner.extend(tokens[:context])
        prefill = time.perf_counter() - t0
        for n in MEASURED_SIZES:
            best = float("inf")
            for _ in range(3):
                runner.keep(context)
                t0 = time.perf_counter()
                logits = runner.forward(tokens[context : context + n])
                best = min(best, time.perf_counter() - t0)
                if not torch.isfinite(logits).all():
                    raise ModelError("llama.cpp returned non-finite logits")
            target_ms[n] = round(best * 1000, 2)
    target_ms = fill_sizes(target_ms)  # fewer new tokens never cost more
    busy = load.share is not None and load.share > BUSY_SHARE
    return ProbeResult(
        extra_bufts=extra_bufts,
        target_ms=target_ms,
        prefill_tokens_per_s=round(context / prefill, 1),
        context=context,
        threads=threads,
        load_seconds=round(load_seconds, 2),
        busy=busy,
    ).to_dict()


def _probe_key(path: Path, threads: int, context: int) -> str:
    stat = path.stat()
    parts = [
        ",".join(map(str, MEASURED_SIZES)),  # sizes added since: measure again
        str(CALIBRATION_FORMAT),
        cpu_model(),
        ",".join(sorted(cpu_flags())),
        version() or "",
        path.name,
        str(stat.st_size),
        str(threads),
        str(context),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cache_path(path: Path, threads: int, context: int, home: Path | None) -> Path:
    return (
        (home or store.quickdraft_home())
        / "llamacpp"
        / f"{_probe_key(path, threads, context)}.json"
    )


def is_measured(
    path: Path, threads: int, *, context: int = PROBE_CONTEXT, home: Path | None = None
) -> bool:
    """Whether `probe` will answer from its cache (the progress says "measuring" only when it
    measures)."""
    try:
        return _cache_path(Path(path), threads, context, home).is_file()
    except OSError:  # no such model file: nothing measured of it
        return False


def probe(
    path: Path,
    threads: int,
    *,
    context: int = PROBE_CONTEXT,
    home: Path | None = None,
    use_cache: bool = True,
    timeout_s: float = 240.0,
) -> ProbeResult:
    """Load `path` in a child process and measure it (once per machine, then cached).

    A crash with llama.cpp's extra buffer types is retried without them. Raises ModelError
    when the model cannot run at all.
    """
    path = Path(path)
    cache = _cache_path(path, threads, context, home)
    if use_cache and cache.is_file():
        try:
            return ProbeResult.from_dict(json.loads(cache.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            log.warning("ignoring unreadable llama.cpp probe %s", cache)
    crashed = False
    errors = []
    for extra_bufts in (True, False):
        command = [
            sys.executable,
            "-m",
            "quickdraft.models.llamacpp_probe",
            str(path),
            "--threads",
            str(threads),
            "--context",
            str(context),
        ]
        if not extra_bufts:
            command.append("--no-extra-bufts")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, env=env
            )
        except subprocess.TimeoutExpired:
            errors.append(f"timed out after {timeout_s:.0f} s")
            continue
        if done.returncode == 0:
            try:
                result = ProbeResult.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                errors.append(f"unreadable output ({exc})")
                continue
            result.crashed_with_extra_bufts = crashed
            if use_cache and not result.busy:
                store.write_json_atomic(cache, result.to_dict())
            return result
        tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
        reason = (
            f"crashed (signal {-done.returncode})"
            if done.returncode < 0
            else f"failed (exit {done.returncode}): {tail[0]}"
        )
        errors.append(("with" if extra_bufts else "without") + f" extra buffers {reason}")
        crashed = crashed or (extra_bufts and done.returncode < 0)
    raise ModelError(f"llama.cpp cannot run {path.name} here: " + "; ".join(errors))


def _probe_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measure a GGUF model in llama.cpp (internal)")
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=PROBE_CONTEXT)
    parser.add_argument("--no-extra-bufts", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = _measure(args.path, args.threads, not args.no_extra_bufts, args.context)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover - run by `probe` in a child process
    sys.exit(_probe_main())

"""Which compute path runs a torch model on this CPU: measured here, cached, explained.

CPUs differ more than any default can cover. With VNNI or AMX, quickdraft's exact int8 is
several times faster than float32; on AVX2 alone (AMD Zen 3, many laptops) oneDNN's 8-bit
int8 is not exact and `torch._int_mm` is 20-30x slower than float32. So `dtype: auto` on a CPU
measures the candidates on this machine before loading:

    candidates  float32; bfloat16 where the CPU has native bf16; exact int8 with the exact
                integer backend this CPU has (quantize.exact_int8_backends: oneDNN with 8-bit
                weights, oneDNN with 7-bit weights, torch._int_mm, float64)
    workload    the linear layers of one decoder layer of the model's own shape (random
                weights), for 1, 8 and 128 rows: a decode step, a verify forward, a prefill
                chunk. Linears are nearly all of a small model's CPU time.
    score       T(1) + T(8) + T(128) / 8      (ms; lower wins)
    rule        int8 when an exact backend scores no worse than float32 (it is batch-invariant,
                so speculation stays token-identical to plain decoding, and it halves memory);
                else bfloat16 where native and faster than float32; else float32. A backend
                slower than float32 is never chosen.

The result is cached in `$QUICKDRAFT_HOME/kernels/`, keyed by the CPU model and flags, the
torch version, the thread count and the layer shape, and measured again when any of these
changes. A measurement taken while other processes held the CPU is used for this run only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from quickdraft.machine import OtherLoad, cpu_flags, cpu_model
from quickdraft.models import store
from quickdraft.models.quantize import Int8Linear, best_ms, exact_int8_backends

log = logging.getLogger(__name__)

ROWS = (1, 8, 128)
"""Rows per timed call: a decode step, a verify forward, a prefill chunk."""
MAX_BENCH_PARAMETERS = 48_000_000
"""Larger layers are measured on a slice (fewer output rows) and scaled up."""
BUSY_OTHER_SHARE = 0.2
"""A measurement during which other processes used more than this share of the CPUs was taken
on a busy machine: it is not cached."""
CACHE_VERSION = 2
"""2: an int8 layer of 1-2 rows may run the lean kernel (int8_rows), which changes its timings."""


@dataclass
class LayerShape:
    """The linear layers of one decoder layer: (in_features, out_features) each."""

    hidden: int
    intermediate: int
    kv_dim: int

    @classmethod
    def of(cls, config: Any) -> LayerShape:
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        return cls(hidden, int(config.intermediate_size), kv_heads * head_dim)

    def linears(self) -> list[tuple[int, int]]:
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]


@dataclass
class KernelChoice:
    """What `dtype: auto` means on this CPU, and the measurements behind it."""

    dtype: str
    """"int8", "bfloat16" or "float32"."""
    int8_backend: str | None
    """The exact integer backend int8 uses (quantize.INT8_BACKENDS), when dtype is int8."""
    reason: str
    """One sentence for the log and `quickdraft models stepcost`."""
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Candidate -> rows ("1", "8", "128") -> ms for one decoder layer's linears."""
    cpu: str = ""
    capability: str = ""
    busy: bool = False
    measured_seconds: float = 0.0
    cached: bool = False

    @property
    def label(self) -> str:
        return f"int8/{self.int8_backend}" if self.dtype == "int8" else self.dtype

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["label"] = self.label
        return data


# --- the machine ------------------------------------------------------------------------


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16, AMX; Arm BF16)."""
    flags = cpu_flags()
    if flags & {"avx512_bf16", "amx_bf16", "bf16"}:
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and not flags
    except (AttributeError, RuntimeError):
        return False


def capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:  # pragma: no cover - torch < 2.1
        return "unknown"


def _cache_key(shape: LayerShape, threads: int) -> str:
    flags = ",".join(sorted(cpu_flags()))
    parts = [
        str(CACHE_VERSION),
        cpu_model(),
        hashlib.sha256(flags.encode()).hexdigest()[:12],
        capability(),
        torch.__version__,
        str(threads),
        f"{shape.hidden}x{shape.intermediate}x{shape.kv_dim}",
        os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        os.environ.get("ATEN_CPU_CAPABILITY", ""),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cache_path(key: str, home: Path | None = None) -> Path:
    return (home or store.quickdraft_home()) / "kernels" / f"{key}.json"


# --- measuring ------------------------------------------------------------------------------


def _layer(candidate: str, shape: LayerShape, generator: torch.Generator) -> tuple[list, float]:
    """The candidate's linear modules for one layer (sliced when large) and the time factor
    that scales a slice's time back to the whole layer."""
    total = sum(k * n for k, n in shape.linears())
    fraction = min(1.0, MAX_BENCH_PARAMETERS / total)
    modules = []
    for k, n in shape.linears():
        rows = max(64, int(n * fraction))
        linear = torch.nn.Linear(k, rows, bias=False)
        with torch.no_grad():
            linear.weight.normal_(0.0, 0.02, generator=generator)
        if candidate.startswith("int8/"):
            modules.append(Int8Linear.from_linear(linear, candidate.split("/", 1)[1]))
        elif candidate == "bfloat16":
            modules.append(linear.to(torch.bfloat16))
        else:
            modules.append(linear)
    return modules, 1.0 / fraction


@torch.inference_mode()
def _time_layer(
    modules: list,
    rows: int,
    hidden: int,
    dtype: torch.dtype,
    repeats: int,
    give_up_ms: float = float("inf"),
) -> float:
    """Best-of-`repeats` ms for one pass of `rows` rows through every module; the repeats stop
    once a pass is slower than `give_up_ms` (a hopeless candidate is not timed three times)."""
    inputs = []
    for module in modules:
        k = module.in_features
        inputs.append(torch.randn(rows, k, dtype=torch.float32).to(dtype))

    def one_pass() -> None:
        for module, x in zip(modules, inputs, strict=True):
            module(x)

    return best_ms(one_pass, repeats, give_up_ms)


def candidates() -> list[str]:
    names = ["float32"]
    if native_bfloat16():
        names.append("bfloat16")
    names += [f"int8/{backend}" for backend in exact_int8_backends()]
    return names


def measure(
    shape: LayerShape, threads: int, *, names: list[str] | None = None, budget_s: float = 20.0
) -> tuple[dict[str, dict[str, float]], bool]:
    """Time each candidate on one layer of `shape`. Returns (timings, busy).

    Slow candidates are cut short: once a candidate's 1-row time is over 4x float32's, its
    larger sizes are not measured (it cannot win) and it scores as infinitely slow. The
    exact-but-slow float64 backend is only timed when nothing faster is exact. Once `budget_s`
    is spent, an int8 backend still gets its 1-row time (`dtype: int8` asked for explicitly
    then takes the fastest, never one left untimed).
    """
    names = names or candidates()
    if (
        "int8/float64" in names
        and len(names) > 2
        and any(n.startswith("int8/") and n != "int8/float64" for n in names)
    ):
        names = [n for n in names if n != "int8/float64"]
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, dict[str, float]] = {}
    started = time.monotonic()
    # One load figure for the whole measurement: /proc/stat counts in clock ticks (10 ms), so a
    # share taken over one few-millisecond timing would read a single tick as a busy machine.
    with OtherLoad() as load:
        for name in names:
            rows = ROWS
            if time.monotonic() - started > budget_s and timings:
                if not name.startswith("int8/"):
                    log.info("kernel measurement: budget spent, %s not measured", name)
                    continue
                log.info("kernel measurement: budget spent, %s timed at 1 row only", name)
                rows = ROWS[:1]
            timings[name] = _measure_candidate(name, shape, generator, timings, rows)
    busy = load.share is not None and load.share > BUSY_OTHER_SHARE
    return timings, busy


def _measure_candidate(
    name: str,
    shape: LayerShape,
    generator: torch.Generator,
    timings: dict[str, dict[str, float]],
    row_counts: tuple[int, ...] = ROWS,
) -> dict[str, float]:
    """One candidate's ms per row count, cut short once it is over 4x float32's (it cannot win,
    and its larger sizes may take long)."""
    modules, scale = _layer(name, shape, generator)
    dtype = torch.bfloat16 if name == "bfloat16" else torch.float32
    row_times: dict[str, float] = {}
    for rows in row_counts:
        repeats = 3 if rows < 128 else 2
        reference = timings.get("float32", {}).get(str(rows))
        give_up = float("inf") if reference is None else 4 * reference / scale
        ms = _time_layer(modules, rows, shape.hidden, dtype, repeats, give_up) * scale
        row_times[str(rows)] = round(ms, 3)
        if reference is not None and ms > 4 * reference:
            break
    return row_times


def score(row_times: dict[str, float]) -> float:
    """T(1) + T(8) + T(128)/8 in ms; a candidate cut short scores infinitely slow."""
    if any(str(rows) not in row_times for rows in ROWS):
        return float("inf")
    return row_times["1"] + row_times["8"] + row_times["128"] / 8


def decide(timings: dict[str, dict[str, float]]) -> tuple[str, str | None, str]:
    """(dtype, int8 backend or None, reason) from the measured timings."""
    fp32 = score(timings.get("float32", {}))
    int8 = sorted(
        (score(t), name.split("/", 1)[1]) for name, t in timings.items() if name.startswith("int8/")
    )
    if int8 and int8[0][0] <= fp32:
        value, backend = int8[0]
        return (
            "int8",
            backend,
            f"exact int8 ({backend}) scored {value:.1f} ms per layer against float32's "
            f"{fp32:.1f} ms",
        )
    bf16 = score(timings.get("bfloat16", {}))
    why_not_int8 = (
        f"the fastest exact int8 ({int8[0][1]}) scored "
        + (f"{int8[0][0]:.1f} ms" if int8[0][0] != float("inf") else "over 4x float32")
        + f" against float32's {fp32:.1f} ms"
        if int8
        else "no exact int8 kernel here"
    )
    if bf16 < fp32:
        return "bfloat16", None, f"native bfloat16 scored {bf16:.1f} ms per layer; {why_not_int8}"
    return "float32", None, why_not_int8


def choose(
    config: Any,
    threads: int,
    *,
    home: Path | None = None,
    use_cache: bool = True,
    progress: Any = None,
) -> KernelChoice:
    """The compute path for a model of HF `config` on this CPU (measured once, then cached).

    `progress(message)` is told before a measurement starts (it takes a few seconds).
    """
    shape = LayerShape.of(config)
    key = _cache_key(shape, threads)
    path = _cache_path(key, home)
    if use_cache and path.is_file():
        try:
            data = json.loads(path.read_text())
            data.pop("label", None)
            choice = KernelChoice(**data)
            choice.cached = True
            return choice
        except (OSError, ValueError, TypeError):
            log.warning("ignoring unreadable kernel choice %s", path)
    if progress is not None:
        progress("measuring this CPU's int8, bfloat16 and float32 kernels (once)")
    started = time.monotonic()
    timings, busy = measure(shape, threads)
    dtype, backend, reason = decide(timings)
    choice = KernelChoice(
        dtype=dtype,
        int8_backend=backend,
        reason=reason,
        timings_ms=timings,
        cpu=cpu_model(),
        capability=capability(),
        busy=busy,
        measured_seconds=round(time.monotonic() - started, 1),
    )
    if busy:
        log.warning(
            "the CPU was busy while its kernels were measured: using the result for this run "
            "only (measured again next time)"
        )
    elif use_cache:
        store.write_json_atomic(path, choice.to_dict())
    return choice

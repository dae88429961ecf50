"""The machine quickdraft runs on, described once: the CPU's model name and its flags, and how
busy other processes keep it while something is measured.

Kernel choice (`models.cpu_kernels`), the runtimes' measurements, calibration keys and every
benchmark report name the CPU through these functions, so they all say the same thing; each of
those measurements asks `OtherLoad` whether it was taken on a busy machine.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from functools import cache
from pathlib import Path

SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
"""The vector extensions that decide a CPU's speed here, as /proc/cpuinfo spells them."""


def _cpuinfo_value(*keys: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in keys and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


@cache
def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo says (else what the platform module says)."""
    return (
        _cpuinfo_value("model name", "Model name", "cpu model")
        or platform.processor()
        or platform.machine()
    )


@cache
def cpu_flags() -> frozenset[str]:
    """Every flag the CPU lists (x86 `flags`, Arm `Features`); empty where none is listed."""
    value = _cpuinfo_value("flags", "Features")
    return frozenset(value.split()) if value else frozenset()


def speed_flags() -> list[str]:
    """Which of `SPEED_FLAGS` this CPU has, in that order (for reports)."""
    flags = cpu_flags()
    return [flag for flag in SPEED_FLAGS if flag in flags]


def _busy_jiffies() -> tuple[int, int] | None:
    """(CPU time all processes spent busy, this process's CPU time), in clock ticks."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return sum(values[:8]) - idle, int(own[11]) + int(own[12])  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


class OtherLoad:
    """How busy the other processes kept this machine's CPUs while the block ran: the share
    of all cores' time they used (0 = idle machine). None where /proc is unavailable."""

    def __enter__(self) -> OtherLoad:
        self._start = _busy_jiffies()
        self._wall = time.perf_counter()
        self.share: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        end = _busy_jiffies()
        wall = time.perf_counter() - self._wall
        if self._start is None or end is None or wall <= 0:
            return
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        others = (end[0] - self._start[0]) - (end[1] - self._start[1])
        self.share = max(0.0, others / ticks / (wall * (os.cpu_count() or 1)))


def peak_rss_bytes(children: bool = False) -> int | None:
    """The peak resident memory of this process (`children`: the largest of its child
    processes that have ended and been waited for), in bytes; None where the OS does not say.

    `ru_maxrss` is in kB on Linux and in bytes on macOS."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    peak = resource.getrusage(who).ru_maxrss
    if peak <= 0:
        return None
    return peak if sys.platform == "darwin" else peak * 1024

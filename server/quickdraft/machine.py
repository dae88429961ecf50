"""The machine quickdraft runs on, described once: the CPU's model name and its flags.

Kernel choice (`models.cpu_kernels`), the runtimes' measurements, calibration keys and every
benchmark report name the CPU through these functions, so they all say the same thing.
"""

from __future__ import annotations

import platform
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

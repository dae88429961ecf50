"""Where a bench's numbers come from, as both benches write it into results.json: the machine
(described by quickdraft.machine), the Python and the quickdraft build, and the memory the
bench's processes have needed at their peak (`peak_memory`, refreshed whenever results are
written)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from quickdraft import __version__
from quickdraft.machine import cpu_model, peak_rss_bytes, speed_flags


def git_commit() -> str | None:
    """The short commit of the checkout quickdraft runs from (None outside a git checkout)."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def peak_memory() -> dict[str, int | None]:
    """peak_rss_bytes: this process's peak resident memory so far (models it loaded included);
    children_peak_rss_bytes: the largest peak of the child processes it started that have
    ended (a server the typing bench ran), None before any has."""
    return {
        "peak_rss_bytes": peak_rss_bytes(),
        "children_peak_rss_bytes": peak_rss_bytes(children=True) or None,
    }


def provenance() -> dict[str, Any]:
    """The machine and the build: cpu, cpu_flags, cpu_count, platform, python, quickdraft,
    git_commit; and `peak_memory` as it stands now."""
    return {
        "cpu": cpu_model(),
        "cpu_flags": speed_flags(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "quickdraft": __version__,
        "git_commit": git_commit(),
        **peak_memory(),
    }

"""Where a bench's numbers come from, as both benches write it into results.json: the machine
(described by quickdraft.machine), the Python and the quickdraft build."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from quickdraft import __version__
from quickdraft.machine import cpu_model, speed_flags


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


def provenance() -> dict[str, Any]:
    """The machine and the build: cpu, cpu_flags, cpu_count, platform, python, quickdraft,
    git_commit."""
    return {
        "cpu": cpu_model(),
        "cpu_flags": speed_flags(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "quickdraft": __version__,
        "git_commit": git_commit(),
    }

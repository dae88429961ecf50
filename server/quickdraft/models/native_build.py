"""C kernels built on the user's machine: compiled once with the system's C compiler into
`$QUICKDRAFT_HOME/kernels/`, keyed by the source (with the headers beside it that it includes),
the flags and the compiler, and loaded with ctypes (whose calls release the GIL).

Used by `int8_rows` (the int8 linear) and `attention_rows` (decode attention), each naming the
CPU flags its code needs. Where a kernel cannot be had (the CPU lacks those flags, a process
capped below AVX-512, no compiler, a failed build, an unwritable cache), `build_and_load` raises
`Unavailable` with a line saying why, and quickdraft runs torch's own kernels as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quickdraft.models import store

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off")
"""-ffp-contract=off: no multiply-add is fused unless the source asks for it, so each float
operation the source writes rounds once, as the same operation in torch does."""
BUILD_TIMEOUT_S = 120


class Unavailable(Exception):
    """A kernel cannot be had here; the message says why."""


class Once:
    """A kernel built and loaded at most once per process (`get`), or the line saying why not."""

    def __init__(
        self,
        name: str,
        build: Callable[[Path | None], Any],
        describe: Callable[[Any], str] = lambda kernel: f"built in {kernel.path.parent}",
    ) -> None:
        self.name = name
        self.build = build
        """home -> the loaded kernel; raises Unavailable."""
        self.describe = describe
        self.loaded: Any = None
        self.why_not: str | None = None

    def get(self, home: Path | None = None) -> tuple[Any, str]:
        """(the kernel, what was loaded) or (None, why not)."""
        if self.loaded is None and self.why_not is None:
            try:
                self.loaded = self.build(home)
            except Unavailable as why:
                self.why_not = str(why)
                log.info("%s not used: %s", self.name, why)
        if self.loaded is not None:
            return self.loaded, self.describe(self.loaded)
        return None, self.why_not or "unavailable"


def capped_below_avx512() -> str | None:
    """Why this process must not run AVX-512 code though the CPU has it, or None.
    `ATEN_CPU_CAPABILITY=avx2` (with ONEDNN_MAX_CPU_ISA=AVX2) is how an AVX2-only CPU is
    emulated on a wider one: honoured here too, or the emulation would measure kernels the real
    CPU lacks."""
    capped = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if capped in ("default", "avx2", "zvector"):
        return f"ATEN_CPU_CAPABILITY={capped} caps this process below AVX-512"
    return None


def build_and_load(
    source: Path,
    symbols: tuple[str, ...],
    *,
    needed: tuple[str, ...],
    flags: frozenset[str],
    home: Path | None = None,
) -> tuple[list[ctypes._CFuncPtr], Path]:
    """The functions `symbols` of `source`, compiled here (once per machine) and loaded, and
    the library's path; raises Unavailable. `needed`: the CPU flags its code needs, checked
    against `flags` (the CPU's) first."""
    missing = [flag for flag in needed if flag not in flags]
    if missing:
        raise Unavailable(f"the CPU lacks {', '.join(missing)}")
    capped = capped_below_avx512()
    if capped:
        raise Unavailable(capped)
    compiler = _compiler()
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.split("\n", 1)[0]
    except (OSError, subprocess.SubprocessError) as error:
        raise Unavailable(f"{compiler} --version failed: {error}") from None
    try:
        text = source_bytes(source)
    except OSError as error:  # the source or a header it includes is missing
        raise Unavailable(f"could not read its source: {error}") from None
    key = hashlib.sha256(text + repr((FLAGS, compiler, version)).encode()).hexdigest()[:16]
    directory = (home or store.quickdraft_home()) / "kernels"
    path = directory / f"{source.stem}-{key}.so"
    if not path.exists():
        try:
            _build(compiler, source, directory, path)
        except OSError as error:  # the cache is not writable, the disk is full, ...
            raise Unavailable(f"could not build it in {directory}: {error}") from None
    try:
        library = ctypes.CDLL(str(path))
        return [getattr(library, symbol) for symbol in symbols], path
    except (OSError, AttributeError) as error:
        raise Unavailable(f"could not load {path}: {error}") from None


LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def source_bytes(source: Path) -> bytes:
    """What a build of `source` compiles: its bytes, then those of each header beside it that
    it includes (`#include "name.h"`), so a change to a shared header builds it again."""
    text = source.read_bytes()
    headers = [source.parent / name.decode() for name in LOCAL_INCLUDE.findall(text)]
    return text + b"".join(header.read_bytes() for header in headers)


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise Unavailable("no C compiler (cc, gcc or clang) on PATH")


def _build(compiler: str, source: Path, directory: Path, path: Path) -> None:
    """Compile `source` into `path`, through a temporary directory beside it (another process
    building at the same time renames in the same bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=f".tmp-{source.stem}-") as tmp:
        built = Path(tmp) / path.name
        try:
            result = subprocess.run(
                [compiler, *FLAGS, str(source), "-o", str(built)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.SubprocessError as error:
            raise Unavailable(f"{compiler} failed to run: {error}") from None
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise Unavailable(f"{compiler} could not build it: {' / '.join(tail)}")
        os.replace(built, path)

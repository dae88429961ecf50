"""A lean int8 linear for the rows of a decode step, a verify forward or a prefill chunk:
built here, loaded, called.

A decode step of the 1.5B on an AMX Xeon spent 77-83 ms of its 126-158 ms in oneDNN's int8
linears, reading 1.3 GB of weights at 16-17 GB/s where this machine reads 24 GB/s. oneDNN's
general kernel is made for many rows; for one to four rows a plain AVX-512 VNNI loop over the
weights (`int8_rows.c`, which says how), quantizing the rows and scaling the outputs in the
same call, reads them at 23-24 GB/s: 55-62 ms for the same linears, bitwise the same outputs.
Past four rows that loop is bound by its arithmetic. Where the CPU has AMX, tile multiplies
over the same layout (`qd_int8_tiles`) take any number of rows: the 28 layers' linears, ms,
tiles against oneDNN, on 2 cores of that Xeon: 1 row 55/95, 4 56/91, 8 59/94, 16 61/98,
32 77/137, 128 157/228, 512 592/688.

This module compiles and loads the kernel and lays weights out for it. `quantize.Int8Linear`
decides where it runs (rows up to what `quantize.fast_rows` found, on a CPU where it is
exact) and keeps the weights it reads in its layout; oneDNN's prepacked copy is made only for
the rows the kernel does not take.

The source is compiled once per machine (`native_build`). Where there is no compiler, no
AVX-512 VNNI, or the build fails, `load()` says why and quickdraft runs oneDNN alone, as before.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quickdraft.machine import cpu_flags
from quickdraft.models import native_build

SOURCE = Path(__file__).with_name("int8_rows.c")
NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
TILE_FLAGS = ("amx_tile", "amx_int8")
"""What `qd_int8_tiles` needs besides NEEDED_FLAGS (and Linux granting the tile state)."""
MAX_ROWS = 4
"""The most rows one call of the VNNI loop takes (MAX_ROWS in the C source)."""
ANY_ROWS = 1 << 30
"""`RowKernel.max_rows` of a layer the tiles take: any number of rows."""


def fits(out_features: int, in_features: int) -> bool:
    """Whether a layer of this shape has the kernel's layout: whole blocks of 16 output
    channels, inputs in fours (every linear of the Qwen2.5 models does)."""
    return out_features % 16 == 0 and in_features % 4 == 0 and in_features >= 4


def tiles_fit(out_features: int, in_features: int) -> bool:
    """Whether the tiles take a layer of this shape: pairs of channel blocks, inputs in whole
    tiles of 64 (every linear of the Qwen2.5 models)."""
    return out_features % 32 == 0 and in_features % 64 == 0 and in_features >= 64


def block_weights(weight_q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> the kernel's layout (int8_rows.c): bytes w + 128, 16 channels x 4
    inputs per 64 bytes, [N / 16, K / 4, 16, 4]."""
    n, k = weight_q.shape
    shifted = (weight_q.to(torch.int16) + 128).to(torch.uint8)
    return shifted.view(n // 16, 16, k // 4, 4).permute(0, 2, 1, 3).contiguous()


def unblock_weights(blocked: torch.Tensor) -> torch.Tensor:
    """The inverse of `block_weights`: int8 [N, K]."""
    nb, k4, _, _ = blocked.shape
    plain = blocked.permute(0, 2, 1, 3).reshape(nb * 16, k4 * 4)
    return (plain.to(torch.int16) - 128).to(torch.int8)


@dataclass
class RowKernel:
    """The loaded kernel: `call` computes `Int8Linear`'s float32 output, with AMX tiles for
    any rows where `tiles` is set and the layer's shape fits them, else with the VNNI loop
    for up to MAX_ROWS rows (`max_rows`)."""

    function: ctypes._CFuncPtr
    path: Path
    tiles: ctypes._CFuncPtr | None = None
    tiles_note: str = ""
    """Whether the tiles run, and why not where they do not."""
    _held: threading.local = field(default_factory=threading.local, repr=False, compare=False)
    """This thread's scratch (`_scratch`)."""

    def max_rows(self, out_features: int, in_features: int) -> int:
        """The most rows a call takes for a layer of this shape (which `fits`)."""
        if self.tiles is not None and tiles_fit(out_features, in_features):
            return ANY_ROWS
        return MAX_ROWS

    def function_for(self, out_features: int, in_features: int) -> ctypes._CFuncPtr:
        """The function that computes a layer of this shape: the tiles where they take it,
        else the VNNI loop. A layer keeps it (`call`)."""
        if self.tiles is not None and tiles_fit(out_features, in_features):
            return self.tiles
        return self.function

    def call(
        self,
        function: ctypes._CFuncPtr,
        x: torch.Tensor,
        blocked: torch.Tensor,
        n: int,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """`Int8Linear`'s float32 output by `function` (`function_for` its shape): x float32
        [M, K] (contiguous, 1 <= M <= `max_rows`); `blocked` the weights as `block_weights`
        lays them out (N / 16 blocks); weight_scale, bias float32 [N]. A decode step makes
        about a hundred of these calls, so the function is looked up once per layer."""
        rows, k = x.shape
        out = torch.empty(rows, n, dtype=torch.float32)
        status = function(
            x.data_ptr(),
            rows,
            k,
            blocked.data_ptr(),
            n,
            weight_scale.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            self._scratch(function, rows, k).data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(f"int8 rows kernel: no kernel for {rows} rows of {k} -> {n}")
        return out

    def _scratch(self, function: ctypes._CFuncPtr, rows: int, k: int) -> torch.Tensor:
        """The int8 rows a call quantizes into: the tiles pad them to whole pairs of row
        tiles (int8_rows.c). One buffer per thread, grown as needed: a call only writes
        and reads it while it runs."""
        if function is self.tiles:
            rows = -(-rows // 32) * 32
        needed = rows * k
        scratch = getattr(self._held, "scratch", None)
        if scratch is None or scratch.numel() < needed:
            scratch = self._held.scratch = torch.empty(needed, dtype=torch.int8)
        return scratch


_KERNEL = native_build.Once(
    "int8 rows kernel",
    lambda home: _build_and_load(home),
    lambda kernel: f"built in {kernel.path.parent}; {kernel.tiles_note}",
)


def load(home: Path | None = None) -> tuple[RowKernel | None, str]:
    """The kernel, built where needed (once per process), and a line saying what happened:
    (kernel, where it was built) or (None, why not)."""
    return _KERNEL.get(home)


def _build_and_load(home: Path | None) -> RowKernel:
    symbols = ("qd_int8_rows", "qd_int8_tiles", "qd_tiles_enable")
    (function, tiles, enable), path = native_build.build_and_load(
        SOURCE, symbols, needed=NEEDED_FLAGS, flags=cpu_flags(), home=home
    )
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    for linear in (function, tiles):
        linear.argtypes = [pointer, integer, integer, pointer, integer, pointer, pointer]
        linear.argtypes += [pointer, pointer, integer]
        linear.restype = ctypes.c_int
    enable.restype = ctypes.c_int
    lacking = [flag for flag in TILE_FLAGS if flag not in cpu_flags()]
    if lacking:
        return RowKernel(function, path, None, f"AMX tiles off: the CPU lacks {', '.join(lacking)}")
    if enable() != 0:
        note = "AMX tiles off: Linux did not grant the tile state (or the compiler lacks AMX)"
        return RowKernel(function, path, None, note)
    return RowKernel(function, path, tiles, "AMX tiles on")

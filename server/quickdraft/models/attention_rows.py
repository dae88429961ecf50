"""Attention of a forward's decode rows in one C call per layer (`attention_rows.c`).

`quantize.rowwise_attention` keeps a verify forward's rows bitwise a one-token step's by
computing each row alone, one SDPA call per row, each reading the whole KV cache. At a
1,500-token prompt a 16-row verify forward of the 1.5B spent 74 of its 169 ms in attention
(one row: 18 of 104) on 2 AMX cores, the rest of the forward costing about what one row's
did. The C loop computes all of a layer's rows in one call, reading the cache once for them,
each row still alone in a fixed order (the C source says how), so the property holds by
construction. It serves decode steps, verify forwards and tree forwards (a tree row's keys are
the cached prefix and its path's nodes, read where they lie); prefill chunks keep their
batched SDPA calls.

Where the CPU has AMX's bfloat16 tiles, the rows run on them (`qd_attend_rows_tiles`): each
row's scores and the bulk of its weighted values become tile products of bfloat16 pairs with
float32 sums, its last keys (at least 96) are added in float32 as before, and what a row
computes still depends on that row alone (the C source says how). A 16-row tree forward's
attention at 1,400 cached tokens took 0.34 ms a layer that way against 0.74 in float32 (1
row: 0.13 and 0.16; 2 AMX cores). Over 1,280 teacher-forced positions of held-out code the next
token agreed with the text as often (77.0 % against 76.6 %); the two picked another token at
3 % of them, as the float32 kernel and SDPA's rows do between themselves (2.6 %): near-ties.
Elsewhere, and for head dimensions that are not whole multiples of 32, the float32 rows.

Built once per machine (`native_build`) where the CPU has AVX-512; elsewhere, or where it
cannot be built, `load()` says why and the SDPA rows run as before.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quickdraft.machine import cpu_flags
from quickdraft.models import native_build

SOURCE = Path(__file__).with_name("attention_rows.c")
NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512dq")
"""What the kernel's code needs (its TARGET attribute in the C source)."""
TILE_FLAGS = ("amx_tile", "amx_bf16", "avx512_bf16")
"""What its AMX bfloat16 variant needs besides (`qd_attend_rows_tiles`, TILES_TARGET)."""
TILE_HEAD_DIMS = 32
"""Head dimensions the tiles take: whole multiples of this (a tile row holds 32 bfloat16)."""
FLOAT32 = "float32"
TILES = "bfloat16 tiles"


@dataclass
class AttentionKernel:
    """The loaded kernel: `rows` computes a forward's decode rows of one layer."""

    function: ctypes._CFuncPtr
    """The float32 rows (`qd_attend_rows`)."""
    scratch_floats: ctypes._CFuncPtr
    """(rows, heads, head dim, key/value heads, span) -> floats of scratch a call needs."""
    path: Path
    tiles: ctypes._CFuncPtr | None = None
    """The same rows on AMX bfloat16 tiles (`qd_attend_rows_tiles`), where the CPU has them and
    Linux granted them; None elsewhere."""
    _last: threading.local = field(default_factory=threading.local)
    """This thread's last layout (its key, the int32 arrays the C call reads, the span) and its
    scratch, kept between calls."""

    def arithmetic(self, head_dim: int) -> str:
        """How rows of this head dimension are computed: TILES or FLOAT32. The same for every
        decode row of a model, so a row stays bitwise the same in any forward."""
        if self.tiles is not None and head_dim % TILE_HEAD_DIMS == 0:
            return TILES
        return FLOAT32

    def rows(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        prefix: Sequence[int],
        extra: Sequence[torch.Tensor | None],
        scaling: float,
        layout_key: object,
    ) -> torch.Tensor | None:
        """Rows [b, q, h, d] of query [b, h, q, d] over key/value [b, kv_h, L, d]: row i attends
        to positions [0, prefix[i]), then to the positions in extra[i] (None: none). None where
        the tensors are not laid out for the kernel (then they never are, for this model: the
        caller's SDPA rows serve all its forwards alike). `layout_key` names the rows' keys, the
        same for every layer of one forward, so their layout is made once a forward: a tuple
        (compared by value) or an object (by identity, such as a forward's TreeKeys)."""
        batch, heads, q_len, dim = query.shape
        if (
            batch != 1
            or query.dtype != torch.float32
            or key.dtype != torch.float32
            or value.dtype != torch.float32
            or query.stride(3) != 1
            or key.stride(3) != 1
            or key.stride()[1:] != value.stride()[1:]
        ):
            return None
        last = getattr(self._last, "layout", None)
        if last is None or not _same(last[0], layout_key):
            counts = [0 if e is None else len(e) for e in extra]
            offsets = [0] * len(counts)
            for i in range(1, len(counts)):
                offsets[i] = offsets[i - 1] + counts[i - 1]
            listed = [e.to(torch.int32) for e in extra if e is not None and len(e)]
            positions = torch.cat(listed) if listed else torch.zeros(1, dtype=torch.int32)
            ends = [int(e.max()) + 1 for e in extra if e is not None and len(e)]
            last = (
                layout_key,
                torch.tensor(prefix, dtype=torch.int32),
                torch.tensor(offsets, dtype=torch.int32),
                torch.tensor(counts, dtype=torch.int32),
                positions.contiguous(),
                max([*prefix, *ends]),
            )
            self._last.layout = last
        _, starts, offsets, counts, positions, span = last
        kv_heads = key.shape[1]
        floats = self.scratch_floats(q_len, heads, dim, kv_heads, span)
        scratch = getattr(self._last, "scratch", None)
        if scratch is None or scratch.numel() < floats:
            scratch = self._last.scratch = torch.empty(floats, dtype=torch.float32)
        out = torch.empty(batch, q_len, heads, dim, dtype=torch.float32)
        function = self.tiles if self.arithmetic(dim) == TILES else self.function
        status = function(
            query.data_ptr(),
            q_len,
            heads,
            dim,
            query.stride(2),
            query.stride(1),
            key.data_ptr(),
            value.data_ptr(),
            kv_heads,
            key.stride(1),
            key.stride(2),
            starts.data_ptr(),
            offsets.data_ptr(),
            counts.data_ptr(),
            positions.data_ptr(),
            span,
            scaling,
            out.data_ptr(),
            scratch.data_ptr(),
            torch.get_num_threads(),
        )
        return out if status == 0 else None


def _same(held: object, key: object) -> bool:
    if isinstance(held, tuple) and isinstance(key, tuple):
        return held == key
    return held is key  # held, it keeps its id from being reused


_KERNEL = native_build.Once("attention rows kernel", lambda home: _build_and_load(home))


def load(home: Path | None = None) -> tuple[AttentionKernel | None, str]:
    """The kernel, built where needed (once per process), and a line saying what happened:
    (kernel, where it was built) or (None, why not)."""
    return _KERNEL.get(home)


def _build_and_load(home: Path | None) -> AttentionKernel:
    symbols = (
        "qd_attend_rows",
        "qd_attend_scratch_floats",
        "qd_attend_rows_tiles",
        "qd_attend_tiles_enable",
    )
    flags = cpu_flags()
    (function, scratch_floats, tiles, enable), path = native_build.build_and_load(
        SOURCE, symbols, needed=NEEDED_FLAGS, flags=flags, home=home
    )
    pointer, integer, long = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    for rows in (function, tiles):
        rows.argtypes = [pointer, integer, integer, integer, long, long, pointer, pointer]
        rows.argtypes += [integer, long, long, pointer, pointer, pointer, pointer, integer]
        rows.argtypes += [ctypes.c_float, pointer, pointer, integer]
        rows.restype = ctypes.c_int
    scratch_floats.argtypes = [integer] * 5
    scratch_floats.restype = long
    enable.restype = ctypes.c_int
    usable = all(flag in flags for flag in TILE_FLAGS) and enable() == 0
    return AttentionKernel(function, scratch_floats, path, tiles if usable else None)

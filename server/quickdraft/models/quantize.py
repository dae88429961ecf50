"""Batch-invariant int8 linear layers for CPU.

Why not `torch.ao.quantization.quantize_dynamic`: it quantizes activations with one scale per
*tensor*, so the scale of a k-token verify forward depends on all k tokens, and token i's output
differs from what a 1-token step would give. Speculative decoding then stops being
token-identical to plain greedy decoding, which is the promise of this project.

`Int8Linear` quantizes:

* weights once, symmetric per output channel: `Wq[o] = round(W[o] / sw[o])`, `sw[o] = max|W[o]|/127`;
* activations per *row* (per token), symmetric: `xq[r] = round(x[r] / sx[r])`, `sx[r] = max|x[r]|/127`;

multiplies `xq @ Wq^T` exactly in integers (oneDNN's int8 linear with weights prepacked once,
else `torch._int_mm`; for the 1-4 rows of a step, where the CPU has VNNI, the lean kernel of
`int8_rows`, which also quantizes and scales; int32 accumulation, exact for in_features <
2^31 / 127^2 ~ 133k), then
scales elementwise: `y[r, o] = (acc[r, o] * sw[o]) * sx[r]`
(+ bias). Every step is either exact or elementwise on row r alone, so row r of a k-row forward
is bitwise equal to the 1-row forward of that row: batch-invariant by construction (tested).

The rest of the model stays in float32. Exact linears alone do not make a whole forward
batch-invariant: the batched attention kernel rounds differently for a k-row query block than
for one row, and int8 rounding of the next layer's input turns a last-bit difference into a
visible one. So `quantize_model` also switches the model to `rowwise_attention`, which computes
each row in a way fixed by the row alone: a decode/verify row through its own SDPA call, shaped
exactly as a 1-token step at that position would be; a prefill row in the call for its aligned
block of 32 positions, so chunking never changes it. Everything else in these models (embedding
lookup, RMSNorm, rotary, SiLU, residual adds) works row by row already.
`tests/unit/test_models_quantize.py` and `tests/unit/test_identity.py` check it bitwise.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

from quickdraft.decoding.runner import (
    PREFILL_BLOCK,
    PREFILL_KWARG,
    ROWWISE_ATTENTION,
    TREE_KWARG,
    head_dim,
)
from quickdraft.machine import cpu_flags
from quickdraft.models import attention_rows, decoder_loop, int8_rows
from quickdraft.models.fused_linears import fuse_projections
from quickdraft.models.precision import cast_floating

log = logging.getLogger(__name__)

_QMAX = 127.0


INT8_BACKENDS = ("onednn", "onednn7", "int_mm", "float64")
"""The exact integer matmuls `Int8Linear` can use, fastest first on most machines:

* "onednn": oneDNN's prepacked int8 linear with 8-bit weights (exact where the CPU multiplies
  u8·s8 into int32 directly: VNNI, AMX);
* "onednn7": the same with 7-bit weights (|w| <= 63). Without VNNI (AVX2 only), oneDNN adds
  u8·s8 products in pairs into int16, which saturates for 8-bit weights (2·255·127 > 32767)
  but not for 7-bit ones (2·255·63 < 32767), so the sums stay exact;
* "int_mm": `torch._int_mm` (repacks the weights every call);
* "float64": float64 products, exact and slow.

Which ones are exact here is checked (`exact_int8_backends`); which one runs is measured
(`quickdraft.models.cpu_kernels`)."""

WEIGHT_QMAX = {"onednn": 127.0, "onednn7": 63.0, "int_mm": 127.0, "float64": 127.0}


def _onednn_exact(weight_max: int) -> bool:
    """Whether oneDNN's prepacked int8 linear returns exact int32 sums for weights within
    +-weight_max, checked at the extremes where a pairwise int16 sum would saturate."""
    try:
        generator = torch.Generator().manual_seed(1234)
        k, n = 256, 24
        w = torch.randint(
            -weight_max, weight_max + 1, (n, k), dtype=torch.int8, generator=generator
        )
        w[0], w[1] = weight_max, -weight_max
        x = torch.randint(-127, 128, (8, k), dtype=torch.int8, generator=generator)
        x[0], x[1], x[2] = 127, -127, -128
        x[3, ::2], x[3, 1::2] = 127, -127
        exact = (x.long() @ w.long().t()).to(torch.float32)
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        scale, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int64)
        for rows in (8, 1):
            out = _onednn_linear(x[:rows], packed, scale, zeros)
            if not torch.equal(out, exact[:rows]):
                return False
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _int_mm_exact() -> bool:
    try:
        a = torch.full((1, 32), 127, dtype=torch.int8)
        b = torch.full((32, 8), -127, dtype=torch.int8)
        return int(torch._int_mm(a, b)[0, 0]) == 32 * 127 * -127
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


_EXACT: tuple[str, ...] | None = None


def exact_int8_backends() -> tuple[str, ...]:
    """The backends of INT8_BACKENDS whose sums are exact on this machine (float64 always)."""
    global _EXACT
    if _EXACT is None:
        found = []
        if _onednn_exact(127):
            found.append("onednn")
        elif _onednn_exact(63):
            found.append("onednn7")
        if _int_mm_exact():
            found.append("int_mm")
        found.append("float64")
        _EXACT = tuple(found)
    return _EXACT


SLOW_FACTOR = 4.0
"""An exact backend more than this many times slower than `torch._int_mm` on the probe shape is
passed over by `default_int8_backend` (the kernel measurement cuts such a one short too)."""
PROBE_SHAPE = (8, 512, 1024)
"""Rows, in_features, out_features of the probe: one verify-sized call, large enough that the
arithmetic, not the call overhead, decides (4M multiply-adds)."""

_DEFAULT: str | None = None


def default_int8_backend() -> str:
    """The exact backend used when nothing was measured: the first exact one in INT8_BACKENDS
    order, unless one call of the probe shape finds it over SLOW_FACTOR times slower than
    `torch._int_mm`. On one AMD EPYC with AVX-512 oneDNN's int8 was exact but took seconds where
    int_mm took milliseconds; a tiny test model on it ran past every timeout."""
    global _DEFAULT
    if _DEFAULT is None:
        exact = exact_int8_backends()
        _DEFAULT = exact[0]
        if exact[0].startswith("onednn") and "int_mm" in exact:
            onednn_ms, int_mm_ms = _probe_ms(exact[0]), _probe_ms("int_mm")
            if onednn_ms > SLOW_FACTOR * int_mm_ms:
                _DEFAULT = "int_mm"
    return _DEFAULT


def _probe_ms(backend: str) -> float:
    """Best of a few timed calls of one Int8Linear of PROBE_SHAPE (after a warm-up call, in which
    oneDNN builds its kernel); a call already slower than a second ends the timing."""
    rows, k, n = PROBE_SHAPE
    generator = torch.Generator().manual_seed(7)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
    layer = Int8Linear(weight, torch.ones(n), None, backend)
    xq = torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=generator)
    with torch.inference_mode():
        return best_ms(lambda: layer.scaled_int_matmul(xq), repeats=3, give_up_ms=1000.0)


def _onednn_linear(xq, packed, channel_scale, zeros):
    # Activation scale 1, zero points 0: the float32 output is float(exact int32 sum) times the
    # channel's scale, elementwise (the row scale follows, ours).
    return torch.ops.onednn.qlinear_pointwise(
        xq, 1.0, 0, packed, channel_scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


_ROW_BLOCK = 8
"""oneDNN picks slow kernels for some small shapes at 1-3 rows (e.g. N=256 at M=1); rows are
padded to a multiple of 8, which costs nothing measurable (the weights dominate) and cannot
change a result (integer sums are exact, rows independent)."""


FAST_ROWS_PROBE = (1536, 2048)
"""in_features, out_features of the layer `fast_rows` times (a 1.5B's fused q/k/v)."""
FAST_ROWS_MAX = 4
"""The VNNI loop runs for at most this many rows. It reads the weights once a call and does
64 multiply-adds an instruction per row, so it is bound by memory for a few rows and by
arithmetic past them, where oneDNN's AMX kernel is far ahead. The integer matmuls alone over
the 1.5B's 28 layers (1.3 GB, read from memory) on an AMX Xeon, lean against oneDNN, ms: 1 row
55/78, 2 57/80, 4 62/82, 8 115/73. The whole target's forward, one process, kernel off / on:
1 token 117/89 ms, 2 120/96, 3 123/99, 4 127/106, 8 130/128 (oneDNN either way). The probe in
`fast_rows` cannot see that crossing (a layer small enough to time at once sits in this CPU's
cache, where the lean kernel wins at any row count), so it only confirms, in cache, that each
row count up to this one is faster."""
TILE_PROBE_ROWS = (1, 4, 16, 32, 128)
"""Row counts at which `fast_rows` times the AMX tiles against the backend: a step, verify
forwards, a prefill chunk. Faster at all of them, the tiles take every call (ANY_ROWS): in
memory they were faster than oneDNN at every count from 1 to 512 (int8_rows.py)."""

_FAST_ROWS: dict[tuple[str, bool], int] = {}


def fast_rows(backend: str, tiled: bool = False) -> int:
    """Up to how many rows an `Int8Linear` of `backend` runs the lean kernel (`int8_rows`)
    instead, for a layer the AMX tiles take (`tiled`: `RowKernel.max_rows` is ANY_ROWS) or one
    only the VNNI loop takes: 0 where it cannot be built here, where it is not bitwise the
    backend's result on test layers, or where it is not faster; else the largest row count up
    to which it was faster at every count timed on a layer of FAST_ROWS_PROBE (ANY_ROWS where
    the tiles were faster at every one of TILE_PROBE_ROWS). Decided once per process (a tenth
    of a second; the build, once per machine, a few seconds)."""
    if (backend, tiled) not in _FAST_ROWS:
        _FAST_ROWS[backend, tiled] = _measure_fast_rows(backend, tiled)
    return _FAST_ROWS[backend, tiled]


def _measure_fast_rows(backend: str, tiled: bool) -> int:
    kernel, how = int8_rows.load()
    if kernel is None or (tiled and kernel.tiles is None):
        return 0
    generator = torch.Generator().manual_seed(11)
    # Shapes for the VNNI loop (272: not whole pairs of channel blocks; 100 and 8 inputs: not
    # whole tiles) and for the tiles (320: four channel blocks a pass; 96: two). Each kernel
    # call is followed by the backend's: with AMX, oneDNN's own tiles must still be right
    # after ours ran in the same threads.
    vnni_shapes = ((1536, 272, True), (100, 48, False), (8, 16, True))
    shapes = ((1536, 320, True), (128, 96, False)) if tiled else vnni_shapes
    counts = (1, 2, 3, 4, 5, 16, 17, 33, 40) if tiled else range(1, int8_rows.MAX_ROWS + 1)
    with torch.inference_mode():
        for k, n, bias in shapes:
            layer = _random_layer(k, n, bias, backend, generator)
            for rows in counts:
                x = torch.randn(rows, k, generator=generator) * 4.0
                x[0, 0] = 0.0
                lean = layer.rows_kernel_forward(x, kernel)
                if not torch.equal(lean, layer.general_forward(x)):
                    log.warning("int8 rows kernel not used: not bitwise %s's result", backend)
                    return 0
        k, n = FAST_ROWS_PROBE
        layer = _random_layer(k, n, True, backend, generator)
        chosen, timings = 0, []
        for rows in TILE_PROBE_ROWS if tiled else range(1, FAST_ROWS_MAX + 1):
            x = torch.randn(rows, k, generator=generator)
            lean = best_ms(lambda x=x: layer.rows_kernel_forward(x, kernel))
            general = best_ms(lambda x=x: layer.general_forward(x))
            timings.append(f"{rows}: {lean:.2f}/{general:.2f}")
            if lean >= general:
                break
            chosen = rows
    if tiled and chosen == TILE_PROBE_ROWS[-1]:
        chosen = int8_rows.ANY_ROWS
    log.info(
        "int8 rows kernel (%s, %s) for up to %s rows; ms lean/%s at %dx%d, rows %s",
        "AMX tiles" if tiled else "VNNI",
        how,
        "any" if chosen == int8_rows.ANY_ROWS else chosen,
        backend,
        k,
        n,
        ", ".join(timings),
    )
    return chosen


def _random_layer(k: int, n: int, bias: bool, backend: str, generator) -> Int8Linear:
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
    scale = torch.rand(n, generator=generator) * 0.01
    bias_values = torch.randn(n, generator=generator) if bias else None
    return Int8Linear(weight, scale, bias_values, backend, rows=int8_rows.ANY_ROWS)


def best_ms(call, repeats: int = 7, give_up_ms: float = float("inf")) -> float:
    """The fastest of `repeats` timed calls of `call`, in ms, after one untimed warm-up call
    (where oneDNN builds its kernel for the shape); the repeats stop once the best is slower
    than `give_up_ms` (a hopeless candidate is not timed again)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
        if best * 1000 > give_up_ms:
            break
    return best * 1000


def quantize_rows(x: torch.Tensor, qmax: float = _QMAX) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per row of a 2-D float tensor. (Every
    `Int8Linear` call runs it: the quotient is rounded and clamped in place, one temporary the
    size of `x` rather than two.)"""
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = (amax / qmax).clamp_(min=torch.finfo(x.dtype).tiny)
    q = torch.div(x, scale).round_().clamp_(-qmax, qmax).to(torch.int8)
    return q, scale


def quantize_weight(
    weight: torch.Tensor, chunk_rows: int = 256, qmax: float = _QMAX
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows` of a weight of any float dtype (same values), computed in float32 a small
    block of rows at a time, in place: large temporaries cost more in page faults than in
    arithmetic, and a 151,936-row lm_head never needs a float32 copy in full."""
    rows = weight.shape[0]
    q = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(rows, 1, dtype=torch.float32)
    tiny = torch.finfo(torch.float32).tiny
    for start in range(0, rows, chunk_rows):
        block = weight[start : start + chunk_rows].to(torch.float32, copy=True)
        low, high = torch.aminmax(block, dim=-1, keepdim=True)
        amax = torch.maximum(low.neg_(), high)  # == block.abs().amax(-1), exactly
        block_scale = (amax / qmax).clamp_(min=tiny)
        block.div_(block_scale).round_().clamp_(-qmax, qmax)
        q[start : start + chunk_rows] = block
        scale[start : start + chunk_rows] = block_scale
    return q, scale


class Int8Linear(nn.Module):
    """A drop-in `nn.Linear` replacement (float32 in and out) with int8 weights."""

    def __init__(
        self,
        weight_q: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        backend: str | None = None,
        rows: int | None = None,
    ):
        """`rows`: up to how many rows a call runs the lean kernel (default: `fast_rows`;
        never more than the kernel takes for this shape)."""
        super().__init__()
        self.out_features, self.in_features = weight_q.shape
        self.backend = backend or default_int8_backend()
        kernel = None
        if rows != 0 and int8_rows.fits(self.out_features, self.in_features):
            kernel, _ = int8_rows.load()
        self.kernel_rows = 0
        if kernel is not None:
            most = kernel.max_rows(self.out_features, self.in_features)
            if rows is None:
                rows = fast_rows(self.backend, tiled=most == int8_rows.ANY_ROWS)
            self.kernel_rows = min(rows, most)
        self._row_function = (
            (kernel, kernel.function_for(self.out_features, self.in_features))
            if kernel is not None and self.kernel_rows > 0
            else None
        )
        """(the kernel, its function for this layer's shape) where calls run it."""
        self.register_buffer("weight_scale", weight_scale.reshape(1, -1).to(torch.float32))
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32))
        # The lean kernel reads its own layout of the weights, oneDNN its prepacked copy, the
        # other backends the plain one. A layer keeps the copies something of it reads: where
        # the kernel takes every call, oneDNN's copy is made only if a call ever needs it
        # (a compiled forward, `general_forward`).
        self._onednn = self.backend in ("onednn", "onednn7")
        self.register_buffer("weight_q", None if self._onednn else weight_q.contiguous())
        blocked = int8_rows.block_weights(weight_q) if self.kernel_rows > 0 else None
        self.register_buffer("weight_blocked", blocked)
        self._packed = None  # an opaque oneDNN tensor: not a buffer (no storage to save or move)
        self._zeros = torch.zeros(self.out_features, dtype=torch.int64) if self._onednn else None
        if self._onednn and self.kernel_rows < int8_rows.ANY_ROWS:
            self._packed = torch.ops.onednn.qlinear_prepack(weight_q.contiguous(), None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, backend: str | None = None) -> Int8Linear:
        backend = backend or default_int8_backend()
        # Per output channel = row of W; 7-bit where the backend needs it.
        q, scale = quantize_weight(linear.weight.detach(), qmax=WEIGHT_QMAX[backend])
        return cls(q, scale.reshape(-1), linear.bias, backend)

    def __deepcopy__(self, memo):
        copy = Int8Linear(
            self.int8_weight(),
            self.weight_scale.reshape(-1),
            self.bias,
            self.backend,
            self.kernel_rows,
        )
        memo[id(self)] = copy
        return copy

    @property
    def weight(self) -> torch.Tensor:
        """A stand-in of the weight's shape, dtype (int8) and device, for code that reads
        `.weight.shape` (as the engine does with the lm_head). It holds no data: use
        `int8_weight()` or `dequantized_weight()` for values."""
        return torch.zeros((), dtype=torch.int8).expand(self.out_features, self.in_features)

    @property
    def step_weight_bytes(self) -> int:
        """Bytes a one-row step reads from this layer: one copy of the int8 weights (whichever
        it holds and reads), the channel scales and the bias."""
        extra = self.weight_scale.numel() * 4 + (0 if self.bias is None else self.bias.numel() * 4)
        return self.out_features * self.in_features + extra

    def int8_weight(self) -> torch.Tensor:
        if self.weight_q is not None:
            return self.weight_q
        if self.weight_blocked is not None:
            return int8_rows.unblock_weights(self.weight_blocked)
        return self._packed.to_dense().t().contiguous()

    def onednn_packed(self) -> Any:
        """oneDNN's prepacked weights, made at the first call that needs them (or by
        `before_compile`: a compiled forward cannot make them)."""
        if self._packed is None:
            self._packed = torch.ops.onednn.qlinear_prepack(self.int8_weight(), None)
        return self._packed

    def before_compile(self) -> None:
        """Called by a runner before it compiles the model: a compiled forward runs the
        backend (`forward`), whose weights are made here where eager calls never needed them."""
        if self._onednn:
            self.onednn_packed()

    def dequantized_weight(self) -> torch.Tensor:
        return self.int8_weight().to(torch.float32) * self.weight_scale.reshape(-1, 1)

    def scaled_int_matmul(self, xq: torch.Tensor) -> torch.Tensor:
        """`float32(xq @ Wq^T) * channel_scale` ([M, K] int8 -> [M, N]); the sum is exact."""
        if self._onednn:
            rows = xq.shape[0]
            pad = -rows % _ROW_BLOCK
            if pad:
                xq = torch.cat([xq, xq.new_zeros(pad, xq.shape[1])])
            packed = self.onednn_packed()
            out = _onednn_linear(xq, packed, self.weight_scale.reshape(-1), self._zeros)
            return out[:rows] if pad else out
        if self.backend == "int_mm":
            acc = torch._int_mm(xq, self.weight_q.t())
        else:
            # float64 holds every partial sum exactly (|sum| < 2^53), whatever the order.
            acc = (xq.to(torch.float64) @ self.weight_q.t().to(torch.float64)).to(torch.int32)
        return acc.to(torch.float32).mul_(self.weight_scale)

    def rows_kernel_forward(self, x: torch.Tensor, kernel: int8_rows.RowKernel) -> torch.Tensor:
        """`forward` of a float32 [rows, in_features] input by the lean kernel: bitwise the same
        (checked where it is enabled: `fast_rows`)."""
        return self._kernel_forward(
            kernel, kernel.function_for(self.out_features, self.in_features), x
        )

    def _kernel_forward(
        self, kernel: int8_rows.RowKernel, function: Any, rows: torch.Tensor
    ) -> torch.Tensor:
        return kernel.call(
            function,
            rows.contiguous(),
            self.weight_blocked,
            self.out_features,
            self.weight_scale,
            self.bias,
        )

    def general_forward(self, rows: torch.Tensor) -> torch.Tensor:
        """`forward` of float32 [rows, in_features] by quantize_rows and the backend."""
        xq, xs = quantize_rows(rows)
        out = self.scaled_int_matmul(xq).mul_(xs)
        if self.bias is not None:
            out = out.add_(self.bias)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decode step calls this about a hundred times: what the call itself costs counts
        # (no dtype round trip for float32, the kernel's function kept since loading).
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if rows.dtype != torch.float32:
            rows = rows.to(torch.float32)
        if 0 < rows.shape[0] <= self.kernel_rows and not torch.compiler.is_compiling():
            out = self._kernel_forward(*self._row_function, rows)
        else:
            out = self.general_forward(rows)
        out = out.reshape(*shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int8 per-row, {self.backend}"
        )


ROWWISE_MAX_ROWS = 65
"""Forwards of up to this many new tokens are decode/verify steps unless the caller says
otherwise (`PREFILL_KWARG`, the runners' contract: decoding.runner); longer ones are prefill
chunks."""


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention in which a row's result never depends on how the rows were batched.

    query [b, h, q, d]; key/value [b, kv_h, L, d]. Query row i stands at position p_i: the
    `cache_position` transformers passes (a static cache, whose L is its capacity), else
    L - q + i (a growing cache, whose keys end at the new tokens). Row i sees keys up to p_i
    (and no further back than `sliding_window`). Each row is computed in one of two fixed ways:

    * decode and verify steps: one SDPA call per row, shaped exactly as a 1-token step at p_i
      (the n_rep query heads sharing a key/value head go in as n_rep rows of that head, as
      transformers does for 1-token steps, so GQA needs no copy of the keys). A k-token verify
      therefore gives bitwise the rows of k one-token steps.
    * prefill: row i is computed in the call for its aligned block of `PREFILL_BLOCK`
      positions, [B, B + 32) with B = 32 * (p_i // 32): the block's queries (rows of the block
      outside this forward are zeros; the query heads that share a key/value head as one head
      of their rows), keys [0, B + 32) (zeros past the cache's end), and the causal mask.
      The call's shapes depend on the block alone and a row's arithmetic on its
      own inputs alone, so row i comes out the same whatever chunk it arrived in: a reused
      prefix plus one chunk equals a cold prefill in any chunking, at the cost of a batched
      call (a call per row would make prefill about 30 % slower on a 1.5B model).

    A step may begin with prompt rows (`PREFILL_KWARG` a number: `_prompt_then_step_rows`):
    those are computed the prefill's way, the rest the step's.

    Masked keys contribute exact zeros, so keys past p_i (stale entries of a static cache,
    the zero padding) never change a row. Under torch.compile (the static cache's fixed-shape
    steps) positions are data, not Python numbers: every row then attends over all L keys
    with a mask, per row, so compiled steps stay batch-invariant among themselves. Padding
    masks are not supported: quickdraft runs one unpadded sequence; transformers passes no
    mask to a custom attention anyway.
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    window = sliding_window or getattr(module, "sliding_window", None)
    prefill = kwargs.get(PREFILL_KWARG)
    if prefill is None:
        prefill = q_len > ROWWISE_MAX_ROWS
    cache_position = kwargs.get("cache_position")
    tree = kwargs.get(TREE_KWARG)
    if prefill is not True and prefill:  # a step whose first rows are prompt tokens
        return _prompt_then_step_rows(
            module, query, key, value, int(prefill), scaling, window, tree, kwargs
        )
    if tree is not None:
        # A row on the first branch reads the cache up to its node; any other, the prefix
        # and then its path's positions.
        starts = [
            tree.base + depth + 1 if tail is None else tree.base
            for depth, tail in zip(tree.depths, tree.tails, strict=True)
        ]
        out = _kernel_rows(query, key, value, starts, tree.tails, scaling, window, tree)
        if out is None:
            out = _tree_rows(query, key, value, tree, scaling, window)
        return out, None
    if torch.compiler.is_compiling():
        if cache_position is None:
            cache_position = torch.arange(kv_len - q_len, kv_len, device=query.device)
        out = _masked_rows(query, key, value, cache_position, scaling, window)
    else:
        positions = (
            cache_position.tolist() if cache_position is not None else range(kv_len - q_len, kv_len)
        )
        out = None
        if not prefill:
            ends = [position + 1 for position in positions]
            out = _kernel_rows(
                query, key, value, ends, [None] * q_len, scaling, window, tuple(ends)
            )
        if out is None:
            if prefill:
                dtype = prefill_attention(module)
                out = _block_rows(query, key, value, positions, scaling, window, dtype)
            else:
                out = _step_rows(query, key, value, positions, scaling, window)
    return out, None  # [b, q, h, d]


def _prompt_then_step_rows(module, query, key, value, prompt_rows, scaling, window, tree, kwargs):
    """A decode step or tree forward whose first `prompt_rows` rows are prompt tokens
    (`ModelRunner.forward`'s `prompt`): those rows as a prefill computes them (`_block_rows`,
    the same whatever forward holds a row: the later rows' keys lie past theirs, masked out
    as a prefill's padding is), the others as the step would alone. So the forward gives
    bitwise what a prefill of those tokens and then the step give."""
    if torch.compiler.is_compiling():
        raise RuntimeError("prompt rows are not folded into compiled steps")
    cache_position = kwargs.get("cache_position")
    if tree is not None:
        first = tree.base - prompt_rows
    elif cache_position is not None:
        first = int(cache_position[0])
    else:
        first = key.shape[2] - query.shape[2]
    positions = range(first, first + prompt_rows)
    head = _block_rows(
        query[:, :, :prompt_rows], key, value, positions, scaling, window, prefill_attention(module)
    )
    step_kwargs = {**kwargs, PREFILL_KWARG: False}
    if cache_position is not None:
        step_kwargs["cache_position"] = cache_position[prompt_rows:]
    rest, _ = rowwise_attention(
        module,
        query[:, :, prompt_rows:],
        key,
        value,
        None,
        scaling=scaling,
        sliding_window=window,
        **step_kwargs,
    )
    return torch.cat([head, rest], dim=1), None


def decode_attention_arithmetic(model: nn.Module) -> str | bool:
    """How the C kernel computes `model`'s decode rows (`attention_rows.TILES` or `FLOAT32`),
    False where it does not run here (SDPA rows)."""
    kernel, _ = attention_rows.load()
    if kernel is None:
        return False
    return kernel.arithmetic(head_dim(model.config))


def _kernel_rows(query, key, value, starts, extra, scaling, window, layout_key):
    """Decode rows by `attention_rows` (one C call; see there), or None where it does not run
    (not built here, a sliding window, tensors it does not take: then every decode row of
    this model goes through SDPA, as the caller does). Never under torch.compile, which
    cannot trace a C call (compiled steps attend by `_masked_rows`)."""
    if window or torch.compiler.is_compiling():
        return None
    kernel, _ = attention_rows.load()
    if kernel is None:
        return None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kernel.rows(query, key, value, starts, extra, scale, layout_key)


def _attend_row(query, i, key, value, end, scaling, window):
    """Query row i over keys/values [:end] (the last `window` of them where a window is set),
    as a one-token step computes it: grouped heads, one SDPA call. -> (batch, heads, dim)."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    start = max(0, end - window) if window else 0
    q_i = query[:, :, i, :].reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        q_i, key[:, :, start:end], value[:, :, start:end], scale=scaling
    )
    return out.reshape(batch, heads, value.shape[-1])


def _step_rows(query, key, value, positions, scaling, window):
    rows = [
        _attend_row(query, i, key, value, position + 1, scaling, window)
        for i, position in enumerate(positions)
    ]
    return torch.stack(rows, dim=1)


def _tree_rows(query, key, value, tree, scaling, window):
    """A tree forward's rows (decoding.runner.TreeKeys): row i attends to the cached prefix and
    then its path's nodes, in keys laid out exactly as a one-token step at the end of that path
    sees them, so each row is bitwise that step's. The cache holds the nodes in order after the
    prefix: a row on the first branch reads a slice of it as it is; for any other row its
    path's nodes are written over the start of the tree's part of the cache (from a copy of
    that part, the tree's few positions), and put back after the row. The prefix is never
    copied (a copy of it per layer was about 2 % of an 8-node tree forward at a 1,500-token
    prompt on a 2-core Xeon; what such a forward costs beyond a step is mostly each row reading
    the whole KV cache again)."""
    base = tree.base
    keys_of_nodes = values_of_nodes = None
    rows = []
    for i, tail in enumerate(tree.tails):
        end = base + tree.depths[i] + 1
        if tail is None:
            rows.append(_attend_row(query, i, key, value, end, scaling, window))
            continue
        if keys_of_nodes is None:
            keys_of_nodes = key[:, :, base:].clone()
            values_of_nodes = value[:, :, base:].clone()
        path = tail - base
        key[:, :, base:end] = keys_of_nodes.index_select(2, path)
        value[:, :, base:end] = values_of_nodes.index_select(2, path)
        rows.append(_attend_row(query, i, key, value, end, scaling, window))
        key[:, :, base:end] = keys_of_nodes[:, :, : end - base]
        value[:, :, base:end] = values_of_nodes[:, :, : end - base]
    return torch.stack(rows, dim=1)


def _block_rows(query, key, value, positions, scaling, window, dtype=None):
    """Prefill rows, one SDPA call per aligned block (`rowwise_attention`). The query heads
    that share a key/value head go in as one head of `groups` x PREFILL_BLOCK rows, with the
    block's additive mask repeated for each (`_block_mask`): each key and value is then read
    once per key/value head, not once per query head (attention 17-21 % faster on the 1.5B
    at 160-3,072 keys on 2 AMX cores, where the rows came out bitwise as from a call per
    query head).

    `dtype` (`prefill_attention`): the calls compute in it, queries, keys and values
    converted once per forward and layer, and the rows come back in the query's dtype. An
    element's conversion depends on it alone, so a row still depends on its block alone."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    size = PREFILL_BLOCK
    out = query.new_empty(batch, heads, q_len, value.shape[-1])
    through = None  # keys and values through the last block's end, in `dtype`
    if dtype is not None and dtype != query.dtype:
        end_of_last = positions[-1] - positions[-1] % size + size
        through = _through(key, end_of_last).to(dtype), _through(value, end_of_last).to(dtype)
        query = query.to(dtype)
    i = 0
    while i < q_len:
        first = positions[i] - positions[i] % size  # the block's first position
        j = i + 1  # rows i..j-1: consecutive positions in this block
        while j < q_len and positions[j] == positions[j - 1] + 1 and positions[j] < first + size:
            j += 1
        end, offset = first + size, positions[i] - first
        block = query.new_zeros(batch, heads, size, dim)
        block[:, :, offset : offset + j - i] = query[:, :, i:j]
        if through is None:
            keys, values = _through(key, end), _through(value, end)
        else:
            keys, values = through[0][:, :, :end], through[1][:, :, :end]
        mask = _block_mask(first, window, groups, keys.shape[2], query.dtype, query.device)
        result = torch.nn.functional.scaled_dot_product_attention(
            block.reshape(batch, kv_heads, groups * size, dim),
            keys,
            values,
            attn_mask=mask,
            scale=scaling,
        ).reshape(batch, heads, size, value.shape[-1])
        out[:, :, i:j] = result[:, :, offset : offset + j - i]
        i = j
    return out.transpose(1, 2)


_BLOCK_MASKS: dict[tuple, torch.Tensor] = {}
BLOCK_MASK_BYTES = 64 << 20
"""The most `_block_mask` keeps (a chunk's blocks recur in each of the model's layers)."""


def _block_mask(first, window, groups, end, dtype, device) -> torch.Tensor:
    """The additive mask (0 where a row may look, -inf elsewhere) of the prefill block
    starting at position `first`, over keys [0, end), its PREFILL_BLOCK rows repeated for
    `groups` query heads. Kept while at most BLOCK_MASK_BYTES are: a chunk's forward asks for
    the same masks in every layer."""
    key = (first, window, groups, end, dtype, device)
    mask = _BLOCK_MASKS.get(key)
    if mask is None:
        rows = torch.arange(first, first + PREFILL_BLOCK, device=device)[:, None]
        cols = torch.arange(end, device=device)[None, :]
        hidden = cols > rows
        if window:
            hidden |= cols <= rows - window
        mask = torch.zeros(PREFILL_BLOCK, end, dtype=dtype, device=device)
        mask = mask.masked_fill(hidden, float("-inf")).repeat(groups, 1)
        held = sum(m.numel() * m.element_size() for m in _BLOCK_MASKS.values())
        if held + mask.numel() * mask.element_size() > BLOCK_MASK_BYTES:
            _BLOCK_MASKS.clear()
        _BLOCK_MASKS[key] = mask
    return mask


def _through(cached: torch.Tensor, end: int) -> torch.Tensor:
    """`cached` [b, h, L, d] as positions [0, end): a slice where L >= end; else a view that
    reaches past L into room its storage has beyond it (the growing cache's buffers, whose
    unwritten positions are zeros and whose cropped ones hold finite keys: masked, either
    adds exact zeros, as padding does); else a zero-padded copy. The view spares a prefill
    chunk's last block a copy of the whole cache per layer (12 ms of a one-token prefill of
    the 1.5B at 1,500 cached tokens, 29 ms at 3,000, on 2 AMX cores)."""
    held = cached.shape[2]
    if held >= end:
        return cached[:, :, :end]
    size = (*cached.shape[:2], end, cached.shape[3])
    stride = cached.stride()
    last = cached.storage_offset() + sum((n - 1) * k for n, k in zip(size, stride, strict=True))
    room = cached.untyped_storage().nbytes() // cached.element_size()
    rows_apart = all(stride[i] >= size[i + 1] * stride[i + 1] for i in range(3))
    if stride[3] == 1 and rows_apart and last < room:
        return cached.as_strided(size, stride, cached.storage_offset())
    return torch.nn.functional.pad(cached, (0, 0, 0, end - held))


def _masked_rows(query, key, value, positions, scaling, window):
    """Per row over all keys with a mask: shapes independent of the positions (compiled)."""
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    cols = torch.arange(kv_len, device=query.device)
    rows = []
    for i in range(q_len):
        allowed = cols <= positions[i]
        if window:
            allowed = allowed & (cols > positions[i] - window)
        q_i = query[:, :, i, :].reshape(batch, kv_heads, heads // kv_heads, dim)
        out = torch.nn.functional.scaled_dot_product_attention(
            q_i, key, value, attn_mask=allowed[None, :], scale=scaling
        )
        rows.append(out.reshape(batch, heads, value.shape[-1]))
    return torch.stack(rows, dim=1)


def _register_attention() -> None:
    if ROWWISE_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)


PREFILL_ATTENTION_ATTRIBUTE = "quickdraft_prefill_attention"
"""The attribute of a decoder layer's attention module naming the dtype its prefill rows'
attention computes in (`use_prefill_attention`); the queries' own (float32) where unset."""


def prefill_attention(module: nn.Module | None) -> torch.dtype | None:
    """The dtype `module`'s prefill rows attend in (`use_prefill_attention`), None for its
    queries' own (and for no module: attention called on its own)."""
    return None if module is None else vars(module).get(PREFILL_ATTENTION_ATTRIBUTE)


def default_prefill_attention() -> torch.dtype | None:
    """bfloat16 where the CPU has AMX's bfloat16 tiles: there a prefill block's attention ran
    2.4-2.9x faster than in float32 (2 cores, 512-1,600 keys), a 293-token prefill after 1,400
    cached tokens of the 1.5B 28 % faster, and the int8 model's next-token agreement with the
    float32 model stayed within a token in 1,856 (97.95 % -> 97.90 %, held-out code).
    Elsewhere None: float32, as before. Other CPUs were not measured (emulating another ISA
    with ONEDNN_MAX_CPU_ISA does not keep torch's attention off AMX), and bfloat16 without
    native support is slower, so it stays off there."""
    return torch.bfloat16 if "amx_bf16" in cpu_flags() else None


def use_prefill_attention(model: nn.Module, dtype: torch.dtype | None) -> None:
    """Make the row-wise attention of `model`'s decoder layers compute prefill rows (prefill
    chunks, and the prompt rows a step folds in) in `dtype`, None for float32. Decode and
    verify rows are untouched; a prefill row still depends on its block alone, so any chunking
    gives the same cache. A model's prefills must all run alike: set it before the first."""
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "scaling"):  # an attention module
            vars(module)[PREFILL_ATTENTION_ATTRIBUTE] = dtype


def use_rowwise_attention(model: nn.Module) -> None:
    _register_attention()
    model.set_attn_implementation(ROWWISE_ATTENTION)
    # Its decode rows' kernel is built (once per machine, about a second) while the model
    # loads, not in the first request's forward.
    attention_rows.load()


# lm_head: decided by measurement (see models/README.md, "int8 on CPU"). Quantizing it is where
# most of the speed is for small models (the 151,936-row head is a fifth of the 1.5B's weights).
QUANTIZE_LM_HEAD = True


def quantize_model(
    model: nn.Module,
    *,
    lm_head: bool | None = None,
    rowwise: bool = True,
    backend: str | None = None,
    fuse: bool = True,
    loop: bool = True,
    prefill_attention_dtype: torch.dtype | None | str = "auto",
) -> nn.Module:
    """Replace every `nn.Linear` (and the lm_head unless told not to) by `Int8Linear`, in place,
    and switch attention to `rowwise_attention` (unless `rowwise=False`); the rest of the model
    is cast to float32.

    The model must be on CPU, in float32 or in the bfloat16/float16 its checkpoint holds (the
    upcast is exact, so the result is the same bit for bit, with half the peak memory). Tied
    input embeddings stay float (the lookup does not touch the head's int8 copy). Projections
    of one input (q, k, v; gate, up) become one integer matmul each unless `fuse=False`
    (fused_linears: bitwise the same outputs, fewer calls a step). With row-wise attention the
    decoder runs its layers in one loop unless `loop=False` (decoder_loop: fewer Python frames
    a forward; between the matmuls the C glue where it loads, which rounds otherwise than
    torch but alike in every forward, else torch, bitwise the model's own forward). Prefill
    rows attend in `prefill_attention_dtype` ("auto": `default_prefill_attention`; None:
    float32).
    """
    lm_head = QUANTIZE_LM_HEAD if lm_head is None else lm_head
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or isinstance(child, Int8Linear):
                continue
            if child is head and not lm_head:
                continue
            setattr(parent, name, Int8Linear.from_linear(child, backend))
            replaced += 1
    cast_floating(model, torch.float32)  # a StoredEmbedding keeps its half-precision table
    fused = fuse_projections(model, Int8Linear) if fuse else 0
    if not rowwise:
        prefill_attention_dtype = None  # the model's own attention, as it is
    elif prefill_attention_dtype == "auto":
        prefill_attention_dtype = default_prefill_attention()
    if rowwise:
        use_rowwise_attention(model)
        use_prefill_attention(model, prefill_attention_dtype)
    looped = rowwise and loop and decoder_loop.install(model, rowwise_attention)
    model._quickdraft_int8 = {
        "backend": backend or default_int8_backend(),
        "lean_rows": max(
            (m.kernel_rows for m in model.modules() if isinstance(m, Int8Linear)), default=0
        ),
        "linears": replaced,
        "fused_groups": fused,
        "decoder_loop": looped,
        "layer_glue": looped and decoder_loop.glued(model),  # another step: calibrate again
        "lm_head": bool(lm_head and head is not None),
        "attention": ROWWISE_ATTENTION if rowwise else model.config._attn_implementation,
        # Decode rows in one C call (which arithmetic) or by SDPA: part of what a
        # calibration measured, and of what the model writes.
        "attention_kernel": rowwise and decode_attention_arithmetic(model),
        "prefill_attention": str(prefill_attention_dtype or torch.float32).removeprefix("torch."),
    }
    return model

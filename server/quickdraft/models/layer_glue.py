"""The per-row work between a decoder layer's matmuls in one C call each (`layer_glue.c`).

Between its integer matmuls a layer of the 1.5B does about 25 small torch operations a
forward: the residual adds, two RMSNorms (six operations each), the rotary embedding of the
queries and keys, SiLU(gate) * up. Alone an RMSNorm takes 15-35 microseconds; in a decode
step, after the weights have streamed through the caches, about 100. On 2 AMX cores these
were about 14 ms of the target's 115-ms step at 1,400 cached tokens and 10 of the draft's 52.
Here they are four calls a layer (the residual add with the norm after it, twice; the rotary
of the queries and of the keys, in place; SiLU(gate) * up): the target's step 8.8 % faster,
its 16-token forward 11.5 %, the draft's step 17 %, a 300-token prefill 11 % (one process,
interleaved, same sitting).

Built once per machine (`native_build`) where the CPU has AVX-512; elsewhere, or where it
cannot be built, `load()` says why and the layers' own torch operations run. The results
differ from torch's in the last bits; `decoder_loop` computes every forward of a model the one
way, so verify forwards stay bitwise their steps and a warm prefill its cold one.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.machine import cpu_flags
from quickdraft.models import native_build

SOURCE = Path(__file__).with_name("layer_glue.c")
NEEDED_FLAGS = ("avx512f",)
"""What the kernel's code needs (its TARGET attribute in the C source)."""


@dataclass
class LayerGlue:
    """The loaded functions; every method takes float32 tensors of one sequence."""

    add_rms_norm_fn: ctypes._CFuncPtr
    rotary_fn: ctypes._CFuncPtr
    silu_mul_fn: ctypes._CFuncPtr
    path: Path

    def __deepcopy__(self, memo: dict) -> LayerGlue:
        return self  # the process's one loaded library (a model's deep copy shares it)

    def add_rms_norm(
        self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """`hidden += delta` in place (where given), then its RMSNorm times `weight`: a new
        tensor. hidden, delta contiguous [..., dim]."""
        _laid_out(hidden, delta)
        dim = hidden.shape[-1]
        out = torch.empty_like(hidden)
        status = self.add_rms_norm_fn(
            hidden.data_ptr(),
            None if delta is None else delta.data_ptr(),
            weight.data_ptr(),
            eps,
            hidden.numel() // dim,
            dim,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        _check(status, "add_rms_norm", hidden.shape)
        return out

    def rotary(
        self, states: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> None:
        """Rotate `heads` heads of each row of states [1, rows, >= heads * dim] (its last
        dimension contiguous, rows any stride apart) in place; cos, sin contiguous [rows, dim]."""
        if states.dtype != torch.float32 or states.stride(-1) != 1:
            raise ValueError("layer glue: rotary takes float32 rows whose last dimension is whole")
        _laid_out(cos, sin)
        rows, dim = cos.shape[-2], cos.shape[-1]
        status = self.rotary_fn(
            states.data_ptr(),
            rows,
            heads,
            dim,
            states.stride(-2),
            cos.data_ptr(),
            sin.data_ptr(),
            torch.get_num_threads(),
        )
        _check(status, "rotary", states.shape)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of gate_up [..., 2 * width] (gate, then up; contiguous)."""
        _laid_out(gate_up)
        width = gate_up.shape[-1] // 2
        out = torch.empty(*gate_up.shape[:-1], width, dtype=torch.float32)
        status = self.silu_mul_fn(
            gate_up.data_ptr(),
            gate_up.numel() // (2 * width),
            width,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        _check(status, "silu_mul", gate_up.shape)
        return out


def _laid_out(*tensors: torch.Tensor | None) -> None:
    """The C calls read float32 rows that lie one after another."""
    for tensor in tensors:
        if tensor is not None and (tensor.dtype != torch.float32 or not tensor.is_contiguous()):
            raise ValueError("layer glue: it takes contiguous float32 tensors")


def _check(status: int, what: str, shape: torch.Size) -> None:
    if status != 0:
        raise ValueError(f"layer glue: {what} does not take a tensor of shape {tuple(shape)}")


def fits(hidden_size: int, head_dim: int, intermediate_size: int) -> bool:
    """Whether a model of these sizes is laid out for the kernels: rows in whole vectors of 16
    floats, heads in whole vectors per half."""
    return hidden_size % 16 == 0 and head_dim % 32 == 0 and intermediate_size % 16 == 0


_KERNEL = native_build.Once("layer glue kernel", lambda home: _build_and_load(home))


def load(home: Path | None = None) -> tuple[LayerGlue | None, str]:
    """The kernel, built where needed (once per process), and a line saying what happened:
    (kernel, where it was built) or (None, why not)."""
    return _KERNEL.get(home)


def _build_and_load(home: Path | None) -> LayerGlue:
    symbols = ("qd_add_rms_norm", "qd_rotary", "qd_silu_mul")
    (norm, rotary, silu_mul), path = native_build.build_and_load(
        SOURCE, symbols, needed=NEEDED_FLAGS, flags=cpu_flags(), home=home
    )
    pointer, integer, long = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    norm.argtypes = [pointer, pointer, pointer, ctypes.c_float, integer, integer, pointer, integer]
    rotary.argtypes = [pointer, integer, integer, integer, long, pointer, pointer, integer]
    silu_mul.argtypes = [pointer, integer, integer, pointer, integer]
    for function in (norm, rotary, silu_mul):
        function.restype = integer
    return LayerGlue(norm, rotary, silu_mul, path)

"""One integer matmul for the projections that read the same input: q, k and v; gate and up.

A decode step of a small model on a CPU is dominated by fixed costs per call: each `Int8Linear`
quantizes its input rows, pads them and calls oneDNN, and the k and v projections of a
grouped-query model are tiny (256 outputs for the 1.5B's 1536 inputs). Fusing the projections
of one input makes 4 calls a layer of 7, and quantizes each input once.

The result is bitwise the unfused one: every output of an `Int8Linear` is
`float(exact integer sum) * channel scale * row scale (+ bias)`, and the row scale depends on
the input row alone, so concatenating the weights (and their per-channel scales and biases)
changes no element. `tests/unit/test_models_fused_linears.py` checks it.

How it plugs in without rewriting the model's forward: the first projection of a group called
with an input computes all of the group's outputs in one call and keeps them until each
projection of the group has taken its part of that same input (transformers' Qwen2 and Llama
call q, k, v, and gate, up, one after the other on one tensor). A projection called with any
other input computes the group afresh, so a caller in another order is slower, never wrong.
Under torch.compile the parts compute the fused call each (dynamo does not keep Python state
between calls): `fuse_projections` is meant for the eager int8 step, where the calls cost.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Projections of one input, by the names transformers gives them (Qwen2, Llama, Mistral)."""


class FusedLinears(nn.Module):
    """Several `Int8Linear` of one input as one (see the module's docstring)."""

    def __init__(self, parts: list[Any]):
        super().__init__()
        weights = [part.int8_weight() for part in parts]
        scales = [part.weight_scale.reshape(-1) for part in parts]
        bias = None
        if parts[0].bias is not None:
            bias = torch.cat([part.bias for part in parts])
        linear_type = type(parts[0])
        self.fused = linear_type(torch.cat(weights), torch.cat(scales), bias, parts[0].backend)
        self.sizes = [part.out_features for part in parts]
        self._input: torch.Tensor | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()
        self._untaken: set[int] = set()

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Part `index` of the fused projection of `x`."""
        if torch.compiler.is_compiling():
            return self.fused(x).split(self.sizes, dim=-1)[index]
        if self._input is not x or index not in self._untaken:
            self._outputs = self.fused(x).split(self.sizes, dim=-1)
            self._input = x
            self._untaken = set(range(len(self.sizes)))
        self._untaken.discard(index)
        piece = self._outputs[index]
        if not self._untaken:  # every part has its share: hold no tensor between forwards
            self._input, self._outputs = None, ()
        return piece


class FusedPart(nn.Module):
    """Where one projection was: its share of a `FusedLinears` (held by the parent module)."""

    def __init__(self, group: FusedLinears, index: int, in_features: int):
        super().__init__()
        self.__dict__["group"] = group  # not a submodule: the parent owns the group once
        self.index = index
        self.in_features = in_features
        self.out_features = group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x, self.index)

    def extra_repr(self) -> str:
        return f"part {self.index} of a fused projection, out_features={self.out_features}"


def fuse_projections(model: nn.Module, linear_type: type) -> int:
    """Fuse each group of GROUPS found as `linear_type` (`quantize.Int8Linear`, which calls this)
    children of one module with the same input size, backend and bias-ness, in place. Returns
    how many groups were fused."""
    fused = 0
    for parent in list(model.modules()):
        for names in GROUPS:
            parts = [getattr(parent, name, None) for name in names]
            if not all(isinstance(part, linear_type) for part in parts):
                continue
            first = parts[0]
            if any(
                part.in_features != first.in_features
                or part.backend != first.backend
                or (part.bias is None) != (first.bias is None)
                for part in parts
            ):
                continue
            group = FusedLinears(parts)
            parent.add_module("fused_" + "_".join(n.split("_")[0] for n in names), group)
            for index, name in enumerate(names):
                setattr(parent, name, FusedPart(group, index, first.in_features))
            fused += 1
    return fused

"""Casting a loaded model to its compute dtype while keeping one copy of each weight.

Checkpoints come in bfloat16 (the converted GGUFs) and run in float32 (or int8 with float32
around it) on a CPU. Loading them as stored and casting afterwards, one tensor at a time, keeps
the peak memory near the final size; the input embedding stays as stored (`StoredEmbedding`):
a lookup does no arithmetic, so its upcast rows equal a float32 table's exactly, at half the
memory (the 151,936-row Qwen table is 0.9 GB in float32 for the 1.5B).
"""

from __future__ import annotations

import torch
from torch import nn


class StoredEmbedding(nn.Module):
    """An input embedding kept in its checkpoint's half precision, returning `compute_dtype`."""

    def __init__(self, weight: torch.Tensor, compute_dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.num_embeddings, self.embedding_dim = weight.shape
        self.compute_dtype = compute_dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.weight).to(self.compute_dtype)


def keep_stored_embedding(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Wrap a half-precision input embedding in `StoredEmbedding` (unless the head shares it:
    then it must be cast with the head)."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(embedding, StoredEmbedding) or embedding.weight.dtype not in (
        torch.bfloat16,
        torch.float16,
    ):
        return
    if head is not None and head.weight is embedding.weight:
        return
    model.set_input_embeddings(StoredEmbedding(embedding.weight, compute_dtype))


def cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast every floating-point parameter and buffer to `dtype`, one tensor at a time, except
    a StoredEmbedding's table; the model's config says the new dtype."""
    for module in model.modules():
        if isinstance(module, StoredEmbedding):
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                module._buffers[name] = buffer.to(dtype)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "dtype", None) is not None:
        config.dtype = dtype

"""Casting a loaded model to its compute dtype while keeping one copy of each weight.

Checkpoints come in bfloat16 (the converted GGUFs) and run in float32 (or int8 with float32
around it) on a CPU. Loading them as stored and casting afterwards, one tensor at a time, keeps
the peak memory near the final size; the input embedding stays as stored (`StoredEmbedding`):
a lookup does no arithmetic, so its upcast rows equal a float32 table's exactly, at half the
memory (the 151,936-row Qwen table is 0.9 GB in float32 for the 1.5B). The draft keeps its
output head as stored too (`keep_stored_head`; 0.27 GB less for the 0.5B): the draft only
proposes, the target checks every token, and the head still computes in float32 from the
stored values (`StoredHead`).
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


class StoredHead(nn.Module):
    """An output head whose table stays in half precision (its own, or the one it shares with
    the input embedding), computing its logits in `compute_dtype`: a block of `ROWS` rows at a
    time is upcast into one reused buffer and multiplied there, so the values are the stored
    ones and no full-precision copy exists. On 2 AVX2 cores (a 151,936 x 1,536 table) this took
    87 ms for one row against a float32 table's 90, and 141-175 ms for 4-16 rows against
    400-430 (it streams half the bytes)."""

    ROWS = 512

    def __init__(self, weight: nn.Parameter, compute_dtype: torch.dtype):
        super().__init__()
        self.weight = weight
        self.out_features, self.in_features = weight.shape
        self.compute_dtype = compute_dtype

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).to(self.compute_dtype)
        columns = flat.T.contiguous()
        logits_t = torch.empty(self.out_features, flat.shape[0], dtype=self.compute_dtype)
        block = torch.empty(
            min(self.ROWS, self.out_features), self.in_features, dtype=self.compute_dtype
        )
        for first in range(0, self.out_features, self.ROWS):
            rows = self.weight[first : first + self.ROWS]
            upcast = block[: rows.shape[0]]
            upcast.copy_(rows)
            torch.mm(upcast, columns, out=logits_t[first : first + rows.shape[0]])
        return logits_t.T.reshape(*hidden.shape[:-1], self.out_features)


def keep_stored_head(model: nn.Module, compute_dtype: torch.dtype) -> bool:
    """Wrap a half-precision output head in `StoredHead`; a table it shares with the input
    embedding stays one table, wrapped in `StoredEmbedding` too. False (nothing changed) where
    the head is not half precision."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (
        head is None
        or isinstance(head, StoredHead)
        or head.weight.dtype not in (torch.bfloat16, torch.float16)
    ):
        return False
    embedding = model.get_input_embeddings()
    if head.weight is embedding.weight:
        model.set_input_embeddings(StoredEmbedding(embedding.weight, compute_dtype))
        table = model.get_input_embeddings().weight
    else:
        table = nn.Parameter(head.weight.detach(), requires_grad=False)
    model.set_output_embeddings(StoredHead(table, compute_dtype))
    return True


def cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast every floating-point parameter and buffer to `dtype`, one tensor at a time, except
    a StoredEmbedding's (or StoredHead's) table; the model's config says the new dtype."""
    for module in model.modules():
        if isinstance(module, (StoredEmbedding, StoredHead)):
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

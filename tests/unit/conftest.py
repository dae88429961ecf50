"""Fixtures several unit test modules share."""

from __future__ import annotations

import pytest
import torch

from quickdraft.models.quantize import quantize_model
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="session")
def int8_target():
    """A tiny Qwen2-shaped model (3 layers) in quickdraft's int8 with row-wise attention: the
    runner's exact paths (trees, part-way stops) run on it."""
    shape = dict(dtype=torch.float32, hidden=256, heads=8, kv_heads=2)
    vocab = len(build_tiny_tokenizer())
    return quantize_model(build_tiny_model(vocab, seed=0, layers=3, **shape))

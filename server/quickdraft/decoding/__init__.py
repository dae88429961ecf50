"""The speculative decoding engine. Never imports pygls, never sees text: token ids in, token ids out."""

from quickdraft.decoding.costmodel import AcceptanceTracker, CostModel, expected_tokens
from quickdraft.decoding.engine import (
    Engine,
    GenerationRequest,
    GenerationResult,
    GenerationStats,
)
from quickdraft.decoding.ngram import NgramIndex, NgramMatch
from quickdraft.decoding.runner import ModelRunner

__all__ = [
    "AcceptanceTracker",
    "CostModel",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStats",
    "ModelRunner",
    "NgramIndex",
    "NgramMatch",
    "expected_tokens",
]

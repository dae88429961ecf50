"""The draft model stops within one forward at a cancel or a deadline: its catch-up prefill
checks between chunks as the target's does, its proposal loop between forwards."""

from __future__ import annotations

import threading
import time

import pytest

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

CODE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer):
    vocab = len(tokenizer)
    return Engine(
        build_tiny_model(vocab, seed=0, layers=2),
        build_tiny_model(vocab, seed=1, layers=1),
        stop_token_ids=[],
    )


def stop_after(engine: Engine, forwards: int, stop) -> list[int]:
    """Count the draft model's forwards (prefill chunks and proposals alike), calling `stop()`
    inside the `forwards`-th; returns the list of counts it appends to (one per forward)."""
    runner = engine.drafter.runner
    original = runner.forward
    calls: list[int] = []

    def counting(tokens, **kwargs):
        calls.append(len(tokens))
        if len(calls) == forwards:
            stop()
        return original(tokens, **kwargs)

    runner.forward = counting
    return calls


def request(tokenizer, **kwargs) -> GenerationRequest:
    prompt = tokenizer.encode(CODE)
    assert len(prompt) < 128  # a cold draft cache catches up in one chunk of 128
    return GenerationRequest(prompt, max_new_tokens=50, strategy="draft", draft_length=12, **kwargs)


@pytest.fixture
def fresh(engine):
    engine.reset_cache()
    runner = engine.drafter.runner
    chunk = runner.prefill_chunk
    yield engine
    vars(runner).pop("forward", None)
    runner.prefill_chunk = chunk


def test_a_cancel_stops_the_proposal_loop_within_one_forward(fresh, tokenizer):
    cancel = threading.Event()
    # The draft's cold cache catches up in one chunk, then proposes: cancelled in its 2nd
    # proposal forward (of up to 12).
    calls = stop_after(fresh, 3, cancel.set)
    result = fresh.generate(request(tokenizer, cancel=cancel))
    assert result.stop_reason == "cancelled"
    assert len(calls) - 3 <= 1
    assert result.stats.target_forwards == 0  # nor does the target verify what was drafted


def test_a_cancel_stops_the_draft_catch_up_between_chunks(fresh, tokenizer):
    fresh.drafter.runner.prefill_chunk = 8  # the catch-up of ~70 tokens: 9 chunks
    cancel = threading.Event()
    calls = stop_after(fresh, 2, cancel.set)
    result = fresh.generate(request(tokenizer, cancel=cancel))
    assert result.stop_reason == "cancelled"
    assert calls[:2] == [8, 8] and len(calls) - 2 <= 1
    # the second chunk finishes (its work is reused), no third starts: a valid prefix
    assert len(fresh.drafter.runner.tokens) == 16


def test_a_deadline_stops_the_proposal_loop_within_one_forward(fresh, tokenizer):
    deadline = time.monotonic() + 0.5

    def run_past_the_deadline():
        # pacing: a forward that outlasts the deadline, the condition this test measures
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)

    calls = stop_after(fresh, 3, run_past_the_deadline)
    result = fresh.generate(request(tokenizer, deadline=deadline))
    assert result.stop_reason == "deadline"
    assert len(calls) - 3 <= 1

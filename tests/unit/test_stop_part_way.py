"""A cancel stops a torch forward at the next decoder layer (`Runner.stopping_at`): the cache is
left as it was before the forward, bitwise, so what runs next computes what it would have
computed had the stopped forward never started; and the engine reports "cancelled"."""

from __future__ import annotations

import threading

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.runner import ForwardCancelled, ModelRunner, StaticModelRunner
from quickdraft.testing import build_tiny_int8_model, build_tiny_tokenizer

PROMPT = list(range(10, 150))


@pytest.fixture(scope="module")
def int8_target():
    return build_tiny_int8_model(len(build_tiny_tokenizer()))


class LayerCounter:
    """Counts the decoder layers a model runs (a forward hook on each) and sets `cancel` when
    the `at`-th has run: a newer request arriving in the middle of a forward."""

    def __init__(self, model: torch.nn.Module, cancel: threading.Event, at: int | None = None):
        self.ran = 0
        self.cancel, self.at = cancel, at
        self.handles = [layer.register_forward_hook(self._ran) for layer in model.model.layers]

    def _ran(self, *_args) -> None:
        self.ran += 1
        if self.at is not None and self.ran == self.at:
            self.cancel.set()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def layer_lengths(runner: ModelRunner) -> list[int]:
    return [layer.keys.shape[-2] for layer in runner.cache.layers]


def test_a_cancel_stops_a_forward_at_the_next_layer_and_leaves_the_cache_as_before(int8_target):
    runner = ModelRunner(int8_target)
    runner.extend(PROMPT)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in runner.cache.layers]
    cancel = threading.Event()
    counter = LayerCounter(int8_target, cancel, at=1)  # set while layer 0 runs
    try:
        with runner.stopping_at(cancel), pytest.raises(ForwardCancelled):
            runner.forward([5, 6, 7])
    finally:
        counter.remove()
    assert counter.ran == 1  # layers 1 and 2 never ran
    assert runner.tokens == PROMPT
    assert layer_lengths(runner) == [len(PROMPT)] * 3
    for layer, (keys, values) in zip(runner.cache.layers, before, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    # What runs next is what a runner that never saw the stopped forward computes.
    fresh = ModelRunner(int8_target)
    fresh.extend(PROMPT)
    assert torch.equal(runner.forward([5, 6, 7]), fresh.forward([5, 6, 7]))
    # Outside `stopping_at` a set event stops nothing: forwards run whole.
    runner.keep(len(PROMPT))
    assert runner.forward([8]).shape[0] == 1


def test_a_stopped_tree_forward_leaves_the_cache_as_before(int8_target):
    runner = ModelRunner(int8_target)
    runner.extend(PROMPT)
    runner.forward([5])
    cancel = threading.Event()
    counter = LayerCounter(int8_target, cancel, at=2)
    try:
        with runner.stopping_at(cancel), pytest.raises(ForwardCancelled):
            runner.forward_tree([6, 7, 8, 9], [-1, 0, 0, 1])
    finally:
        counter.remove()
    assert counter.ran == 2
    assert runner.tokens == [*PROMPT, 5]
    assert layer_lengths(runner) == [len(PROMPT) + 1] * 3
    chain = ModelRunner(int8_target)
    chain.extend(PROMPT)
    chain.forward([5])
    assert torch.equal(runner.forward_tree([6, 7], [-1, 0]), chain.forward_tree([6, 7], [-1, 0]))


def test_a_prefill_chunk_runs_whole_and_the_next_does_not_start(int8_target):
    # A chunk's work is the prefix the next request reuses: stopping it part way would lose it.
    runner = ModelRunner(int8_target, prefill_chunk=64)
    cancel = threading.Event()
    counter = LayerCounter(int8_target, cancel, at=3 + 1)  # inside the second chunk
    try:
        with runner.stopping_at(cancel):
            reused, computed, logits = runner.extend(PROMPT, cancel=cancel)
    finally:
        counter.remove()
    assert counter.ran == 6  # two chunks of 3 layers, no third
    assert (reused, computed) == (0, 128) and logits is not None
    assert runner.tokens == PROMPT[:128] and layer_lengths(runner) == [128] * 3
    # Extending again computes only the rest, and gives a cold prefill's logits.
    reused, computed, logits = runner.extend(PROMPT)
    assert (reused, computed) == (128, len(PROMPT) - 128)
    cold = ModelRunner(int8_target, prefill_chunk=64)
    _, _, cold_logits = cold.extend(PROMPT)
    assert torch.equal(logits, cold_logits)


def test_the_engine_stops_a_verify_forward_part_way_and_says_cancelled(int8_target):
    request = dict(prompt_ids=PROMPT, max_new_tokens=12, strategy="ar")
    plain = Engine(int8_target, stop_token_ids=[]).generate(GenerationRequest(**request)).tokens
    engine = Engine(int8_target, stop_token_ids=[])
    cancel = threading.Event()
    # The prefill's 2 chunks (3 layers each), 2 steps, then a stop inside the third.
    counter = LayerCounter(int8_target, cancel, at=3 * 2 + 3 * 2 + 2)
    try:
        stopped = engine.generate(GenerationRequest(**request, cancel=cancel))
    finally:
        counter.remove()
    assert counter.ran == 3 * 2 + 3 * 2 + 2
    assert stopped.stop_reason == "cancelled"
    assert stopped.tokens == plain[:2]
    assert stopped.stats.target_forwards == 2
    # The next request for the same place reuses the prefill and answers as plain decoding.
    again = engine.generate(GenerationRequest(**request))
    assert again.tokens == plain and again.stats.prefill_tokens == 0


def test_a_compiled_runner_runs_its_forwards_whole(int8_target):
    runner = StaticModelRunner(int8_target, capacity=256)
    runner.extend(PROMPT)
    cancel = threading.Event()
    cancel.set()
    with runner.stopping_at(cancel):
        logits = runner.forward([5, 6])
    assert logits.shape[0] == 2 and runner.tokens == [*PROMPT, 5, 6]


def test_a_draft_model_that_is_the_target_module_stops_with_it(int8_target):
    # The hooks sit on the target's layers: a draft runner over the same module meets them too.
    engine = Engine(int8_target, int8_target, stop_token_ids=[])
    cancel = threading.Event()
    request = dict(prompt_ids=PROMPT, max_new_tokens=12, strategy="draft", draft_length=3)
    counter = LayerCounter(int8_target, cancel, at=3 * 2 + 3 * 2 + 1)  # the draft's catch-up
    try:
        stopped = engine.generate(GenerationRequest(**request, cancel=cancel))
    finally:
        counter.remove()
    assert stopped.stop_reason == "cancelled" and stopped.tokens == []
    plain = Engine(int8_target, stop_token_ids=[]).generate(
        GenerationRequest(PROMPT, max_new_tokens=12, strategy="ar")
    )
    assert engine.generate(GenerationRequest(**request)).tokens == plain.tokens

"""A short uncached prompt tail computed by the first decode forward (engine.PROMPT_FOLD): the
rows are bitwise what a prefill gives, the cache holds them as prefilled, and a keystroke's
request runs no prefill forward of its own."""

from __future__ import annotations

import pytest
import torch

from quickdraft.config import DecodingConfig
from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.engine import PROMPT_FOLD
from quickdraft.decoding.runner import PREFILL_KWARG, ModelRunner, StaticModelRunner
from quickdraft.models import attention_rows
from quickdraft.models.quantize import rowwise_attention, use_prefill_attention
from quickdraft.testing import build_tiny_int8_model, build_tiny_model, build_tiny_tokenizer

CODE = (
    "class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n"
    "        self.height = height\n\n    def area(self):\n        return self.width * self.height\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module", params=[None, torch.bfloat16], ids=["float32", "bfloat16"])
def int8_target(tokenizer, request):
    """The tiny int8 model with its prefill rows attending in float32, and in bfloat16 (the
    default where the CPU has AMX's bfloat16 tiles): folded rows must be a prefill's either
    way."""
    model = build_tiny_int8_model(len(tokenizer))
    use_prefill_attention(model, request.param)
    return model


@pytest.mark.parametrize("prompt_rows", [1, 5, 40])
def test_a_steps_prompt_rows_attend_as_a_prefill_does_and_its_other_rows_as_steps(prompt_rows):
    """At the attention itself, where a prefill row and a step row differ in their last bits
    (the int8 model's logits hide that: its linears round the activations to int8 again)."""
    generator = torch.Generator().manual_seed(prompt_rows)
    cached, steps, dim = 300, 4, 32
    rows = prompt_rows + steps
    query = torch.randn(1, 8, rows, dim, generator=generator)
    key, value = (torch.randn(1, 2, cached + rows, dim, generator=generator) for _ in range(2))
    module = torch.nn.Module()

    def attend(q, length, kind):
        return rowwise_attention(
            module, q, key[:, :, :length], value[:, :, :length], None, **{PREFILL_KWARG: kind}
        )[0]

    both = attend(query, cached + rows, prompt_rows)
    prefill = attend(query[:, :, :prompt_rows], cached + prompt_rows, True)
    step = attend(query[:, :, prompt_rows:], cached + rows, False)
    assert torch.equal(both[:, :prompt_rows], prefill)
    assert torch.equal(both[:, prompt_rows:], step)
    if attention_rows.load()[0] is not None:
        # Steps attend in the C kernel here: the two ways differ, and the first assertion
        # tells them apart.
        as_steps = attend(query, cached + rows, False)[:, :prompt_rows]
        assert not torch.equal(as_steps, prefill)


@pytest.mark.parametrize("tail", [1, 3, 16, 40])
def test_prompt_rows_in_a_step_are_bitwise_a_prefill_then_the_step(int8_target, tail):
    prompt = list(range(10, 200))
    pending, steps = prompt[-1], [5, 6, 7]
    prefilled = ModelRunner(int8_target)
    prefilled.extend(prompt[:-1])
    expected = prefilled.forward([pending, *steps])
    folded = ModelRunner(int8_target)
    folded.extend(prompt[: -1 - tail])
    logits = folded.forward([pending, *steps], prompt=prompt[-1 - tail : -1])
    assert logits.shape == expected.shape and torch.equal(logits, expected)
    assert folded.tokens == prefilled.tokens and folded.prefilled == len(prompt) - 1
    # The next request reuses the folded rows as prefill rows: the same as a cold prefill.
    cold = ModelRunner(int8_target)
    for runner in (folded, cold):
        runner.extend([*prompt, 9, 9])
    assert folded.prefilled == cold.prefilled
    assert torch.equal(folded.forward([3]), cold.forward([3]))


def test_prompt_rows_before_a_tree_are_bitwise_a_prefill_then_the_tree(int8_target):
    prompt = list(range(30, 170))
    tokens, parents = [prompt[-1], 6, 8, 11, 7], [-1, 0, 0, 1, 2]
    prefilled, folded = ModelRunner(int8_target), ModelRunner(int8_target)
    prefilled.extend(prompt[:-1])
    folded.extend(prompt[:-3])
    expected = prefilled.forward_tree(tokens, parents)
    logits = folded.forward_tree(tokens, parents, prompt=prompt[-3:-1])
    assert torch.equal(logits, expected) and folded.prefilled == len(prompt) - 1
    for runner in (prefilled, folded):
        runner.keep_tree_path([2, 4])
    assert folded.tokens == prefilled.tokens == [*prompt, 8, 7]
    assert torch.equal(folded.forward([4]), prefilled.forward([4]))


def test_extend_leaves_a_short_tail_and_computes_a_long_one(int8_target):
    runner = ModelRunner(int8_target)
    prompt = list(range(10, 120))
    runner.extend(prompt)
    assert runner.extend([*prompt, 1, 2, 3], leave=3) == (len(prompt), 0, None)
    assert runner.tokens == prompt
    reused, computed, logits = runner.extend([*prompt, 1, 2, 3, 4], leave=3)
    assert (reused, computed) == (len(prompt), 4) and logits is not None


def counted_prefills(runner: ModelRunner) -> list[int]:
    """The sizes of `runner`'s prefill forwards from now on."""
    sizes: list[int] = []
    forward = runner.forward

    def counting(tokens, **kwargs):
        if kwargs.get("prefill"):
            sizes.append(len(tokens))
        return forward(tokens, **kwargs)

    runner.forward = counting
    return sizes


def test_a_keystroke_runs_no_prefill_forward_and_decodes_as_a_cold_request(tokenizer, int8_target):
    ids = tokenizer.encode(CODE * 3)
    typed = ids[:150]
    engine = Engine(int8_target, None, stop_token_ids=[], config=DecodingConfig(tree=16))
    prefills = counted_prefills(engine.target)
    engine.generate(GenerationRequest(ids[:140], 20, strategy="ngram"))
    prefills.clear()
    for strategy in ("ar", "ngram"):
        engine.target.keep(139)  # the cache holds the first request's prompt, as prefilled
        warm = engine.generate(GenerationRequest(typed, 20, strategy=strategy))
        assert prefills == [], strategy
        assert warm.stats.prefill_tokens == 10, strategy
        cold = Engine(int8_target, None, stop_token_ids=[], config=DecodingConfig(tree=16))
        expected = cold.generate(GenerationRequest(typed, 20, strategy="ar")).tokens
        assert warm.tokens == expected, strategy
    # A tail longer than PROMPT_FOLD is prefilled, in a forward of its own.
    engine.target.keep(139)
    longer = ids[: 139 + PROMPT_FOLD + 2]
    result = engine.generate(GenerationRequest(longer, 20, strategy="ngram"))
    assert prefills == [PROMPT_FOLD + 1] and result.stats.prefill_tokens == PROMPT_FOLD + 1


def test_runners_that_prefill_every_prompt_token_refuse_prompt_rows(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=0)
    plain = ModelRunner(model)  # no row-wise attention: a step computes rows another way
    assert not plain.folds_prompt
    plain.extend([3, 4, 5])
    assert plain.extend([3, 4, 5, 6], leave=4)[1] == 1  # `leave` does not apply
    with pytest.raises(RuntimeError, match="no prompt rows"):
        plain.forward([7], prompt=[6])
    static = StaticModelRunner(model, capacity=64, compile_steps=False)
    assert not static.folds_prompt
    with pytest.raises(RuntimeError, match="no prompt rows"):
        static.forward([7], prompt=[6])

"""Alternatives fork the greedy answer's cache: no prompt token again, the greedy answer intact."""

from __future__ import annotations

import math

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.confidence import branch_points, confidence, token_choices
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer):
    vocab = len(tokenizer)
    target = build_tiny_model(vocab, arch="qwen2", seed=0, layers=2)
    draft = build_tiny_model(vocab, arch="qwen2", seed=1, layers=1)
    return Engine(target, draft, stop_token_ids=[])


def request(tokenizer, strategy="hybrid", **kw):
    return GenerationRequest(
        tokenizer.encode(PROMPT), max_new_tokens=16, strategy=strategy, slot="doc", **kw
    )


def test_choices_are_the_targets_own_distribution_at_each_token(engine, tokenizer):
    engine.reset_cache()
    answer = engine.generate(request(tokenizer, "ar"))
    assert len(answer.choices) == len(answer.tokens) == 16
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        logits = engine.target.model(torch.tensor([ids + answer.tokens])).logits[0]
    rows = logits[len(ids) - 1 : len(ids) - 1 + len(answer.tokens)]
    expected = token_choices(rows, answer.tokens)
    for got, want in zip(answer.choices, expected, strict=True):
        assert got.runner_up == want.runner_up
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert got.runner_up_logprob <= got.logprob  # greedy: the emitted token is the top one
    assert 0 < confidence(answer.choices) <= 1
    # Speculation changes none of it: the same tokens, the same scores.
    engine.reset_cache()
    hybrid = engine.generate(request(tokenizer, "hybrid"))
    assert hybrid.tokens == answer.tokens
    for got, want in zip(hybrid.choices, answer.choices, strict=True):
        assert got.runner_up == want.runner_up
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_alternatives_branch_where_least_sure_and_compute_no_prompt_token(engine, tokenizer):
    engine.reset_cache()
    asked = request(tokenizer)
    answer = engine.generate(asked)
    points = branch_points(answer.choices, 2)
    alternatives = engine.alternatives(asked, answer, 2)
    assert len(alternatives) == 2
    # The last branch point first, so the earlier one's prefix is still cached.
    assert [len(_head(a.tokens, answer.tokens)) for a in alternatives] == sorted(
        points, reverse=True
    )
    ids = tokenizer.encode(PROMPT)
    for alternative in alternatives:
        i = len(_head(alternative.tokens, answer.tokens))
        assert alternative.tokens[i] == answer.choices[i].runner_up
        assert alternative.stats.prefill_tokens == 0
        assert alternative.stats.target_forwards <= len(alternative.tokens) - i
        assert len(alternative.tokens) == len(alternative.choices) == 16
        # Its tail is what greedy decoding from its head gives, computed cold.
        engine.select_slot("check")
        cold = engine.generate(
            GenerationRequest(
                ids + alternative.tokens[: i + 1],
                max_new_tokens=16 - i - 1,
                strategy="ar",
                slot="check",
            )
        )
        assert alternative.tokens[i + 1 :] == cold.tokens
        assert confidence(alternative.choices) < confidence(answer.choices)
    # The greedy answer is unchanged after the forks.
    assert engine.generate(asked).tokens == answer.tokens


def test_an_alternative_stops_by_the_same_rule_reading_its_whole_text(engine, tokenizer):
    engine.reset_cache()
    seen = []

    def stop(tokens):
        seen.append(list(tokens))
        return len(tokens) >= 6

    asked = request(tokenizer, stop=stop)
    answer = engine.generate(asked)
    assert len(answer.tokens) == 6
    for alternative in engine.alternatives(asked, answer, 3):
        assert len(alternative.tokens) == 6
        assert alternative.stop_reason == "stop"


def test_forks_are_written_whole_under_a_confidence_floor(engine, tokenizer):
    # A fork is less likely than the answer at its branch point already: the floor that
    # stops an answer unsure (`abstain_below`) is the caller's to apply to forks, after.
    engine.reset_cache()
    answer = engine.generate(request(tokenizer))
    asked = request(tokenizer, abstain_below=confidence(answer.choices) / 2)
    engine.reset_cache()
    assert engine.generate(asked).tokens == answer.tokens  # over the floor: written whole
    forks = engine.alternatives(asked, answer, 2)
    assert forks and all(len(fork.tokens) == 16 for fork in forks)
    assert any(confidence(fork.choices) < asked.abstain_below for fork in forks)


def test_no_alternatives_for_sampling_or_a_forbidden_runner_up(engine, tokenizer):
    engine.reset_cache()
    asked = request(tokenizer, temperature=0.8, seed=1)
    answer = engine.generate(asked)
    assert engine.alternatives(asked, answer, 2) == []
    choices = answer.choices
    assert branch_points([type(c)(c.logprob, c.runner_up, -math.inf) for c in choices], 3) == []


def _head(tokens, greedy):
    n = 0
    while n < min(len(tokens), len(greedy)) and tokens[n] == greedy[n]:
        n += 1
    return tokens[:n]

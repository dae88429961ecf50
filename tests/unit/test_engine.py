"""The engine's promise: speculative greedy output is plain greedy output, token for token."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time

import pytest
import torch

from quickdraft.config import DecodingConfig
from quickdraft.decoding import CostModel, Engine, GenerationRequest
from quickdraft.decoding.confidence import confidence
from quickdraft.decoding.costmodel import (
    MEASURED_SIZES,
    PREFILL_CHUNKS,
    fill_sizes,
    interpolate,
    prefill_chunk_for,
)
from quickdraft.decoding.healing import TokenBytes
from quickdraft.errors import ConfigError, InputError
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

STRATEGIES = ("ngram", "draft", "hybrid")

CODE = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    pri",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "fn main() {\n    let v = vec![1, 2, 3];\n    for x in v.iter() {\n",
    "x",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module", params=["qwen2", "llama", "starcoder2"])
def pair(request, tokenizer):
    vocab = len(tokenizer)
    target = build_tiny_model(vocab, arch=request.param, seed=0, layers=2)
    draft = build_tiny_model(vocab, arch=request.param, seed=1, layers=1)
    return target, draft


def greedy(engine: Engine, prompt, strategy, k=None, max_new_tokens=24, **kw):
    result = engine.generate(
        GenerationRequest(
            prompt, max_new_tokens=max_new_tokens, strategy=strategy, draft_length=k, **kw
        )
    )
    return result


def test_every_strategy_and_draft_length_is_identical_to_plain_greedy(pair, tokenizer):
    target, draft = pair
    engine = Engine(target, draft, stop_token_ids=[])
    for text in CODE:
        prompt = tokenizer.encode(text)
        engine.reset_cache()
        expected = greedy(engine, prompt, "ar").tokens
        assert len(expected) == 24
        for strategy in STRATEGIES:
            for k in (None, *range(1, 9)):
                engine.reset_cache()
                result = greedy(engine, prompt, strategy, k)
                assert result.tokens == expected, (text, strategy, k)
                assert result.stats.new_tokens == len(expected)


def test_identity_holds_across_random_prompts_and_seeds(tokenizer):
    vocab = len(tokenizer)
    for seed in range(3):
        target = build_tiny_model(vocab, seed=10 + seed, layers=2)
        draft = build_tiny_model(vocab, seed=20 + seed, layers=1)
        engine = Engine(target, draft, stop_token_ids=[tokenizer.eos_token_id])
        rng = random.Random(seed)
        for _ in range(4):
            # Random prompts with repeated stretches, so n-gram drafts occur.
            chunk = [rng.randrange(vocab) for _ in range(rng.randint(3, 12))]
            prompt = chunk * rng.randint(1, 3) + [
                rng.randrange(vocab) for _ in range(rng.randint(1, 9))
            ]
            engine.reset_cache()
            expected = greedy(engine, prompt, "ar", max_new_tokens=16).tokens
            for strategy in STRATEGIES:
                k = rng.choice([None, 1, 2, 5, 8])
                assert greedy(engine, prompt, strategy, k, max_new_tokens=16).tokens == expected


def test_prefix_reuse_keeps_identity_for_growing_and_shrinking_prompts(pair, tokenizer):
    target, draft = pair
    plain = Engine(target, draft, stop_token_ids=[tokenizer.eos_token_id])
    reusing = Engine(target, draft, stop_token_ids=[tokenizer.eos_token_id])
    base = tokenizer.encode(CODE[0])
    # Typing, deleting, jumping back to an earlier prompt, and a completely different prompt.
    prompts = [
        base,
        base + tokenizer.encode("  "),
        base + tokenizer.encode("  re"),
        base[:-5],
        base,
        tokenizer.encode(CODE[2]),
    ]
    for i, prompt in enumerate(prompts):
        plain.reset_cache()
        expected = greedy(plain, prompt, "ar", max_new_tokens=12).tokens
        result = greedy(reusing, prompt, ("hybrid", "ngram", "draft")[i % 3], max_new_tokens=12)
        assert result.tokens == expected
        assert result.stats.reused_tokens + result.stats.prefill_tokens == len(prompt) - 1
    # The second prompt extends the first: everything already computed is reused.
    reusing.reset_cache()
    greedy(reusing, prompts[0], "hybrid", max_new_tokens=4)
    second = greedy(reusing, prompts[1], "hybrid", max_new_tokens=4)
    assert second.stats.reused_tokens >= len(prompts[0]) - 1
    assert second.stats.prefill_tokens <= 2


def test_draft_equal_to_target_accepts_every_draft(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=3)
    engine = Engine(model, model, stop_token_ids=[tokenizer.eos_token_id])
    result = greedy(engine, tokenizer.encode(CODE[2]), "draft", 4, max_new_tokens=25)
    stats = result.stats
    assert stats.accepted_by_source["draft"] == stats.drafted_by_source["draft"] > 0
    assert stats.target_forwards == 5  # 25 tokens, 5 per forward (4 drafts + 1 bonus)


def test_copying_from_an_ngram_source_needs_few_target_forwards(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=4)
    engine = Engine(model, None, stop_token_ids=[tokenizer.eos_token_id])
    prompt = tokenizer.encode(CODE[1])
    expected = greedy(engine, prompt, "ar", max_new_tokens=30).tokens
    engine.reset_cache()
    # The continuation is known to an open document: prompt lookup copies it.
    engine.ngram.set_source("file:///other.py", prompt[-6:] + expected)
    result = greedy(engine, prompt, "ngram", 8, max_new_tokens=30)
    assert result.tokens == expected
    assert result.stats.tokens_per_forward > 3
    assert result.stats.accepted_by_source["ngram"] >= 20


def test_fim_prompts_look_up_the_text_before_the_cursor_from_the_first_step(tokenizer):
    """A FIM prompt ends with the suffix, so its tail matches nothing; given the text before
    the cursor, lookups match on it and the very first forward verifies a copied continuation."""
    model = build_tiny_model(len(tokenizer), seed=11)
    engine = Engine(model, None, stop_token_ids=[tokenizer.eos_token_id])
    before = tokenizer.encode("<|fim_prefix|>total = compute(alpha, beta)\nscale = ")
    prompt = before + tokenizer.encode("<|fim_suffix|>\nreturn scale<|fim_middle|>")
    expected = greedy(engine, prompt, "ar", max_new_tokens=27).tokens
    assert len(expected) == 27
    engine.ngram.set_source("file:///other.py", before[-6:] + expected)

    engine.reset_cache()
    with_cursor = greedy(engine, prompt, "ngram", 8, max_new_tokens=27, lookup_context=before)
    assert with_cursor.tokens == expected
    assert with_cursor.stats.target_forwards == 3  # 9 tokens a forward: 8 copied + 1 bonus

    engine.reset_cache()
    without = greedy(engine, prompt, "ngram", 8, max_new_tokens=27)
    assert without.tokens == expected
    assert without.stats.target_forwards > 3  # the first tokens had nothing to match on


def test_an_anchored_draft_is_proposed_from_the_first_step_while_the_output_agrees(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=11)
    engine = Engine(model, None, stop_token_ids=[tokenizer.eos_token_id])
    prompt = tokenizer.encode("<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>")
    expected = greedy(engine, prompt, "ar", max_new_tokens=20).tokens
    assert len(expected) == 20
    for anchored, forwards in (
        (expected[:18], 3),
        (expected[:4] + [7, 7, 7], None),
        ([9, 9], None),
    ):
        engine.reset_cache()
        result = greedy(engine, prompt, "ngram", 8, max_new_tokens=20, anchored_draft=anchored)
        assert result.tokens == expected  # whatever the anchored draft says
        if forwards is not None:
            assert result.stats.target_forwards == forwards  # 9 + 9 tokens, then 2 more
    engine.reset_cache()
    ignored = greedy(engine, prompt, "ar", max_new_tokens=20, anchored_draft=expected)
    assert ignored.stats.target_forwards == 20  # plain decoding drafts nothing


def test_stop_token_callback_and_max_tokens_end_generation_where_plain_decoding_would(
    pair, tokenizer
):
    target, draft = pair
    engine = Engine(target, draft, stop_token_ids=[])
    prompt = tokenizer.encode(CODE[0])
    full = greedy(engine, prompt, "ar", max_new_tokens=20).tokens
    # Pretend the 7th generated token is a stop token.
    stop_token = full[6]
    cut = full.index(stop_token)
    engine.stop_token_ids = frozenset({stop_token})
    for strategy in ("ar", *STRATEGIES):
        result = greedy(engine, prompt, strategy, 8, max_new_tokens=20)
        assert result.tokens == full[:cut] and result.stop_reason == "eos"
    engine.stop_token_ids = frozenset()
    for strategy in ("ar", *STRATEGIES):
        result = greedy(
            engine, prompt, strategy, 8, max_new_tokens=20, stop=lambda new: len(new) >= 9
        )
        assert result.tokens == full[:9] and result.stop_reason == "stop"
        result = greedy(engine, prompt, strategy, 8, max_new_tokens=5)
        assert result.tokens == full[:5] and result.stop_reason == "max_tokens"


def test_an_answer_stops_once_its_tokens_fall_under_the_floor_and_forks_ignore_it(pair, tokenizer):
    # The product of the tokens' probabilities only falls: once under `abstain_below`, the
    # answer would be held back whatever followed, so the engine stops ("unsure") there.
    target, draft = pair
    engine = Engine(target, draft, stop_token_ids=[])
    prompt = tokenizer.encode(CODE[0])
    full = greedy(engine, prompt, "ar", max_new_tokens=20)
    running = list(itertools.accumulate(choice.logprob for choice in full.choices))
    cut = 6  # a floor between the likelihood of the first 5 tokens and that of the first 6
    floor = math.exp((running[cut - 2] + running[cut - 1]) / 2)
    for strategy in ("ar", *STRATEGIES):
        result = greedy(engine, prompt, strategy, 8, max_new_tokens=20, abstain_below=floor)
        assert result.tokens == full.tokens[:cut] and result.stop_reason == "unsure", strategy
        assert confidence(result.choices) < floor <= confidence(result.choices[: cut - 1])
    stopped = greedy(engine, prompt, "ar", max_new_tokens=20, abstain_below=floor)
    assert stopped.stats.target_forwards < full.stats.target_forwards
    # A natural end comes first: the stop rule's last token is not cut off as unsure.
    ended = greedy(
        engine,
        prompt,
        "ar",
        max_new_tokens=20,
        abstain_below=floor,
        stop=lambda new: len(new) >= cut,
    )
    assert ended.tokens == full.tokens[:cut] and ended.stop_reason == "stop"
    # 0 (the person asked) never stops early.
    assert greedy(engine, prompt, "ar", max_new_tokens=20, abstain_below=0.0).tokens == full.tokens
    # Whitespace is scored with the text after it (a suggestion's trailing whitespace is not
    # scored): a blank token that crosses the floor stops nothing until more text follows.
    blank = full.tokens[cut - 1]
    spellings = [b"x"] * len(tokenizer)
    spellings[blank] = b"\n    "
    engine.token_bytes = TokenBytes(spellings, len(tokenizer))
    after = next(i for i in range(cut, len(full.tokens)) if full.tokens[i] != blank)
    result = greedy(engine, prompt, "ar", max_new_tokens=20, abstain_below=floor)
    assert result.tokens == full.tokens[: after + 1] and result.stop_reason == "unsure"


def test_cancellation_stops_within_one_step(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=5)
    engine = Engine(model, model, stop_token_ids=[])
    cancel = threading.Event()
    steps = []

    def stop_after_three(new):
        steps.append(len(new))
        if len(steps) == 3:
            cancel.set()
        return False

    result = engine.generate(
        GenerationRequest(
            tokenizer.encode(CODE[0]),
            max_new_tokens=200,
            strategy="ar",
            cancel=cancel,
            stop=stop_after_three,
        )
    )
    assert result.stop_reason == "cancelled"
    assert len(result.tokens) == 3
    # Cancelled before it starts: nothing is generated, the prefill is skipped.
    result = engine.generate(
        GenerationRequest(tokenizer.encode(CODE[2]), max_new_tokens=50, cancel=cancel)
    )
    assert result.stop_reason == "cancelled" and result.tokens == []


def test_deadline_stops_within_one_step(tokenizer, monkeypatch):
    """On a fake clock where each target forward takes one second, a deadline 5.5 s away
    lets exactly the forwards that start before it run: 6 steps, 6 tokens, none after."""
    model = build_tiny_model(len(tokenizer), seed=5)
    engine = Engine(model, None, stop_token_ids=[])
    prompt = tokenizer.encode(CODE[0])
    engine.generate(GenerationRequest(prompt, max_new_tokens=1, strategy="ar"))  # prefilled
    clock = [1000.0]
    started_at: list[float] = []
    forward = engine.target.forward

    def one_second(tokens, **kwargs):
        started_at.append(clock[0])
        clock[0] += 1.0
        return forward(tokens, **kwargs)

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(engine.target, "forward", one_second)
    result = engine.generate(
        GenerationRequest(prompt, max_new_tokens=500, strategy="ar", deadline=1005.5)
    )
    assert result.stop_reason == "deadline"
    assert started_at == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    assert len(result.tokens) == 6 and result.stats.target_forwards == 6
    assert result.stats.prefill_tokens == 0  # the prompt was cached: no prefill forward


def test_invalid_requests_are_refused_with_clear_errors(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=6)
    engine = Engine(model, None)
    with pytest.raises(InputError, match="empty"):
        engine.generate(GenerationRequest([], max_new_tokens=4))
    with pytest.raises(InputError, match="at least 1"):
        engine.generate(GenerationRequest([1, 2], max_new_tokens=0))
    with pytest.raises(ConfigError, match="needs a draft model"):
        engine.generate(GenerationRequest([1, 2], strategy="draft"))
    with pytest.raises(ConfigError, match="unknown strategy"):
        engine.generate(GenerationRequest([1, 2], strategy="beam"))


def test_draft_vocabulary_larger_than_target_is_sliced(tokenizer):
    vocab = len(tokenizer)
    target = build_tiny_model(vocab, seed=7)
    draft = build_tiny_model(vocab + 11, seed=8, layers=1)  # padded embedding rows, as in Qwen
    engine = Engine(target, draft)
    prompt = tokenizer.encode(CODE[3])
    expected = greedy(engine, prompt, "ar").tokens
    assert greedy(engine, prompt, "draft", 3).tokens == expected


def test_adaptive_policy_chooses_plain_steps_when_verification_is_expensive(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=9)
    # A CPU-like cost profile: verifying 2 tokens costs twice one, drafting is slow.
    cpu_like = CostModel(
        target_ms={1: 600, 2: 1200, 4: 1500, 8: 2000, 16: 3500}, draft_ms_per_token=260
    )
    engine = Engine(model, build_tiny_model(len(tokenizer), seed=10, layers=1), cost_model=cpu_like)
    prompt = tokenizer.encode(CODE[2])
    result = greedy(engine, prompt, "draft")
    assert result.stats.drafted_by_source["draft"] == 0
    assert result.stats.target_forwards == result.stats.new_tokens
    # With accelerator-like costs the same request drafts.
    engine.cost_model = CostModel.estimate(has_draft=True)
    engine.reset_cache()
    assert greedy(engine, prompt, "draft").stats.drafted_by_source["draft"] > 0


def test_calibration_measures_every_size(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=11)
    engine = Engine(model, build_tiny_model(len(tokenizer), seed=12, layers=1))
    sizes = []
    forward = engine.target.forward
    engine.target.forward = lambda tokens, **kw: sizes.append(len(tokens)) or forward(tokens, **kw)
    # A budget no machine runs out of: the sizes asked for are counted, not the time left.
    costs = engine.calibrate(context_tokens=32, repeats=1, budget_s=3600.0)
    del engine.target.forward
    assert costs.measured
    assert sorted(costs.target_ms) == list(MEASURED_SIZES)
    assert costs.notes["measured_sizes"] == ",".join(map(str, MEASURED_SIZES))
    assert set(sizes) >= set(MEASURED_SIZES)  # each size timed with that many new tokens
    assert all(ms > 0 for ms in costs.target_ms.values())
    assert costs.draft_ms_per_token > 0 and costs.prefill_tokens_per_s > 0
    assert CostModel.from_dict(costs.to_dict()) == costs
    # Calibration leaves no state behind: generation starts cold and is still exact.
    prompt = tokenizer.encode(CODE[0])
    assert greedy(engine, prompt, "hybrid").stats.reused_tokens == 0


def test_sizes_the_calibration_ran_out_of_time_for_are_filled_in():
    # Past the largest measured size, each further token costs a prefill token when that is
    # known; between measured sizes, the line through them; never dearer for fewer tokens.
    filled = fill_sizes({1: 10.0, 8: 40.0, 16: 60.0}, per_extra=5.0)
    assert filled == {1: 10.0, 2: 10.0 + 30 / 7, 4: 10.0 + 90 / 7, 8: 40.0, 16: 60.0, 32: 140.0}
    assert fill_sizes({1: 10.0, 8: 40.0, 16: 60.0})[32] == 100.0  # the line through 8 and 16
    # Noise only adds time: a smaller forward measured slower takes the larger one's figure.
    slow_eight = fill_sizes({1: 10.0, 8: 40.0, 16: 30.0}, 5.0)
    assert (slow_eight[8], slow_eight[16], slow_eight[1]) == (30.0, 30.0, 10.0)
    outlier = fill_sizes({1: 202.0, 2: 93.0, 4: 96.0, 8: 102.0, 16: 118.0, 32: 156.0})
    assert outlier == {1: 93.0, 2: 93.0, 4: 96.0, 8: 102.0, 16: 118.0, 32: 156.0}


def test_one_interpolation_for_every_cost():
    points = {1: 10.0, 8: 40.0, 16: 60.0}
    assert interpolate(points, 1) == 10.0 and interpolate(points, 0) == 10.0
    assert interpolate(points, 12) == 50.0
    assert interpolate(points, 20, per_extra=5.0) == 80.0
    assert interpolate(points, 20) == 70.0  # the line through the last two
    assert interpolate({1: 10.0, 8: 5.0}, 16) == 5.0  # never falling past the largest
    assert interpolate({4: 7.0}, 64) == 7.0
    # The cost model extrapolates at a prefill token once prefill was measured.
    measured = CostModel(target_ms=points, prefill_tokens_per_s=200.0, measured=True)
    assert measured.target_step_ms(24) == interpolate(points, 24, per_extra=5.0)
    assert CostModel(target_ms=points).target_step_ms(24) == interpolate(points, 24)


def test_a_fast_measured_prefill_takes_longer_chunks_on_a_cpu(tokenizer):
    """A request's prefill chunk follows the measured prefill speed: as long as a chunk stays
    short in time, fewer forwards read the weights, and the answer is the same."""
    assert prefill_chunk_for(0.0) == PREFILL_CHUNKS[0]  # nothing measured
    assert prefill_chunk_for(50.0) == PREFILL_CHUNKS[0]  # 128 tokens take 2.6 s: the smallest
    assert prefill_chunk_for(110.0) == 256 and prefill_chunk_for(261.0) == 512  # a 2-core AMX
    assert prefill_chunk_for(1e6) == PREFILL_CHUNKS[-1]
    model = build_tiny_model(len(tokenizer), seed=13)
    engine = Engine(model, build_tiny_model(len(tokenizer), seed=14, layers=1))
    prompt = (tokenizer.encode("".join(CODE)) * 40)[:600]
    assert (engine.target.prefill_chunk, engine.drafter.runner.prefill_chunk) == (128, 128)
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    slow = greedy(engine, prompt, "ar", max_new_tokens=4)
    slow_forwards = len(forwards)
    engine.cost_model = CostModel(
        target_ms={1: 100.0},
        draft_ms_per_token=50.0,
        prefill_tokens_per_s=300.0,
        draft_prefill_tokens_per_s=80.0,
        measured=True,
    )
    assert (engine.target.prefill_chunk, engine.drafter.runner.prefill_chunk) == (512, 128)
    engine.reset_cache()
    fast = greedy(engine, prompt, "ar", max_new_tokens=4)
    assert fast.tokens == slow.tokens
    assert slow.stats.prefill_tokens == fast.stats.prefill_tokens == 599
    assert slow.stats.target_forwards == fast.stats.target_forwards  # the decode's
    # 599 prefill tokens in 5 chunks of 128, then in 2 of 512.
    assert (slow_forwards, len(forwards) - slow_forwards) == (4 + 5, 4 + 2)
    # A warm-up, which any request may stop (and then waits for its chunk), keeps short ones.
    engine.reset_cache()
    forwards.clear()
    assert engine.warm(prompt).computed == 599
    assert len(forwards) == 5 and engine.target.prefill_chunk == 512
    # An estimate (nothing measured) keeps the smallest.
    engine.cost_model = CostModel.estimate(has_draft=True)
    assert engine.target.prefill_chunk == 128


def test_sampling_with_draft_equal_to_target_accepts_everything(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=13)
    engine = Engine(model, model, stop_token_ids=[])
    result = engine.generate(
        GenerationRequest(
            tokenizer.encode(CODE[0]),
            max_new_tokens=20,
            strategy="draft",
            draft_length=4,
            temperature=0.8,
            seed=1,
        )
    )
    stats = result.stats
    assert stats.drafted_by_source["draft"] > 0
    assert stats.accepted_by_source["draft"] == stats.drafted_by_source["draft"]


def test_sampling_is_reproducible_with_a_seed_and_fixed_draft_length(tokenizer):
    # (Adaptive draft lengths depend on recent acceptance, so they draw different random numbers.)
    model = build_tiny_model(len(tokenizer), seed=14)
    engine = Engine(model, build_tiny_model(len(tokenizer), seed=15, layers=1))
    prompt = tokenizer.encode(CODE[1])
    runs = [
        engine.generate(
            GenerationRequest(
                prompt,
                max_new_tokens=12,
                strategy="draft",
                draft_length=3,
                temperature=1.0,
                top_p=0.9,
                seed=7,
            )
        ).tokens
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_float32_models_work(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=16, dtype=torch.float32)
    engine = Engine(model, None, config=DecodingConfig(ngram_min=1, ngram_max=4))
    result = greedy(engine, tokenizer.encode(CODE[0]), "ngram", 4)
    assert len(result.tokens) == 24


def test_a_cold_draft_cache_is_charged_once_not_every_step():
    costs = CostModel(
        target_ms={1: 10, 2: 10.5, 4: 11, 8: 12, 16: 14},
        draft_ms_per_token=1.0,
        draft_prefill_tokens_per_s=10000.0,
    )
    # 1,000 tokens to catch up cost 100 ms: charged in full, drafting never pays...
    assert costs.best_k("draft", 0.8, 8, catch_up=1000, remaining_tokens=1)[0] == 0
    # ...but shared over the 200 tokens still to come, it does.
    k, rate = costs.best_k("draft", 0.8, 8, catch_up=1000, remaining_tokens=200)
    assert k > 0 and rate > 1 / costs.target_step_ms(1)
    # N-gram drafts cost nothing to propose.
    assert costs.best_k("ngram", 0.8, 8, catch_up=1000)[0] > 0


def test_short_completions_of_a_kind_stop_paying_for_a_cold_draft_cache(tokenizer):
    """The catch-up is shared over the tokens still to come; after short completions of a
    kind, the engine expects few and stops warming the draft model up for them."""
    from quickdraft.decoding.costmodel import LengthTracker

    lengths = LengthTracker(decay=0.5)
    assert lengths.expected("python|line") is None
    for length in (8, 8, 8):
        lengths.update("python|line", length)
    assert lengths.expected("python|line") == 8.0
    lengths.update("python|line", 16)
    assert lengths.expected("python|line") == 12.0
    # A kind with no completions yet is expected as long as the kinds that have some.
    assert lengths.expected("python|block") == 12.0
    lengths.update("python|block", 40)
    assert (lengths.expected("python|block"), lengths.expected("go|line")) == (40.0, 26.0)

    target = build_tiny_model(len(tokenizer), seed=0, layers=2)
    # The prompt (~90 tokens) to catch up at 600 tokens/s: ~150 ms, repaid over 64 tokens,
    # not over 2.
    costs = CostModel(
        target_ms={1: 10, 2: 10.5, 4: 11, 8: 12, 16: 14},
        draft_ms_per_token=1.0,
        draft_prefill_tokens_per_s=600.0,
    )
    engine = Engine(target, target, stop_token_ids=[], cost_model=costs)  # drafts all accepted
    prompt = tokenizer.encode(CODE[2])

    def drafted(kind):
        engine.reset_cache()
        request = GenerationRequest(
            prompt, max_new_tokens=64, strategy="draft", language="python", kind=kind
        )
        return engine.generate(request).stats.drafted_by_source["draft"]

    assert drafted("line") > 0  # nothing known yet: the whole budget is expected
    engine.lengths = LengthTracker()
    engine.lengths.update("python|line", 2)
    assert drafted("line") == 0
    engine.lengths = LengthTracker()  # (the answer above, 64 tokens, counted too)
    engine.lengths.update("python|line", 2)
    assert drafted("block") == 0  # a kind not met yet: as long as those met
    engine.lengths = LengthTracker()
    engine.lengths.update("python|line", 2)
    engine.lengths.update("python|block", 64)
    assert drafted("block") > 0  # then its own history counts

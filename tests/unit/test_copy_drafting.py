"""Copy drafting (issue 20): a rewrite that mostly copies its source drafts long runs of it,
realigns after an edit, and still gives plain greedy decoding's tokens."""

from __future__ import annotations

import random

import pytest

from quickdraft.config import DecodingConfig
from quickdraft.decoding import AcceptanceTracker, CostModel, Engine, GenerationRequest
from quickdraft.decoding.copy import CopyAligner
from quickdraft.errors import InputError
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

NL = 0
LINE1, LINE2, LINE3 = [10, 11, 12, NL], [20, 21, 12, NL], [30, 31, 12, NL]
SOURCE = LINE1 + LINE2 + LINE3
"""Three "lines" that end alike (`12, NL`), so a short rejoining n-gram is ambiguous."""


def followed(source, output):
    aligner = CopyAligner(source)
    aligner.advance(output)
    return aligner


# --- the aligner -----------------------------------------------------------------------------


def test_while_the_output_agrees_the_aligner_proposes_the_rest_of_the_source():
    aligner = CopyAligner(SOURCE)
    assert aligner.propose(5) == SOURCE[:5]
    aligner.advance(LINE1 + [20])
    assert aligner.position == 5
    assert aligner.propose(3) == [21, 12, NL]
    assert aligner.propose(100) == SOURCE[5:]  # up to the rest of the source
    aligner.advance(SOURCE[5:])
    assert aligner.propose(4) == []  # all copied


def test_a_replaced_token_realigns_at_the_nearest_rejoin_after_it():
    aligner = followed(SOURCE, LINE1 + [20, 99])
    assert not aligner.aligned and aligner.propose(4) == []
    aligner.advance([12])  # "99 12" is nowhere in the source
    assert aligner.propose(4) == []
    aligner.advance([NL])  # "12 NL" ends lines 1, 2 and 3: line 2's is the nearest after 21
    assert aligner.propose(4) == LINE3


def test_an_inserted_line_realigns_where_the_source_resumes():
    aligner = followed(SOURCE, LINE1 + [40, 41, 12, NL])
    assert aligner.propose(4) == LINE2  # not line 3: the rejoin nearest the insertion point
    aligner.advance(LINE2)
    assert aligner.propose(4) == LINE3


def test_a_deleted_line_realigns_after_it():
    aligner = followed(SOURCE, LINE1 + [30])  # "12 NL 30": line 3's start, right away
    assert aligner.position == 9 and aligner.propose(4) == [31, 12, NL]
    aligner = followed(SOURCE, LINE1 + [21])  # line 2 less its first token: "NL 21" is new
    assert aligner.propose(2) == []
    aligner.advance([12])
    assert aligner.position == 7 and aligner.propose(5) == [NL, *LINE3]


def test_the_longest_rejoining_ngram_wins_over_a_nearer_short_one():
    source = [1, 2, 3, 4, 9, 3, 5, 7, 1, 2, 3, 5, 6]
    aligner = followed(source, [1, 2, 3, 5])  # "3 5" continues with 7, "1 2 3 5" with 6
    assert aligner.propose(3) == [6]


def test_a_match_before_the_departure_is_taken_when_none_follows_it():
    aligner = followed(SOURCE, SOURCE + LINE2[:3])  # line 2 again, after the whole source
    assert aligner.position == 7 and aligner.propose(2) == [NL, 30]


def test_output_that_matches_nothing_proposes_nothing_until_it_rejoins():
    aligner = followed(SOURCE, [50, 51, 52, 53, 54, 55, 56, 57, 58, 59])
    assert aligner.propose(8) == []
    aligner.advance([30, 31])
    assert aligner.propose(8) == [12, NL]


# --- the cost of long forwards ---------------------------------------------------------------

AVX2_MS = {1: 46.8, 2: 81.2, 4: 130.1, 8: 303.0, 16: 403.5}
"""Target forward times (ms) by tokens, Qwen2.5-Coder 1.5B in llama.cpp, the 2-core AVX2 box."""


def test_forwards_longer_than_the_measured_sizes_cost_a_prefill_token_each_when_measured():
    measured = CostModel(target_ms=dict(AVX2_MS), prefill_tokens_per_s=40.0, measured=True)
    assert measured.target_step_ms(66) == pytest.approx(403.5 + 50 * 25.0)
    estimated = CostModel(target_ms=dict(AVX2_MS))  # no prefill measured: the last two sizes
    assert estimated.target_step_ms(32) == pytest.approx(403.5 + 16 * (403.5 - 303.0) / 8)


@pytest.mark.parametrize("prefill_tokens_per_s", [0.0, 38.0])
def test_on_the_avx2_figures_long_copy_drafts_beat_plain_decoding(prefill_tokens_per_s):
    costs = CostModel(
        target_ms=dict(AVX2_MS),
        prefill_tokens_per_s=prefill_tokens_per_s,
        measured=prefill_tokens_per_s > 0,
    )
    plain = 1.0 / costs.target_step_ms(1)
    # 64 drafts of which 58 are accepted: 59 tokens from one 65-token forward.
    assert 59 / costs.target_step_ms(65) > 1.5 * plain
    tracker = AcceptanceTracker()
    for _ in range(4):
        tracker.update(None, "copy", 64, 58)
    k, rate = costs.best_k("copy", tracker.rate(None, "copy"), 256)
    assert k > DecodingConfig().max_draft_length and rate > 1.5 * plain
    if not prefill_tokens_per_s:  # each token past 16 costs half of what one at 16 does
        assert k >= 32


# --- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def models(tokenizer):
    vocab = len(tokenizer)
    return build_tiny_model(vocab, seed=4, layers=2), build_tiny_model(vocab, seed=5, layers=1)


PROMPT = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"


def generate(engine, prompt, strategy, k=None, n=100, **kw):
    engine.reset_cache()
    request = GenerationRequest(prompt, max_new_tokens=n, strategy=strategy, draft_length=k, **kw)
    return engine.generate(request)


def edited(tokens, start, end, replacement):
    """`tokens` with tokens[start:end] replaced: the region before the model's rewrite."""
    return tokens[:start] + replacement + tokens[end:]


def test_copying_the_whole_output_takes_one_forward_per_draft_length(models, tokenizer):
    engine = Engine(models[0], None, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    expected = generate(engine, prompt, "ar").tokens
    assert len(expected) == 100
    result = generate(engine, prompt, "ngram", 16, copy_source=expected)
    assert result.tokens == expected
    assert result.stats.target_forwards == 6  # 5 x (16 copied + 1), then 14 + 1
    assert result.stats.accepted_by_source["copy"] == result.stats.drafted_by_source["copy"] == 94


@pytest.mark.parametrize(
    "change",
    [(40, 46, [101, 102, 103, 104, 105, NL]), (40, 40, [101, 102, 103, NL]), (40, 52, [])],
    ids=["changed line", "inserted line", "deleted line"],
)
@pytest.mark.parametrize("strategy", ["ngram", "hybrid"])
def test_a_rewrite_that_changes_one_line_copies_the_rest(models, tokenizer, strategy, change):
    """The source is `ar`'s own output with one stretch changed, so the rewrite the model makes
    (its greedy output) is the source but for that stretch."""
    engine = Engine(*models, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    expected = generate(engine, prompt, "ar").tokens
    source = edited(expected, *change)
    result = generate(engine, prompt, strategy, 16, copy_source=source)
    assert result.tokens == expected
    stats = result.stats
    assert stats.tokens_per_forward >= 4
    assert stats.target_forwards <= 12
    assert stats.accepted_by_source["copy"] >= 70  # all but the changed stretch and its rejoin
    without = generate(engine, prompt, strategy, 16)
    assert without.tokens == expected
    assert without.stats.target_forwards > stats.target_forwards


def test_the_cost_model_drafts_copies_longer_than_completions_drafts(models, tokenizer):
    engine = Engine(models[0], None, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    expected = generate(engine, prompt, "ar", n=200).tokens
    longest = engine.config.max_draft_length
    result = generate(engine, prompt, "ngram", n=200, copy_source=expected)
    assert result.tokens == expected
    # Drafts bounded by max_draft_length would need a forward per max_draft_length + 1 tokens.
    assert result.stats.target_forwards < 200 / (longest + 1)
    capped = generate(engine, prompt, "ngram", n=200, copy_source=expected, max_copy_draft=4)
    assert capped.tokens == expected
    assert capped.stats.target_forwards >= 200 / 5


def test_greedy_output_is_ars_whatever_the_copy_source(tokenizer):
    vocab = len(tokenizer)
    rng = random.Random(7)
    for seed in range(2):
        target = build_tiny_model(vocab, seed=30 + seed, layers=2)
        draft = build_tiny_model(vocab, seed=40 + seed, layers=1)
        engine = Engine(target, draft, stop_token_ids=[tokenizer.eos_token_id])
        for _ in range(3):
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 30))]
            expected = generate(engine, prompt, "ar", n=40).tokens
            start = rng.randrange(len(expected))
            sources = [
                edited(expected, start, start + rng.randint(0, 6), [rng.randrange(vocab)] * 3),
                [rng.randrange(vocab) for _ in range(50)],
                expected[10:] + expected[:10],
            ]
            for source in sources:
                for strategy in ("ngram", "hybrid"):
                    k = rng.choice([None, 1, 4, 32])
                    result = generate(engine, prompt, strategy, k, n=40, copy_source=source)
                    assert result.tokens == expected, (seed, strategy, k)


def test_sampling_with_a_copy_source_runs_and_drafts_from_it(models, tokenizer):
    engine = Engine(*models, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    source = generate(engine, prompt, "ar", n=48).tokens
    for strategy in ("ngram", "hybrid"):
        for k in (None, 8):
            result = generate(
                engine, prompt, strategy, k, n=48, temperature=0.7, seed=3, copy_source=source
            )
            assert len(result.tokens) == 48
            assert result.stats.drafted_by_source["copy"] > 0


def test_ar_and_the_draft_model_ignore_the_copy_source(models, tokenizer):
    engine = Engine(*models, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    expected = generate(engine, prompt, "ar", n=40).tokens
    plain = generate(engine, prompt, "ar", 8, n=40, copy_source=expected)
    assert plain.tokens == expected
    assert plain.stats.target_forwards == 40
    assert plain.stats.drafted_by_source["copy"] == 0
    drafted = generate(engine, prompt, "draft", 8, n=40, copy_source=expected)
    assert drafted.tokens == expected
    assert drafted.stats.drafted_by_source["copy"] == 0


def test_a_copy_draft_limit_below_one_is_refused(models, tokenizer):
    engine = Engine(models[0], None, stop_token_ids=[])
    with pytest.raises(InputError, match="max copy draft"):
        generate(engine, tokenizer.encode(PROMPT), "ngram", copy_source=[1, 2], max_copy_draft=0)


def test_a_rewrite_that_ignored_its_source_does_not_stop_the_next_one_copying(models, tokenizer):
    """Copy acceptance is the request's own: after a request whose source the output never
    followed, the next request with a faithful source still drafts long copies."""
    engine = Engine(models[0], None, stop_token_ids=[])
    prompt = tokenizer.encode(PROMPT)
    expected = generate(engine, prompt, "ar").tokens
    for _ in range(6):  # sources that agree for a few tokens, then never again
        misleading = expected[:3] + [t + 1 for t in expected[3:]]
        assert generate(engine, prompt, "ngram", copy_source=misleading).tokens == expected
    faithful = generate(engine, prompt, "ngram", copy_source=expected)
    assert faithful.tokens == expected
    assert faithful.stats.tokens_per_forward >= 4
    # exactly what an engine that never saw the misleading requests does
    fresh = generate(
        Engine(models[0], None, stop_token_ids=[]), prompt, "ngram", copy_source=expected
    )
    assert faithful.stats.target_forwards == fresh.stats.target_forwards
    assert faithful.stats.accepted_by_source == fresh.stats.accepted_by_source

"""Exactness where it is claimed: on int8 (batch-invariant) every strategy equals `ar`, and a
warm cache gives a cold prefill's tokens, on real-shaped models (grouped-query attention,
several layers) with prompts longer than one prefill chunk; and the measurement that says so
counts what differs."""

from __future__ import annotations

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.identity import measure_identity
from quickdraft.decoding.runner import ModelRunner
from quickdraft.models.quantize import quantize_model
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

CODE = (
    "def area(width, height):\n    product = width * height\n    return abs(product)\n\n\n"
    "def perimeter(width, height):\n    total = width + height\n    return 2 * total\n\n\n"
    "class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n"
    "        self.height = height\n\n    def area(self):\n        return area(self.width, "
    "self.height)\n\n    def perimeter(self):\n        return perimeter(self.width, self.height)\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def int8_pair(tokenizer):
    vocab = len(tokenizer)
    shape = dict(dtype=torch.float32, hidden=256, heads=8, kv_heads=2)
    target = quantize_model(build_tiny_model(vocab, seed=0, layers=3, **shape))
    draft = quantize_model(build_tiny_model(vocab, seed=1, layers=1, **shape))
    return target, draft


@pytest.fixture(scope="module")
def prompts(tokenizer):
    ids = tokenizer.encode(CODE * 2)
    return [ids[:300], ids[37:250], ids[100:233]]


def greedy(engine, prompt, strategy="ar", k=None, n=16):
    request = GenerationRequest(prompt, max_new_tokens=n, strategy=strategy, draft_length=k)
    return engine.generate(request)


def test_int8_every_strategy_and_warm_cache_give_cold_ar_tokens(int8_pair, prompts):
    target, draft = int8_pair
    engine = Engine(target, draft, stop_token_ids=[])
    result = measure_identity(engine, prompts, draft_lengths=(None, 2, 8), max_new_tokens=16)
    assert result["cases"].keys() == {
        f"{s}{'' if k is None else f' k={k}'}"
        for s in ("ngram", "draft", "hybrid")
        for k in (None, 2, 8)
    }
    assert result["identical_to_ar"] == {"same": 27, "runs": 27, "rate": 1.0}
    for key in ("warm_equals_cold", "after_completion", "verify_logits", "prefill_logits"):
        assert result[key] == {"same": 3, "runs": 3, "rate": 1.0}, key
    assert result["max_abs_diff"] == 0.0


def test_int8_same_tokens_warm_and_cold_whatever_came_before(int8_pair, prompts, tokenizer):
    """The server's cache after other requests (typing, another cursor, an accepted
    completion) against `quickdraft complete`'s cold one, with prefill chunks cut elsewhere."""
    target, draft = int8_pair
    cold, warm = Engine(target, draft, stop_token_ids=[]), Engine(target, draft, stop_token_ids=[])
    for chunk in (128, 50):
        warm.target.prefill_chunk = chunk
        base = prompts[0]
        accepted = greedy(warm, base[:150], "hybrid").tokens
        sequence = [
            base[:150] + accepted + base[150:200],  # after accepting a completion
            base[:151],  # one more token typed (the completion was not taken)
            base,
            base[:20] + tokenizer.encode("other text") + base[20:],  # an edit near the top
            base,
        ]
        for prompt in sequence:
            cold.reset_cache()
            expected = greedy(cold, prompt)
            got = greedy(warm, prompt, "hybrid")
            assert got.tokens == expected.tokens
            assert got.stats.reused_tokens + got.stats.prefill_tokens == len(prompt) - 1


def test_decode_steps_are_not_reused_by_the_next_prefill_but_drafts_are(int8_pair, prompts):
    """With row-wise attention a decode step computes a row another way than a prefill: the
    target's next request recomputes what earlier steps computed (the last prompt token and
    the new tokens), the draft model keeps reusing its own proposals."""
    target, draft = int8_pair
    engine = Engine(target, draft, stop_token_ids=[])
    prompt = prompts[1]
    first = greedy(engine, prompt, "draft", 4)
    assert engine.target.prefilled == len(prompt) - 1
    assert len(engine.target.tokens) == len(prompt) + len(first.tokens) - 1
    follow = prompt + first.tokens + prompts[2][:5]
    second = greedy(engine, follow, "draft", 4)
    assert second.stats.reused_tokens == len(prompt) - 1
    assert second.stats.prefill_tokens == len(first.tokens) + 5

    drafter = engine.drafter.runner
    drafter.reset()
    proposed = engine.drafter.propose(prompt, 4).tokens
    computed = []
    forward = drafter.forward

    def counting(tokens, **kwargs):
        computed.append(len(tokens))
        return forward(tokens, **kwargs)

    drafter.forward = counting
    engine.drafter.propose(prompt + proposed[:3], 4)
    assert computed[0] == 1  # only the 4th proposal: the first three were reused

    # Without row-wise attention every forward computes alike, and all of it is reused.
    plain = ModelRunner(build_tiny_model(target.config.vocab_size, seed=2))
    plain.extend(prompt[:-1])
    plain.forward(prompt[-1:] + [5, 6])
    reused, computed_now, _ = plain.extend(prompt + [5, 6, 7])
    assert (reused, computed_now) == (len(prompt) + 2, 1)


def test_the_measurement_counts_logits_that_differ(tokenizer, prompts):
    """A path whose verify forward differs from its steps in the last bits is reported so, even
    where the tokens happen to agree."""
    model = build_tiny_model(len(tokenizer), seed=3, dtype=torch.float32)
    engine = Engine(model, None, stop_token_ids=[])
    forward = engine.target.forward

    def off_by_a_little(tokens, **kwargs):
        logits = forward(tokens, **kwargs)
        return logits + 1e-3 if len(tokens) > 1 and not kwargs.get("prefill") else logits

    engine.target.forward = off_by_a_little
    result = measure_identity(
        engine, prompts[:2], strategies=("ngram", "draft"), draft_lengths=(3,), max_new_tokens=8
    )
    assert set(result["cases"]) == {"ngram k=3"}  # no draft model: `draft` is left out
    assert result["identical_to_ar"]["runs"] == 2
    assert result["verify_logits"] == {"same": 0, "runs": 2, "rate": 0.0}
    assert result["max_abs_diff"] == pytest.approx(1e-3, rel=0.01)


def test_identity_report_measures_each_path_it_is_given(tmp_path, capsys):
    import json

    from quickdraft.models.identity_report import ComputePath, main

    assert ComputePath.parse("int8+compiled").name == "int8+compiled"
    assert ComputePath.parse("int8+compiled").static and ComputePath.parse("int8").rowwise
    assert ComputePath.parse("bfloat16+rowwise+static").name == "bfloat16+rowwise+static"
    with pytest.raises(SystemExit, match="unknown flag"):
        ComputePath.parse("float32+fast")
    out = tmp_path / "identity.json"
    argv = ["--paths", "int8,float32+static", "--prompts", "1", "--max-new-tokens", "4"]
    assert main([*argv, "--draft-lengths", "adaptive,3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["path"] for r in results] == ["int8", "float32+static"]
    assert [r["cache"] for r in results] == ["growing", "static"]
    assert results[0]["attention"] == "rowwise" and results[1]["attention"] == "sdpa"
    for result in results:
        assert result["identical_to_ar"]["runs"] == 6  # 3 strategies x 2 lengths x 1 prompt
    assert results[0]["identical_to_ar"]["rate"] == 1.0 and results[0]["max_abs_diff"] == 0.0
    table = capsys.readouterr().out
    assert "| `int8` (cpu) | 100.0% (6/6) | 100.0% (1/1) |" in table

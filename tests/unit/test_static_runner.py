"""The accelerator runtime: a preallocated KV cache and fixed-shape (compilable) steps.

It must give the same logits as the growing cache, keep every strategy identical to plain
decoding, survive crops and sequences longer than its capacity, and trace as one graph.
"""

from __future__ import annotations

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.runner import ModelRunner, StaticModelRunner
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

TEXT = "def area(width, height):\n    return width * height\n\ndef perimeter(width, height):\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_static_and_growing_caches_give_the_same_logits_through_crops(tokenizer, arch):
    model = build_tiny_model(len(tokenizer), arch=arch, seed=2, layers=2)
    ids = tokenizer.encode(TEXT)
    growing, static = ModelRunner(model), StaticModelRunner(model, capacity=32)
    for runner in (growing, static):
        runner.extend(ids[:20])
    for start, stop, keep in ((20, 23, 21), (21, 30, 25), (25, 26, 26), (26, 40, 33)):
        expected = growing.forward(ids[start:stop])
        got = static.forward(ids[start:stop])
        assert got.shape == expected.shape == (stop - start, growing.vocab_size)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
        growing.keep(keep)
        static.keep(keep)
        assert static.tokens == growing.tokens
    assert static.capacity == 64  # 40 + padding outgrew 32: reallocated, recomputed


def test_every_strategy_stays_identical_on_static_caches(tokenizer):
    vocab = len(tokenizer)
    target = build_tiny_model(vocab, seed=0, layers=2)
    draft = build_tiny_model(vocab, seed=1, layers=1)
    prompt = tokenizer.encode(TEXT)
    plain = Engine(target, draft, stop_token_ids=[])
    expected = plain.generate(GenerationRequest(prompt, max_new_tokens=20, strategy="ar")).tokens
    engine = Engine(target, draft, stop_token_ids=[], static_cache_tokens=48)
    for strategy in ("ar", "ngram", "draft", "hybrid"):
        for k in (None, 3, 8):
            engine.reset_cache()
            result = engine.generate(
                GenerationRequest(prompt, max_new_tokens=20, strategy=strategy, draft_length=k)
            )
            assert result.tokens == expected, (strategy, k)
    # A second request reuses the cached prefix on the static cache too.
    again = engine.generate(GenerationRequest(prompt, max_new_tokens=20, strategy="hybrid"))
    assert again.tokens == expected and again.stats.reused_tokens == len(prompt) - 1


def test_compiled_steps_trace_as_one_graph(tokenizer):
    """fullgraph=True fails on any graph break; the eager backend checks tracing cheaply."""
    torch._dynamo.reset()
    model = build_tiny_model(len(tokenizer), seed=3, layers=1)
    prompt = tokenizer.encode(TEXT)
    plain = Engine(model, None, stop_token_ids=[])
    expected = plain.generate(GenerationRequest(prompt, max_new_tokens=6, strategy="ar")).tokens
    engine = Engine(model, None, stop_token_ids=[])
    engine.target = StaticModelRunner(
        model, capacity=128, compile_steps=True, compile_backend="eager"
    )
    result = engine.generate(
        GenerationRequest(prompt, max_new_tokens=6, strategy="ngram", draft_length=3)
    )
    assert result.tokens == expected


def test_compile_setting_is_validated_and_turns_on_static_caches():
    from quickdraft.config import load_config
    from quickdraft.errors import ConfigError
    from quickdraft.testing import build_tiny_loaded_models, local_completer

    with pytest.raises(ConfigError, match="compile"):
        load_config({"model": {"compile": "sometimes"}})
    with pytest.raises(ConfigError, match="staticCacheTokens: 8 is below"):
        load_config({"model": {"staticCacheTokens": 8}})
    models = build_tiny_loaded_models()
    auto = local_completer(models, load_config({}))  # CPU: auto stays eager
    assert type(auto.backend.engine.target) is ModelRunner
    on = local_completer(
        models, load_config({"model": {"compile": "on", "static_cache_tokens": 256}})
    )
    assert (
        isinstance(on.backend.engine.target, StaticModelRunner)
        and on.backend.engine.target.capacity == 256
    )
    assert isinstance(on.backend.engine.drafter.runner, StaticModelRunner)


@pytest.fixture(scope="module")
def int8_pair(tokenizer):
    """Real-shaped int8 models (grouped-query attention, several layers): row-wise attention,
    whose positions come from the static cache's `cache_position`."""
    from quickdraft.models.quantize import quantize_model

    vocab = len(tokenizer)
    shape = dict(dtype=torch.float32, hidden=256, heads=8, kv_heads=2)
    target = quantize_model(build_tiny_model(vocab, seed=0, layers=3, **shape))
    draft = quantize_model(build_tiny_model(vocab, seed=1, layers=1, **shape))
    return target, draft


LONG_TEXT = TEXT * 4  # over one prefill chunk (128 tokens), so prefills are chunked


def test_int8_static_cache_gives_the_growing_caches_logits_bitwise(tokenizer, int8_pair):
    target, _ = int8_pair
    ids = tokenizer.encode(LONG_TEXT)
    growing, static = ModelRunner(target), StaticModelRunner(target, capacity=256)
    for runner in (growing, static):
        runner.extend(ids[:150])
    steps = ((150, 153, 151), (151, 160, 155), (155, 156, 156), (156, 170, 163))
    for start, stop, keep in steps:
        expected = growing.forward(ids[start:stop])
        assert torch.equal(static.forward(ids[start:stop]), expected)
        growing.keep(keep)
        static.keep(keep)
    # A warm prefill from a crop point, through the capacity: the cache grows by copying.
    _, _, expected = growing.extend(ids[:300])
    _, _, got = static.extend(ids[:300])
    assert static.capacity == 512 and static.tokens == growing.tokens
    assert torch.equal(got, expected)
    assert torch.equal(static.forward(ids[300:305]), growing.forward(ids[300:305]))


def test_int8_static_cache_growth_keeps_what_decode_steps_computed(tokenizer, int8_pair):
    """Outgrowing the capacity mid-generation copies the cache: the keys and values of decode
    steps stay as they were computed (a prefill would compute those rows another way)."""
    target, _ = int8_pair
    ids = tokenizer.encode(LONG_TEXT)
    growing, static = ModelRunner(target), StaticModelRunner(target, capacity=128)
    for runner in (growing, static):
        runner.extend(ids[:100])
        for position in range(100, 126):
            runner.forward(ids[position : position + 1])
    assert static.capacity == 128 and static.prefilled == 100
    expected = growing.forward(ids[126:131])  # padded to 8: outgrows 128
    assert torch.equal(static.forward(ids[126:131]), expected)
    assert static.capacity == 256 and static.prefilled == 100


def test_int8_static_and_compiled_steps_are_identical_to_ar(tokenizer, int8_pair):
    """int8 + static cache (+ compiled steps, traced as one graph; the eager backend keeps this
    test fast, `python -m quickdraft.models.identity_report` measures inductor) gives every
    strategy the tokens of plain decoding on the growing cache, warm or cold."""
    torch._dynamo.reset()
    target, draft = int8_pair
    prompt = tokenizer.encode(LONG_TEXT)[:200]
    plain = Engine(target, draft, stop_token_ids=[])
    expected = plain.generate(GenerationRequest(prompt, max_new_tokens=10, strategy="ar")).tokens
    static = Engine(target, draft, stop_token_ids=[], static_cache_tokens=512)
    compiled = Engine(target, draft, stop_token_ids=[])
    compiled.target, compiled.drafter.runner = (
        StaticModelRunner(model, capacity=512, compile_steps=True, compile_backend="eager")
        for model in (target, draft)
    )
    cases = [(static, s, k) for s in ("ar", "ngram", "draft", "hybrid") for k in (None, 3)]
    cases += [(compiled, "ar", None), (compiled, "ngram", 3), (compiled, "draft", 2)]
    for engine, strategy, k in cases:
        engine.reset_cache()
        result = engine.generate(
            GenerationRequest(prompt, max_new_tokens=10, strategy=strategy, draft_length=k)
        )
        assert result.tokens == expected, (engine is compiled, strategy, k)
    # Warm: after a request on a cut of the prompt, and one token shorter (a prefill of one
    # token, which must not go through a compiled step: prefill rows are computed otherwise).
    for engine in (static, compiled):
        for cut in (77, len(prompt) - 1):
            engine.generate(GenerationRequest(prompt[:cut], max_new_tokens=5, strategy="hybrid"))
            warm = engine.generate(GenerationRequest(prompt, max_new_tokens=10, strategy="ar"))
            assert warm.tokens == expected and warm.stats.reused_tokens == cut - 1


def test_int8_steps_compile_with_inductor(tokenizer):
    """Inductor lowers oneDNN's int8 linear only with the packed weights frozen into the graph
    (the runner sets it); the compiled step gives plain decoding's tokens."""
    from quickdraft.models.quantize import quantize_model

    torch._dynamo.reset()
    model = quantize_model(
        build_tiny_model(len(tokenizer), seed=4, layers=1, dtype=torch.float32, hidden=64)
    )
    prompt = tokenizer.encode(TEXT)
    plain = Engine(model, None, stop_token_ids=[])
    expected = plain.generate(GenerationRequest(prompt, max_new_tokens=4, strategy="ar")).tokens
    compiled = Engine(model, None, stop_token_ids=[], static_cache_tokens=128, compile_steps=True)
    assert compiled.target.compiled
    result = compiled.generate(GenerationRequest(prompt, max_new_tokens=4, strategy="ar"))
    assert result.tokens == expected


def test_int8_prefill_of_a_bucket_size_stays_out_of_the_compiled_step(tokenizer, int8_pair):
    """A warm prefill of 1, 2, 4... tokens has a compiled step's shape; with row-wise attention
    it still runs eagerly, in aligned blocks, giving a cold prefill's logits bitwise."""
    torch._dynamo.reset()
    target, _ = int8_pair
    ids = tokenizer.encode(LONG_TEXT)[:180]
    cold = ModelRunner(target)
    compiled = StaticModelRunner(target, capacity=512, compile_steps=True, compile_backend="eager")
    step, stepped = compiled._step, []
    compiled._step = lambda **kwargs: stepped.append(kwargs["input_ids"].shape[1]) or step(**kwargs)
    for short in (1, 2, 4):
        cold.reset()
        _, _, expected = cold.extend(ids)
        compiled.reset()
        compiled.extend(ids[:-short])
        _, computed, got = compiled.extend(ids)
        assert computed == short and torch.equal(got, expected), short
    assert stepped == []
    compiled.forward(ids[:2])  # a decode/verify step does go through it
    assert stepped == [2]

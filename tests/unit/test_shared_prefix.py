"""Documents of a workspace share their prompt's head: a slot adopts another slot's cached
prefix instead of computing it (runner.SHARED_PREFIX_MIN), on every runner, with the output of
a cold computation, and the answers' stats say where their reused tokens came from."""

from __future__ import annotations

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest, llamacpp
from quickdraft.decoding.kv_cache import GROWTH
from quickdraft.decoding.runner import SHARED_PREFIX_MIN, ModelRunner, StaticModelRunner
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer

HEAD = (
    "# repository: quickdraft\n# file: shapes.py\n"
    "def area(width, height):\n    return width * height\n\n"
    "# file: geometry.py\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
)
A = "from shapes import area\nprint(area(2, 3))\n"
B = "import geometry\nvalue = geometry.perimeter("


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    head = tokenizer.encode(HEAD)
    a, b = head + tokenizer.encode(A), head + tokenizer.encode(B)
    assert a[len(head)] != b[len(head)] and len(head) > 128  # the head spans a prefill chunk
    return head, a, b


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(len(tokenizer), seed=0, layers=2)


@pytest.fixture(scope="module")
def int8_model(tokenizer):
    """Row-wise attention (batch-invariant prefill rows): adopted rows are a cold prefill's."""
    from quickdraft.models.quantize import quantize_model

    shape = dict(dtype=torch.float32, hidden=256, heads=8, kv_heads=2)
    return quantize_model(build_tiny_model(len(tokenizer), seed=0, layers=2, **shape))


def cold_logits(model, tokens):
    _, _, logits = ModelRunner(model).extend(tokens)
    return logits


@pytest.mark.parametrize("kind", ["growing", "static"])
def test_a_slot_adopts_the_head_another_slot_computed(model, prompts, kind):
    head, a, b = prompts
    runner = ModelRunner(model) if kind == "growing" else StaticModelRunner(model, capacity=512)
    runner.select("a")
    runner.extend(a)
    runner.select("b")
    reused, computed, logits = runner.extend(b)
    assert (reused, computed) == (len(head), len(b) - len(head))
    assert runner.last_adopted == len(head) and runner.tokens == b
    torch.testing.assert_close(logits, cold_logits(model, b), rtol=1e-9, atol=1e-9)
    # The next token's logits too: the cache holds what a cold prefill would.
    torch.testing.assert_close(
        runner.forward(a[-3:]), cold_forward(model, b, a[-3:]), rtol=1e-9, atol=1e-9
    )
    # Its own cache comes first the next time: nothing adopted, nothing computed.
    runner.keep(len(b))
    reused, computed, _ = runner.extend(b)
    assert (reused, computed, runner.last_adopted) == (len(b), 0, 0)
    if kind == "growing":
        # The donor is as it was, although the adopter appended to what it shares.
        runner.select("a")
        assert runner.tokens == a
        torch.testing.assert_close(
            runner.forward(b[-3:]), cold_forward(model, a, b[-3:]), rtol=1e-9, atol=1e-9
        )


def cold_forward(model, cached, new):
    runner = ModelRunner(model)
    runner.extend(cached)
    return runner.forward(new)


def test_too_short_a_gain_is_computed_not_adopted(model, tokenizer):
    runner = ModelRunner(model)
    shared = tokenizer.encode("x" * (SHARED_PREFIX_MIN + 5))
    runner.select("a")
    runner.extend(shared + tokenizer.encode("abc"))
    runner.select("b")
    runner.extend(shared[:6] + tokenizer.encode("def"))  # b's own cache: 6 shared tokens
    reused, computed, _ = runner.extend(shared + tokenizer.encode("ghi"))
    assert (reused, runner.last_adopted) == (6, 0)  # 21 - 6 < SHARED_PREFIX_MIN
    runner.select("c")
    reused, _, _ = runner.extend(shared + tokenizer.encode("jkl"))
    assert (reused, runner.last_adopted) == (len(shared), len(shared))


def test_int8_adopted_prefix_gives_a_cold_prefills_logits_bitwise(int8_model, prompts):
    head, a, b = prompts
    for runner in (ModelRunner(int8_model), StaticModelRunner(int8_model, capacity=512)):
        runner.select("a")
        runner.extend(a)
        for position in range(len(a), len(a) + 4):  # decode steps: rows a prefill never made
            runner.forward(b[position - len(a) : position - len(a) + 1])
        runner.select("b")
        reused, computed, logits = runner.extend(b)
        assert (reused, runner.last_adopted) == (len(head), len(head))
        assert torch.equal(logits, cold_logits(int8_model, b))


def test_static_cache_adopts_positions_a_rewind_left_behind(model, prompts):
    head, a, b = prompts
    runner = StaticModelRunner(model, capacity=512)
    runner.select("a")
    runner.extend(a)
    runner.select("b")
    runner.reset()  # writes nothing: a's keys and values stay in place
    reused, _, logits = runner.extend(b)
    assert reused == runner.last_adopted == len(head)
    torch.testing.assert_close(logits, cold_logits(model, b), rtol=1e-9, atol=1e-9)
    # Once a forward wrote over them, they are a's no more.
    runner.select("c")
    runner.extend(head[:10] + a[:3])
    runner.select("d")
    reused, _, _ = runner.extend(a)
    assert reused == 0 and runner.last_adopted == 0  # 10 shared < SHARED_PREFIX_MIN
    runner.reset_all()
    runner.select("e")
    assert runner.extend(a)[0] == 0


def test_parked_memory_counts_a_shared_tensor_once(model, prompts):
    head, a, _ = prompts
    runner = ModelRunner(model)
    runner.select("a")
    runner.extend(a)
    runner.select("b")
    runner.extend(head)  # adopted: views of a's tensors, nothing computed
    assert runner.last_adopted == len(head)
    runner.select("c")
    both = runner.parked_bytes()
    runner.select("a")  # a in use: b's views alone are parked
    only_b = runner.parked_bytes()
    assert both == only_b > 0  # b holds a's storages; parked together they count once
    # a's buffers, with room to grow past its positions (decoding/kv_cache.py): 2 layers x
    # (keys, values) x 2 heads x 16 dimensions x 8 bytes a position.
    capacity = runner.cache.layers[0].buffers[0].shape[-2]
    assert capacity == -(-len(a) // GROWTH) * GROWTH
    assert both == capacity * 2 * 2 * 2 * 16 * 8


def test_an_answer_in_another_document_computes_only_its_own_part(model, prompts):
    head, a, b = prompts
    cold = Engine(model, None, stop_token_ids=[])
    expected = cold.generate(GenerationRequest(b, max_new_tokens=12, strategy="ar"))
    for strategy in ("ar", "ngram"):
        engine = Engine(model, None, stop_token_ids=[])
        engine.generate(GenerationRequest(a, max_new_tokens=6, strategy="ar", slot="a"))
        result = engine.generate(
            GenerationRequest(b, max_new_tokens=12, strategy=strategy, slot="b")
        )
        assert result.tokens == expected.tokens
        stats = result.stats
        assert stats.prefill_tokens == len(b) - 1 - len(head)
        assert stats.reused_tokens == stats.reused_shared_tokens == len(head)
        assert stats.reused_warm_tokens == stats.reused_own_tokens == 0
    data = stats.to_dict()
    assert data["reused_shared_tokens"] == len(head) and data["reused_own_tokens"] == 0
    # The next answer in b reuses b's own cache.
    again = engine.generate(GenerationRequest(b, max_new_tokens=4, strategy="ar", slot="b"))
    assert again.stats.reused_own_tokens == again.stats.reused_tokens == len(b) - 1
    assert again.stats.reused_shared_tokens == again.stats.reused_warm_tokens == 0


def test_a_warm_up_credits_its_work_to_the_next_answer_only(model, prompts, tokenizer):
    head, a, b = prompts
    engine = Engine(model, None, stop_token_ids=[])
    engine.generate(GenerationRequest(a, max_new_tokens=4, strategy="ar", slot="a"))
    warmed = engine.warm(b, slot="b")
    assert (warmed.adopted, warmed.computed) == (len(head), len(b) - 1 - len(head))
    typed = b + tokenizer.encode("2, 3")
    first = engine.generate(GenerationRequest(typed, max_new_tokens=4, strategy="ar", slot="b"))
    stats = first.stats
    assert stats.reused_shared_tokens == len(head)
    assert stats.reused_warm_tokens == len(b) - 1 - len(head)
    assert stats.reused_tokens == len(b) - 1 and stats.reused_own_tokens == 0
    second = engine.generate(GenerationRequest(typed, max_new_tokens=4, strategy="ar", slot="b"))
    assert second.stats.reused_shared_tokens == second.stats.reused_warm_tokens == 0
    # A warm-up whose tail the request does not reuse: only what the request kept counts.
    engine.warm(a + tokenizer.encode("print(area(4, 5))\n"), slot="a")
    edited = a[:-5]
    result = engine.generate(GenerationRequest(edited, max_new_tokens=2, strategy="ar", slot="a"))
    assert result.stats.reused_warm_tokens == 0 and result.stats.reused_tokens == len(edited) - 1


# --- llama.cpp: cells shared by two sequences ------------------------------------------------

needs_llamacpp = pytest.mark.skipif(
    not llamacpp.available(), reason="llama-cpp-python is not installed (quickdraft[llama])"
)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    from quickdraft.models.llamacpp import LlamaCppModel
    from quickdraft.testing import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "target.gguf"
    write_tiny_gguf(path, seed=0)
    return LlamaCppModel(path, threads=1, extra_bufts=False)


def seq_positions(runner) -> int:
    return int(runner.lib.llama_memory_seq_pos_max(runner._memory, runner._seq)) + 1


@needs_llamacpp
def test_llamacpp_adopts_by_reference_and_survives_the_donors_crop_and_eviction(
    gguf, prompts, tokenizer
):
    """llama.cpp's kernels are not batch-invariant: a head ending inside a chunk gets other
    keys and values computed with a's tokens than with b's (a warm cache of its own, too).
    A head of whole chunks makes adopted and own the same computation, bitwise."""
    head = prompts[0][:128]
    a, b = head + tokenizer.encode(A), head + tokenizer.encode(B)
    runner = llamacpp.LlamaCppRunner(gguf, n_ctx=1024, prefill_chunk=64)
    # The reference: b computed on b's own copy of the head, in the same chunks.
    runner.select("reference")
    runner.extend(head)
    _, _, expected = runner.extend(b)
    expected_next = runner.forward(a[-3:])
    runner.reset()
    runner.select("a")
    runner.extend(a)
    runner.select("b")
    reused, computed, logits = runner.extend(b)
    assert (reused, computed) == (len(head), len(b) - len(head))
    assert runner.last_adopted == len(head) and seq_positions(runner) == len(b)
    assert torch.equal(logits, expected)
    # The donor crops below the head, then is dropped: b's cells stay b's.
    runner.select("a")
    runner.keep(5)
    assert seq_positions(runner) == 5
    runner.select("b")
    while runner._park_oldest_other():  # the default slot, "reference", then "a"
        assert seq_positions(runner) == len(b)
    assert list(runner._slots) == ["b"] and runner.tokens == b
    # (Other cells around b's now: the kernels sum over another span, close to the last bits.)
    after = runner.forward(a[-3:])
    torch.testing.assert_close(after, expected_next, rtol=0, atol=1e-2)
    assert torch.equal(after.argmax(-1), expected_next.argmax(-1))
    # b's cells are donors in turn; b's own crop keeps what c shares.
    runner.select("c")
    assert runner.extend(b)[0] == len(b) and runner.last_adopted == len(b)
    runner.select("b")
    runner.reset()
    runner.select("c")
    assert seq_positions(runner) == len(b)
    runner.keep(len(b) - 1)
    # One token alone: computed otherwise than inside a chunk, close to it.
    torch.testing.assert_close(runner.forward(b[-1:])[-1], expected, rtol=0, atol=1e-2)
    runner.close()


@needs_llamacpp
def test_llamacpp_engine_answers_in_another_document_as_cold(gguf, prompts):
    head, a, b = prompts
    engine = Engine(gguf, None, stop_token_ids=[])
    engine.generate(GenerationRequest(a, max_new_tokens=4, strategy="ar", slot="a"))
    warm = engine.generate(GenerationRequest(b, max_new_tokens=8, strategy="ar", slot="b"))
    assert warm.stats.reused_shared_tokens == len(head)
    assert warm.stats.prefill_tokens == len(b) - 1 - len(head)
    engine.reset_cache()
    cold = engine.generate(GenerationRequest(b, max_new_tokens=8, strategy="ar", slot="b"))
    assert cold.stats.reused_tokens == 0
    assert warm.tokens == cold.tokens
    engine.close()

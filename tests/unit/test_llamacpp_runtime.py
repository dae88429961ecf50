"""The llama.cpp runtime on a tiny real GGUF file: the runner contract, the engine on it,
loading through `model.runtime`, and the probe. Skipped where llama-cpp-python is absent
(CI installs it)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from quickdraft.decoding import llamacpp
from quickdraft.decoding.costmodel import MEASURED_SIZES
from quickdraft.errors import ModelError
from quickdraft.models import llamacpp_probe
from quickdraft.models.llamacpp import LlamaCppModel

pytestmark = pytest.mark.skipif(
    not llamacpp.available(), reason="llama-cpp-python is not installed (quickdraft[llama])"
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from quickdraft.testing import write_tiny_gguf

    directory = tmp_path_factory.mktemp("gguf")
    target, tokenizer = write_tiny_gguf(directory / "target.gguf", seed=0)
    draft, _ = write_tiny_gguf(directory / "draft.gguf", seed=1, layers=1)
    return directory, target, draft, tokenizer


@pytest.fixture(scope="module")
def model(tiny):
    directory, *_ = tiny
    # Without the extra (AMX/repack) buffers: the probe decides those on real models.
    return LlamaCppModel(directory / "target.gguf", threads=1, extra_bufts=False)


def test_forward_gives_every_position_like_transformers(tiny, model):
    _, reference, _, tokenizer = tiny
    runner = llamacpp.LlamaCppRunner(model, n_ctx=256)
    ids = tokenizer.encode(TEXT)
    logits = runner.forward(ids)
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    assert logits.shape == (len(ids), model.vocab_size) and logits.dtype == torch.float32
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    assert runner.tokens == ids


def test_keep_extend_and_reuse(tiny, model):
    _, _, _, tokenizer = tiny
    runner = llamacpp.LlamaCppRunner(model, n_ctx=256, prefill_chunk=8)
    ids = tokenizer.encode(TEXT)
    whole = runner.forward(ids)
    runner.keep(10)
    assert runner.tokens == ids[:10]
    again = runner.forward(ids[10:14])
    assert torch.allclose(again, whole[10:14], atol=1e-3)
    # extend reuses the longest common prefix and computes only the rest, in chunks.
    runner.reset()
    reused, computed, last = runner.extend(ids[:20])
    assert (reused, computed) == (0, 20) and last is not None
    edited = ids[:15] + tokenizer.encode("x = 1\n")
    reused, computed, _ = runner.extend(edited)
    assert reused == 15 and computed == len(edited) - 15 and runner.tokens == edited
    assert torch.allclose(runner.logits_after(ids[:12]), whole[11], atol=1e-3)


def cancel_in_forward(runner, nth: int, cancel: threading.Event) -> list[int]:
    """Count `runner`'s forwards (their sizes, in the list returned) and set `cancel` as the
    `nth` one starts: llama.cpp then aborts it from its callback."""
    calls: list[int] = []
    original = runner.forward

    def counting(tokens, **kwargs):
        calls.append(len(tokens))
        if len(calls) == nth:
            cancel.set()
        return original(tokens, **kwargs)

    runner.forward = counting
    return calls


def test_cancel_stops_a_prefill_within_the_running_forward(tiny, model, caplog):
    _, _, _, tokenizer = tiny
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8)
    ids = tokenizer.encode(TEXT * 4)
    cancel = threading.Event()
    calls = cancel_in_forward(runner, 2, cancel)  # a newer request, while the second chunk runs
    reused, computed, _ = runner.extend(ids, cancel=cancel)
    # llama.cpp's abort callback stopped the second chunk inside its forward: the cache keeps
    # the first chunk only, and no third chunk started.
    assert calls == [8, 8] and computed == 8 and runner.tokens == ids[:8]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # an abort is no error
    # The cache is still usable: the next extend continues from what it holds.
    reused, computed, _ = runner.extend(ids[:20])
    assert (reused, computed) == (8, 12)


def test_a_cancel_stops_a_decode_step_within_its_forward(tiny, model):
    from quickdraft.decoding import Engine, GenerationRequest

    _, _, _, tokenizer = tiny
    engine = Engine(model, stop_token_ids=[])
    runner = engine.target
    cancel = threading.Event()
    calls = cancel_in_forward(runner, 4, cancel)  # a newer request, while the third step runs
    prompt = tokenizer.encode(TEXT)
    result = engine.generate(
        GenerationRequest(prompt, max_new_tokens=20, strategy="ar", cancel=cancel)
    )
    # The prefill (one forward), two steps, and the third stopped by llama.cpp's abort
    # callback inside its forward: the cache holds the prompt and the two steps' tokens.
    assert calls == [len(prompt) - 1, 1, 1, 1]
    assert result.stop_reason == "cancelled" and len(result.tokens) == 2
    assert result.stats.target_forwards == 2
    assert runner.tokens == prompt + result.tokens[:1]


def test_engine_runs_every_strategy_on_llamacpp(tiny, model):
    from quickdraft.decoding import Engine, GenerationRequest

    directory, _, _, tokenizer = tiny
    draft = LlamaCppModel(directory / "draft.gguf", threads=1, extra_bufts=False)
    engine = Engine(model, draft, stop_token_ids={tokenizer.eos_token_id})
    prompt = tokenizer.encode(TEXT * 2)
    outputs = {}
    for strategy in ("ar", "ngram", "draft", "hybrid"):
        engine.reset_cache()
        result = engine.generate(
            GenerationRequest(prompt, max_new_tokens=12, strategy=strategy, draft_length=3)
        )
        outputs[strategy] = result.tokens
        assert result.stats.new_tokens == len(result.tokens) > 0
        assert result.stats.target_forwards <= len(result.tokens) + 1
    # The n-gram strategy copies the repeated text: fewer target forwards than tokens.
    assert outputs["ar"][:1] == outputs["ngram"][:1]


def test_load_models_with_the_llamacpp_runtime(tiny, tmp_path, monkeypatch):
    from quickdraft.config import ModelConfig, QuickdraftConfig
    from quickdraft.generation import CompletionRequest
    from quickdraft.models.loading import load_models
    from quickdraft.testing import local_completer

    directory, *_ = tiny
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    steps: list[str] = []
    loaded = load_models(
        ModelConfig(
            target=str(directory / "target.gguf"),
            draft=str(directory / "draft.gguf"),
            runtime="llamacpp",
            threads=1,
        ),
        progress=steps.append,
    )
    assert loaded.runtime == "llamacpp" and loaded.dtype == "gguf"
    assert isinstance(loaded.target, LlamaCppModel) and loaded.draft is not None
    assert loaded.family == "qwen2.5-coder" and loaded.stop_token_ids
    assert any("llama.cpp" in step for step in steps)
    info = loaded.describe()
    assert info["runtime"] == "llamacpp" and info["target"]["layers"] == 2
    assert "llama.cpp" in loaded.summary() and "draft.gguf" not in loaded.summary()
    # No weights were converted: the directory next to the GGUF holds a tokenizer only.
    from quickdraft.models import store

    assert not store.has_weights(loaded.target_info.path)
    completer = local_completer(loaded, QuickdraftConfig())
    text = "def add(a, b):\n    return "
    completion = completer.complete(CompletionRequest("file:///t.py", text, 1, 11, "python"))
    assert completion.stats.prefill_tokens > 0 and completion.stop_reason


def test_probe_measures_in_a_child_process_and_caches(tiny, tmp_path):
    directory, *_ = tiny
    path = directory / "target.gguf"
    assert not llamacpp_probe.is_measured(path, 1, context=32, home=tmp_path)
    result = llamacpp_probe.probe(path, 1, context=32, home=tmp_path)
    assert set(result.target_ms) == set(MEASURED_SIZES)  # the one size list
    assert result.prefill_tokens_per_s > 0
    if not result.busy:  # the load's progress then says nothing of measuring
        assert llamacpp_probe.is_measured(path, 1, context=32, home=tmp_path)
        cached = llamacpp_probe.probe(path, 1, context=32, home=tmp_path)
        assert cached.target_ms == result.target_ms
    assert not llamacpp_probe.is_measured(directory / "missing.gguf", 1, home=tmp_path)


def test_every_open_document_keeps_its_sequence(tiny, model):
    """A document may hold three sequences (its own, its prefetch's, its next edit's): a dozen
    documents' worth must not evict each other while the cells have room (they did at 8)."""
    runner = llamacpp.LlamaCppRunner(model, n_ctx=2048, prefill_chunk=8)
    slots = [f"file:///w/{i}.py{kind}" for i in range(10) for kind in ("", "#prefetch", "#edit")]
    assert len(slots) < llamacpp.MAX_SLOTS
    for i, slot in enumerate(slots):
        runner.select(slot)
        runner.extend([5 + i % 50, 7, 11, 13])
    for i, slot in enumerate(slots):
        runner.select(slot)
        assert runner.tokens == [5 + i % 50, 7, 11, 13], slot
        reused, computed, _ = runner.extend([5 + i % 50, 7, 11, 13, 17])
        assert (reused, computed) == (4, 1)


def test_slots_beyond_the_resident_budget_are_parked_and_come_back_warm(model):
    """Other documents' cells slow every forward (its attention spans them): past
    `resident_tokens` the least recently used slot leaves the context for host memory, and
    comes back with its tokens, computing nothing again."""
    a, b, c = list(range(10, 40)), list(range(100, 130)), list(range(200, 230))
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8, resident_tokens=40)
    runner.select("a")
    runner.extend(a)
    expected = runner.forward(b[:3])
    runner.keep(len(a))
    runner.select("b")
    runner.extend(b)
    assert runner.parked_bytes() == 0  # a alone is within the budget
    runner.select("c")
    runner.extend(c)
    # a and b together are past it: a, the least recently used, is parked; its cells are free.
    assert list(runner._slots) == ["b", "c"] and runner.parked_bytes() > 0
    assert runner.slots == ["a", "b", "c"]
    runner.select("a")
    assert runner.tokens == a
    calls = cancel_in_forward(runner, 0, threading.Event())  # counts forwards only
    reused, computed, _ = runner.extend(a)
    assert (reused, computed, calls) == (len(a), 0, [])
    assert list(runner._parked) == ["b"]  # b is parked in turn
    assert list(runner._slots) == ["c", "a"] and runner.slots == ["b", "c", "a"]
    after = runner.forward(b[:3])
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-2)
    assert torch.equal(after.argmax(-1), expected.argmax(-1))
    runner.select("b")
    assert runner.tokens == b and runner.extend(b)[:2] == (len(b), 0)
    runner.select("c")
    assert runner.tokens == c and runner.extend(c)[:2] == (len(c), 0)
    runner.close()


def test_a_slot_sharing_the_prefix_in_use_stays_and_a_repack_keeps_it_shared(model):
    """A document's other slots (its prefetch's) adopt its prefix by reference: only their own
    tails count against `resident_tokens`, and a repack (after a park) puts the slot in use
    back whole first and lets another that shares all but its tail share its prefix again
    (the tail is computed again when that slot is next used)."""
    head = list(range(10, 110))
    main, prefetch, other = head + [5, 6, 7], head + list(range(120, 140)), list(range(150, 200))
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8, resident_tokens=40)
    runner.select("main")
    runner.extend(main)
    runner.select("prefetch")
    assert runner.extend(prefetch)[:2] == (len(head), 20) and runner.last_adopted == len(head)
    runner.select("main")  # the prefetch's 20 own tokens are within the budget: nothing parked
    assert runner.extend(main)[:2] == (len(main), 0)
    assert runner.slots == [None, "prefetch", "main"] and runner.parked_bytes() == 0
    runner.select("other")  # 103 + 120 tokens of other slots: both parked, then a repack
    runner.extend(other)
    assert list(runner._slots) == ["other"] and list(runner._parked) == ["prefetch", "main"]
    runner.select("main")
    assert runner.extend(main)[:2] == (len(main), 0)
    assert list(runner._parked) == ["prefetch", "other"]
    runner.select("prefetch")
    assert runner.extend(prefetch)[:2] == (len(prefetch), 0)
    assert list(runner._slots) == ["main", "prefetch"] and list(runner._parked) == ["other"]
    runner.select("main")  # shares prefetch's cells again, its own 3 tokens dropped
    assert runner.tokens == head and runner.extend(main)[:2] == (len(head), 3)
    runner.close()


def test_a_documents_own_slots_stay_in_the_context(model):
    """A document's next-edit and prefetch slots take turns with its own at every keystroke:
    they are not parked for each other, however many tokens they hold; another document's are."""
    main, edit, other = list(range(10, 110)), list(range(120, 220)), list(range(150, 250))
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8, resident_tokens=40)
    for slot, tokens in (("file:///d.py", main), ("file:///d.py#edit", edit)) * 2:
        runner.select(slot)
        runner.extend(tokens)
    assert runner.parked_bytes() == 0 and runner._parked == {}
    runner.select("file:///e.py")
    runner.extend(other)
    assert list(runner._parked) == ["file:///d.py", "file:///d.py#edit"]
    runner.close()


def test_parked_caches_past_the_memory_budget_are_dropped(model):
    a, b, c = list(range(10, 40)), list(range(100, 130)), list(range(200, 230))
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8, resident_tokens=0)
    runner.select("a")
    runner.extend(a)
    runner.select("b")
    runner.extend(b)
    one = runner.parked_bytes()
    assert one > 0 and runner.slots == ["a", "b"]
    runner.parked_budget = one + one // 2  # room for one parked cache, not two
    runner.select("c")
    runner.extend(c)
    assert runner.slots == ["b", "c"] and 0 < runner.parked_bytes() <= runner.parked_budget
    runner.select("a")  # dropped: it starts empty, and is computed again
    assert runner.tokens == [] and runner.extend(a)[:2] == (0, len(a))
    runner.close()


def test_a_longer_sequence_grows_the_context_and_keeps_the_others(tiny, monkeypatch):
    directory, _, _, tokenizer = tiny
    monkeypatch.setattr(llamacpp, "MIN_CONTEXT", 256)
    small = LlamaCppModel(directory / "target.gguf", threads=1, extra_bufts=False, n_ctx=256)
    runner = llamacpp.LlamaCppRunner(small, prefill_chunk=64, resident_tokens=32)
    assert runner.n_ctx == 256 + 32
    short = tokenizer.encode(TEXT)
    runner.select("short")
    runner.extend(short)
    runner.select("long")
    long = tokenizer.encode(TEXT.upper() * 40)
    assert len(long) > 2 * runner.n_ctx
    reused, computed, last = runner.extend(long)
    assert (reused, computed) == (0, len(long)) and last is not None
    assert runner.n_ctx >= len(long) and runner.tokens == long
    runner.select("short")  # parked while the context grew, and back
    assert runner.tokens == short and runner.extend(short)[:2] == (len(short), 0)
    runner.select("long")
    assert runner.extend(long)[:2] == (len(long), 0)
    # Past what the memory budget would hold (the model's 4,096 trained tokens): a clear error.
    with pytest.raises(ModelError, match="context holds"):
        runner.extend(tokenizer.encode(TEXT * 240))
    runner.close()


def test_a_parked_cache_with_no_room_to_come_back_is_computed_again(tiny, model):
    """llama.cpp may refuse a state (older versions wanted contiguous free cells): the other
    slots are parked to make room, and failing that the slot starts empty."""
    _, _, _, tokenizer = tiny
    a, b, c = (tokenizer.encode(text) for text in (TEXT, TEXT.upper(), TEXT.replace("a", "q")))
    runner = llamacpp.LlamaCppRunner(model, n_ctx=512, prefill_chunk=8, resident_tokens=len(b))
    for slot, tokens in (("a", a), ("b", b), ("c", c)):
        runner.select(slot)
        runner.extend(tokens)
    assert list(runner._parked) == ["a"]

    class Refusing:
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            return getattr(self._lib, name)

        def llama_state_seq_set_data(self, *args):
            return 0

    runner.lib = Refusing(runner.lib)
    runner.select("a")
    assert runner.tokens == [] and list(runner._slots) == ["c", "a"]  # b parked to make room
    assert runner.extend(a)[:2] == (0, len(a))
    runner.close()

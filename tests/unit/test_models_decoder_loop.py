"""The decoder in one loop (`models.decoder_loop`): with torch's operations between the matmuls,
bitwise the model's own forward in every kind of forward the runner makes; with the C glue,
as batch-invariant; out of the way where it must not run."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from quickdraft.decoding.engine import make_runner
from quickdraft.decoding.kv_cache import new_growing_cache
from quickdraft.decoding.runner import ForwardCancelled
from quickdraft.models import decoder_loop, layer_glue
from quickdraft.models.quantize import quantize_model, rowwise_attention
from quickdraft.testing import build_tiny_model

VOCAB = 300


def tiny(arch: str):
    model = build_tiny_model(VOCAB, arch=arch, seed=3, layers=3, hidden=256, heads=8, kv_heads=2)
    return model.to(torch.float32)


def looped_and_own(arch: str):
    """The same int8 model twice: with the loop (torch's operations between the matmuls), and
    running its own (transformers') forward."""
    model = tiny(arch)
    own = quantize_model(copy.deepcopy(model), loop=False)
    looped = quantize_model(model, loop=False)
    assert decoder_loop.install(looped, rowwise_attention, glue=False)
    return looped, own


def count_own_forwards(model, monkeypatch) -> list[int]:
    """Calls of the decoder's own (class) forward, which the loop skips."""
    calls: list[int] = []
    cls = type(model.model)
    own = cls.forward
    monkeypatch.setattr(cls, "forward", lambda *a, **k: calls.append(1) or own(*a, **k))
    return calls


def runner_forwards(model) -> list[torch.Tensor]:
    """What a request makes the runner compute: a cold prefill in chunks, a step, a verify
    chain, a tree and the path kept from it, a step that folds prompt rows, a warm extend."""
    ids = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    runner = make_runner(model)
    runner.prefill_chunk = 64
    out = [runner.extend(ids[:150])[2]]
    out.append(runner.forward(ids[150:151]))
    out.append(runner.forward(ids[151:156]))
    out.append(runner.forward_tree(ids[156:162], [-1, 0, 0, 1, 2, 3]))
    runner.keep_tree_path([1, 3, 5])
    out.append(runner.forward(ids[162:164], prompt=ids[164:167]))
    out.append(runner.extend(ids[:190])[2])
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_loop_gives_the_models_own_outputs_bitwise(arch, monkeypatch):
    looped, own = looped_and_own(arch)
    assert decoder_loop.installed(looped) and not decoder_loop.glued(looped)
    assert not own._quickdraft_int8["decoder_loop"] and not decoder_loop.installed(own)
    expected = runner_forwards(own)
    calls = count_own_forwards(looped, monkeypatch)
    got = runner_forwards(looped)
    assert calls == []  # every forward ran the loop
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)


@pytest.mark.skipif(layer_glue.load()[0] is None, reason="no layer glue kernel here")
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_with_the_glue_forwards_stay_batch_invariant(arch, monkeypatch):
    """The C glue rounds otherwise than torch, so it must serve every forward: a verify and a
    tree forward then give their steps' rows bitwise, and a warm prefill the cold one's."""
    glued = quantize_model(tiny(arch))
    assert glued._quickdraft_int8["decoder_loop"] and decoder_loop.glued(glued)
    calls = count_own_forwards(glued, monkeypatch)
    ids = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(5)).tolist()
    cold = make_runner(glued)
    cold.prefill_chunk = 64
    cold_logits = cold.extend(ids[:150])[2]
    steps = torch.cat([cold.forward([token]) for token in ids[150:156]])
    warm = make_runner(glued)
    warm.prefill_chunk = 64
    warm.extend(ids[:100])
    assert torch.equal(warm.extend(ids[:150])[2], cold_logits)
    assert torch.equal(warm.forward(ids[150:156]), steps)  # a verify chain
    warm.keep(150)
    tree = warm.forward_tree([ids[150], 7, ids[151], 9, ids[152]], [-1, 0, 0, 2, 2])
    assert torch.equal(tree[[0, 2, 4]], steps[:3])  # the path the steps took
    assert calls == []


def test_a_copy_runs_its_own_layers(monkeypatch):
    """The engine deep-copies models (shared heads): the copy's loop walks the copy."""
    looped, _ = looped_and_own("qwen2")
    copied = copy.deepcopy(looped)
    with torch.no_grad():
        copied.model.norm.weight.mul_(2.0)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    calls = count_own_forwards(looped, monkeypatch)
    with torch.inference_mode():
        original = looped(input_ids=ids, cache=new_growing_cache()).logits
        changed = copied(input_ids=ids, cache=new_growing_cache()).logits
    assert calls == []
    assert not torch.equal(original, changed)  # the copy read its own norm


def test_hooks_below_the_layers_get_the_models_own_forward(monkeypatch):
    """A profiler's hooks on the modules it times must see them called: with a hook anywhere
    below the decoder's layers the model runs its own forward (the same outputs)."""
    looped, own = looped_and_own("qwen2")
    calls = count_own_forwards(looped, monkeypatch)
    seen: list[str] = []
    handle = looped.model.layers[1].input_layernorm.register_forward_hook(
        lambda *_: seen.append("norm")
    )
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        hooked = looped(input_ids=ids, cache=new_growing_cache()).logits
        handle.remove()
        plain = looped(input_ids=ids, cache=new_growing_cache()).logits
        own_forwards = len(calls)
        reference = own(input_ids=ids, cache=new_growing_cache()).logits
    assert (seen, own_forwards) == (["norm"], 1)  # then the loop again, once the hook is gone
    assert torch.equal(hooked, reference) and torch.equal(plain, reference)


def test_the_runners_cancel_check_stops_the_loop_part_way():
    """The runner stops a step between layers by a forward pre-hook on each layer: the loop
    calls those hooks, so a cancel set before the step stops it and leaves the cache as it was."""
    runner = make_runner(quantize_model(tiny("qwen2")))  # with the glue where it loads
    ids = list(range(40))
    runner.extend(ids)
    cancel = threading.Event()
    cancel.set()
    with runner.stopping_at(cancel), pytest.raises(ForwardCancelled):
        runner.forward([7])
    assert len(runner.tokens) == 40
    assert runner.cache.get_seq_length() == 40


def test_without_a_cache_the_model_makes_its_own(monkeypatch):
    looped, own = looped_and_own("llama")
    calls = count_own_forwards(looped, monkeypatch)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        got = looped(input_ids=ids).logits
        assert len(calls) == 1
        assert torch.equal(got, own(input_ids=ids).logits)


def test_other_architectures_keep_their_own_forward():
    model = build_tiny_model(VOCAB, arch="starcoder2", seed=0, dtype=torch.float32)
    quantized = quantize_model(model)
    assert not quantized._quickdraft_int8["decoder_loop"]
    assert not decoder_loop.installed(quantized)


def test_compiled_steps_take_the_glue_away_from_the_eager_forwards():
    """A runner compiling steps calls `before_compile` on every module: the compiled steps run
    the model's own forward, so the loop's eager ones must round as torch does too."""
    model = quantize_model(tiny("qwen2"))
    model.model.before_compile()
    assert decoder_loop.installed(model) and not decoder_loop.glued(model)

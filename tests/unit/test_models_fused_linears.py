"""Fused projections (q, k, v; gate, up as one integer matmul): bitwise the unfused model's
logits, fewer integer matmuls a step, and correct for a caller in any order."""

from __future__ import annotations

import copy

import pytest
import torch

from quickdraft.models.fused_linears import FusedLinears, FusedPart
from quickdraft.models.quantize import Int8Linear, exact_int8_backends, quantize_model
from quickdraft.testing import build_tiny_model, forward_batch_and_steps

VOCAB = 300


def int8_pair(arch: str, backend: str | None = None):
    model = build_tiny_model(VOCAB, arch=arch, seed=4, layers=2, hidden=128, dtype=torch.float32)
    # Each runs its layers' own torch operations between the matmuls (the C glue, where it
    # loads, takes fused models only and rounds otherwise: not what is compared here).
    plain = quantize_model(copy.deepcopy(model), fuse=False, backend=backend, loop=False)
    fused = quantize_model(model, backend=backend, loop=False)
    return plain, fused


def count_int8_calls(model) -> list[int]:
    calls = []
    for module in model.modules():
        if isinstance(module, Int8Linear):
            module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fused_model_gives_the_unfused_logits_bitwise_with_fewer_matmuls(arch):
    plain, fused = int8_pair(arch)
    assert plain._quickdraft_int8["fused_groups"] == 0
    assert fused._quickdraft_int8["fused_groups"] == 4  # 2 layers x (qkv, gate/up)
    layer = fused.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, FusedPart)
    assert isinstance(layer.self_attn.fused_q_k_v, FusedLinears)
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(0))
    plain_calls, fused_calls = count_int8_calls(plain), count_int8_calls(fused)
    with torch.inference_mode():
        expected, got = plain(input_ids=ids).logits, fused(input_ids=ids).logits
    assert torch.equal(expected, got)
    # Per layer 7 matmuls become 4 (qkv, o, gate/up, down); the lm_head is one either way.
    assert (len(plain_calls), len(fused_calls)) == (2 * 7 + 1, 2 * 4 + 1)
    # Still batch-invariant: a 6-token verify equals 6 one-token steps, bitwise.
    batch, steps = forward_batch_and_steps(fused, ids, 40, 6)
    assert torch.equal(batch, steps)
    # And a copy (the engine's shared-head paths deep-copy models) is fused on its own.
    copied = copy.deepcopy(fused)
    assert (
        copied.model.layers[0].self_attn.k_proj.group
        is copied.model.layers[0].self_attn.fused_q_k_v
    )
    with torch.inference_mode():
        assert torch.equal(copied(input_ids=ids).logits, expected)


@pytest.mark.parametrize("backend", ["onednn", "onednn7", "int_mm", "float64"])
def test_every_exact_backend_fuses_bitwise(backend):
    if backend not in exact_int8_backends():
        pytest.skip(f"{backend} is not exact on this CPU")
    plain, fused = int8_pair("qwen2", backend)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(plain(input_ids=ids).logits, fused(input_ids=ids).logits)


def test_parts_called_out_of_order_or_alone_are_still_right():
    torch.manual_seed(2)
    linears = [torch.nn.Linear(32, n) for n in (16, 8, 8)]
    parts = [Int8Linear.from_linear(linear) for linear in linears]
    group = FusedLinears(parts)
    fused = [FusedPart(group, i, 32) for i in range(3)]
    x, y = torch.randn(3, 32), torch.randn(3, 32)
    expected_x = [part(x) for part in parts]
    expected_y = [part(y) for part in parts]
    calls = count_int8_calls(group)
    # In order on one input: one matmul, and nothing held afterwards.
    assert all(torch.equal(fused[i](x), expected_x[i]) for i in range(3))
    assert len(calls) == 1 and group._input is None
    # Interleaved inputs, a part asked twice: each answer is its own input's.
    assert torch.equal(fused[1](x), expected_x[1])
    assert torch.equal(fused[0](y), expected_y[0])
    assert torch.equal(fused[1](x), expected_x[1])
    assert torch.equal(fused[1](x), expected_x[1])
    assert torch.equal(fused[2](y), expected_y[2])

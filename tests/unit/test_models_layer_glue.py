"""The C calls between a layer's matmuls (`models.layer_glue`): torch's results within float
rounding, each row computed alone (so forwards stay batch-invariant), clear errors."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from quickdraft.models import layer_glue

glue, why_not = layer_glue.load()
pytestmark = pytest.mark.skipif(glue is None, reason=f"layer glue kernel: {why_not}")


def test_add_rms_norm_adds_in_place_and_normalizes_as_torch_does():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 5, 256, generator=generator) * 3
    delta = torch.randn(1, 5, 256, generator=generator)
    weight = torch.randn(256, generator=generator)
    expected_sum = hidden + delta
    variance = expected_sum.pow(2).mean(-1, keepdim=True)
    expected = weight * (expected_sum * torch.rsqrt(variance + 1e-6))
    got = glue.add_rms_norm(hidden, delta, weight, 1e-6)
    assert torch.equal(hidden, expected_sum)  # the residual stream, updated in place
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # Without a delta the stream is left as it is.
    again = glue.add_rms_norm(hidden, None, weight, 1e-6)
    assert torch.equal(hidden, expected_sum) and torch.equal(again, got)


def test_rotary_rotates_the_heads_it_is_given_as_transformers_does():
    generator = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, rows = 4, 2, 64, 3
    states = torch.randn(1, rows, (heads + 2 * kv_heads) * dim, generator=generator)
    angles = torch.rand(rows, dim // 2, generator=generator) * 6
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    query = states[..., : heads * dim].view(1, rows, heads, dim).transpose(1, 2)
    key = states[..., heads * dim : (heads + kv_heads) * dim]
    key = key.view(1, rows, kv_heads, dim).transpose(1, 2)
    want_query, want_key = apply_rotary_pos_emb(query, key, cos[None], sin[None])
    values = states[..., (heads + kv_heads) * dim :].clone()
    glue.rotary(states, heads, cos, sin)
    glue.rotary(states[..., heads * dim :], kv_heads, cos, sin)
    torch.testing.assert_close(query, want_query, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(key, want_key, rtol=1e-6, atol=1e-6)
    assert torch.equal(states[..., (heads + kv_heads) * dim :], values)  # values untouched


def test_silu_mul_is_torchs_within_rounding():
    gate_up = torch.randn(4, 2 * 96, generator=torch.Generator().manual_seed(2)) * 8
    gate_up[0, 0], gate_up[0, 1] = -200.0, 200.0  # far ends of the exp
    expected = torch.nn.functional.silu(gate_up[:, :96]) * gate_up[:, 96:]
    torch.testing.assert_close(glue.silu_mul(gate_up), expected, rtol=1e-6, atol=1e-6)


def test_each_row_comes_out_the_same_whatever_else_is_in_the_call():
    """What keeps verify forwards bitwise their steps: rows in one call of 40 (the threads'
    share) equal each row alone."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 40, 128, generator=generator)
    delta = torch.randn(1, 40, 128, generator=generator)
    weight = torch.randn(128, generator=generator)
    gate_up = torch.randn(1, 40, 2 * 64, generator=generator)
    angles = torch.rand(40, 32, generator=generator)
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    sin = torch.cat([angles.sin(), angles.sin()], -1)
    states = torch.randn(1, 40, 3 * 64, generator=generator)
    batch_states = states.clone()
    batch_norm = glue.add_rms_norm(hidden.clone(), delta, weight, 1e-5)
    batch_silu = glue.silu_mul(gate_up)
    glue.rotary(batch_states, 3, cos, sin)
    for row in range(40):
        alone = glue.add_rms_norm(
            hidden[:, row : row + 1].clone(), delta[:, row : row + 1], weight, 1e-5
        )
        assert torch.equal(alone, batch_norm[:, row : row + 1])
        assert torch.equal(glue.silu_mul(gate_up[:, row : row + 1]), batch_silu[:, row : row + 1])
        one = states[:, row : row + 1].clone()
        glue.rotary(one, 3, cos[row : row + 1], sin[row : row + 1])
        assert torch.equal(one, batch_states[:, row : row + 1])


def test_shapes_it_does_not_take_are_refused():
    with pytest.raises(ValueError, match="add_rms_norm"):
        glue.add_rms_norm(torch.zeros(1, 2, 40), None, torch.ones(40), 1e-6)
    with pytest.raises(ValueError, match="silu_mul"):
        glue.silu_mul(torch.zeros(2, 2 * 20))
    assert not layer_glue.fits(1536, 24, 8960) and layer_glue.fits(1536, 128, 8960)


def test_tensors_not_laid_out_for_it_are_refused():
    with pytest.raises(ValueError, match="contiguous float32"):
        glue.add_rms_norm(torch.zeros(2, 32).t(), None, torch.ones(2), 1e-6)
    with pytest.raises(ValueError, match="contiguous float32"):
        glue.silu_mul(torch.zeros(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="rotary"):
        glue.rotary(torch.zeros(1, 64, 3).transpose(1, 2), 1, torch.ones(3, 64), torch.ones(3, 64))

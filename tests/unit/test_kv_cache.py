"""The growing KV cache: in place where it may be, the values concatenation gives, and no
write into memory another cache reads."""

from __future__ import annotations

import torch

from quickdraft.decoding.kv_cache import GROWTH, GrowingLayer, new_growing_cache
from quickdraft.decoding.runner import share_dynamic_cache


def _states(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 4, generator=generator), torch.randn(
        1, 2, n, 4, generator=generator
    )


def test_steps_write_in_place_and_hold_what_concatenation_would():
    cache = new_growing_cache()
    keys, values = _states(100, 0)
    cache.update(keys, values, 0)
    layer = cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    buffer = layer.buffers[0]
    assert buffer.shape[-2] == GROWTH
    expected_keys, expected_values = keys, values
    for step in range(1, 40):
        new_keys, new_values = _states(1, step)
        got_keys, got_values = cache.update(new_keys, new_values, 0)
        expected_keys = torch.cat([expected_keys, new_keys], dim=-2)
        expected_values = torch.cat([expected_values, new_values], dim=-2)
        assert torch.equal(got_keys, expected_keys) and torch.equal(got_values, expected_values)
    assert layer.buffers[0] is buffer  # 139 positions: no copy since the first forward
    cache.crop(-30)  # a rejected draft: the next step writes where it stood
    cache.update(*_states(1, 99), 0)
    assert layer.buffers[0] is buffer and layer.get_seq_length() == 110
    # Past the capacity: a larger buffer, the positions carried over.
    held = layer.keys.clone()
    more_keys, more_values = _states(GROWTH, 7)
    got_keys, _ = cache.update(more_keys, more_values, 0)
    assert layer.buffers[0] is not buffer and layer.buffers[0].shape[-2] % GROWTH == 0
    assert torch.equal(got_keys, torch.cat([held, more_keys], dim=-2))


def test_a_prefix_another_cache_adopted_is_never_written_over():
    source = new_growing_cache()
    source.update(*_states(50, 0), 0)
    before = source.layers[0].keys.clone()
    adopted = share_dynamic_cache(source, 40)
    assert adopted is not None
    view = adopted.layers[0].keys
    assert view.data_ptr() == source.layers[0].keys.data_ptr()  # nothing copied
    # The source goes back below what was adopted and writes there: into new buffers.
    source.crop(-20)
    source.update(*_states(5, 1), 0)
    assert torch.equal(adopted.layers[0].keys, before[..., :40, :])
    # The adopting cache's own first write copies the prefix into buffers of its own.
    adopted.update(*_states(3, 2), 0)
    assert adopted.layers[0].keys.data_ptr() != source.layers[0].keys.data_ptr()
    assert torch.equal(adopted.layers[0].keys[..., :40, :], before[..., :40, :])
    assert torch.equal(source.layers[0].keys[..., :30, :], before[..., :30, :])

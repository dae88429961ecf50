"""Decode attention rows in one C call (models/attention_rows.c): each row bitwise the same
alone or in any forward, a tree row the step at the end of its path, close to SDPA, in float32
and (where the CPU has AMX bfloat16 tiles) on the tiles, and SDPA where the kernel cannot be
had."""

from __future__ import annotations

import pytest
import torch

from quickdraft.local_backend import model_fingerprint
from quickdraft.models import attention_rows, native_build, quantize
from quickdraft.models.quantize import _step_rows
from quickdraft.testing import build_tiny_model

KERNEL, WHY_NOT = attention_rows.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"attention rows kernel: {WHY_NOT}")
SHAPES = [(12, 2, 128), (14, 2, 64), (4, 4, 16)]
"""Query heads, key/value heads, head dimension: the 1.5B's, the 0.5B's, plain multi-head."""


def _inputs(heads, kv_heads, dim, cached, rows, seed=0):
    generator = torch.Generator().manual_seed(seed)
    key = torch.randn(1, kv_heads, cached + rows, dim, generator=generator)
    value = torch.randn(1, kv_heads, cached + rows, dim, generator=generator)
    # As transformers hands it over: [b, q, h, d] projected, then transposed.
    query = torch.randn(1, rows, heads, dim, generator=generator).transpose(1, 2)
    return query, key, value


ARITHMETICS = [attention_rows.FLOAT32]
if KERNEL is not None and KERNEL.tiles is not None:
    ARITHMETICS.append(attention_rows.TILES)
CLOSE_TO_SDPA = {attention_rows.FLOAT32: 1e-5, attention_rows.TILES: 3e-2}
"""How close a row comes to SDPA's (float32): float32 sums in another order; or bfloat16
products on the tiles."""


@pytest.fixture(params=ARITHMETICS)
def arithmetic(request, monkeypatch):
    """Each arithmetic this machine has, the float32 rows forced by hiding the tiles."""
    if KERNEL is not None and request.param == attention_rows.FLOAT32:
        monkeypatch.setattr(KERNEL, "tiles", None)
    return request.param


def _rows(query, key, value, starts, extra=None):
    extra = extra or [None] * len(starts)
    scale = query.shape[-1] ** -0.5
    return KERNEL.rows(query, key, value, starts, extra, scale, object())


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
def test_a_row_is_bitwise_the_same_alone_and_in_any_forward(heads, kv_heads, dim, arithmetic):
    # 318-326 keys: on the tiles the first 192 of some rows and 224 of others (their last 96+
    # in float32), in one call.
    cached, n = 317, 9
    query, key, value = _inputs(heads, kv_heads, dim, cached, n)
    ends = [cached + i + 1 for i in range(n)]
    together = _rows(query, key, value, ends)
    assert together.shape == (1, n, heads, dim)
    for i in range(n):
        alone = _rows(query[:, :, i : i + 1], key, value, ends[i : i + 1])
        assert torch.equal(alone[:, 0], together[:, i]), i
    three = _rows(query[:, :, 2:5], key, value, ends[2:5])
    assert torch.equal(three, together[:, 2:5])
    sdpa = _step_rows(query, key, value, [e - 1 for e in ends], query.shape[-1] ** -0.5, None)
    computed = KERNEL.arithmetic(dim)
    assert computed == (arithmetic if dim % attention_rows.TILE_HEAD_DIMS == 0 else "float32")
    tolerance = CLOSE_TO_SDPA[computed]
    torch.testing.assert_close(together, sdpa, rtol=tolerance, atol=tolerance)
    if computed == attention_rows.TILES:  # the tiles ran: not the float32 rows' result
        tiles, KERNEL.tiles = KERNEL.tiles, None
        try:
            assert not torch.equal(_rows(query, key, value, ends), together)
        finally:
            KERNEL.tiles = tiles


@needs_kernel
def test_the_tiles_take_whole_multiples_of_32_dimensions_and_the_float32_rows_the_rest():
    assert KERNEL.arithmetic(24) == KERNEL.arithmetic(16) == attention_rows.FLOAT32
    assert KERNEL.arithmetic(128) == (
        attention_rows.TILES if KERNEL.tiles is not None else attention_rows.FLOAT32
    )


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES[:2])
def test_a_tree_row_is_the_step_at_the_end_of_its_path(heads, kv_heads, dim, arithmetic):
    base = 200
    query, key, value = _inputs(heads, kv_heads, dim, base, 6, seed=1)
    path = torch.tensor([base + 1, base + 3, base + 4])  # nodes 1, 3, 4 of the tree
    tree_row = _rows(query[:, :, :1], key, value, [base], [path])
    laid_out_key, laid_out_value = key.clone(), value.clone()
    laid_out_key[:, :, base : base + 3] = key[:, :, path]
    laid_out_value[:, :, base : base + 3] = value[:, :, path]
    step = _rows(query[:, :, :1], laid_out_key, laid_out_value, [base + 3])
    assert torch.equal(tree_row, step)
    first_branch = _rows(query[:, :, :1], key, value, [base + 2])
    assert not torch.equal(first_branch, tree_row)  # other keys: another result


@needs_kernel
def test_tensors_it_does_not_take_are_left_to_sdpa():
    query, key, value = _inputs(4, 2, 16, 20, 2)
    assert _rows(query.double(), key.double(), value.double(), [21, 22]) is None
    query2 = torch.cat([query, query])
    assert _rows(query2, torch.cat([key, key]), torch.cat([value, value]), [21, 22]) is None
    odd_query, odd_key, odd_value = _inputs(4, 2, 24, 20, 1)  # 24: not whole chunks of 16
    assert _rows(odd_query, odd_key, odd_value, [21]) is None


def test_a_cpu_without_avx512_gets_sdpa(monkeypatch, tmp_path):
    monkeypatch.setattr(attention_rows._KERNEL, "loaded", None)
    monkeypatch.setattr(attention_rows._KERNEL, "why_not", None)
    monkeypatch.setattr(attention_rows, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    kernel, why = attention_rows.load(home=tmp_path)
    assert kernel is None and "avx512f" in why


def test_an_emulated_avx2_cpu_gets_sdpa(monkeypatch, tmp_path):
    monkeypatch.setattr(attention_rows._KERNEL, "loaded", None)
    monkeypatch.setattr(attention_rows._KERNEL, "why_not", None)
    monkeypatch.setattr(attention_rows, "cpu_flags", lambda: frozenset(attention_rows.NEEDED_FLAGS))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    kernel, why = attention_rows.load(home=tmp_path)
    assert kernel is None and why == native_build.capped_below_avx512()


def test_the_kernel_is_built_while_the_model_loads_not_in_its_first_request(monkeypatch):
    monkeypatch.setattr(attention_rows._KERNEL, "loaded", None)
    monkeypatch.setattr(attention_rows._KERNEL, "why_not", None)
    quantize.quantize_model(build_tiny_model(64, seed=1))
    assert attention_rows._KERNEL.loaded is not None or attention_rows._KERNEL.why_not


def test_a_calibration_knows_which_attention_it_measured(monkeypatch):
    # Forward costs measured with SDPA rows are not this kernel's: the model's fingerprint, the
    # calibration cache's key, says which one ran.
    with_kernel = quantize.quantize_model(build_tiny_model(64, seed=1))
    monkeypatch.setattr(attention_rows._KERNEL, "loaded", None)
    monkeypatch.setattr(attention_rows._KERNEL, "why_not", "not on this CPU")
    without = quantize.quantize_model(build_tiny_model(64, seed=1))
    assert without._quickdraft_int8["attention_kernel"] is False
    if KERNEL is not None:
        arithmetic = with_kernel._quickdraft_int8["attention_kernel"]
        assert arithmetic in (attention_rows.TILES, attention_rows.FLOAT32)
        assert model_fingerprint(with_kernel) != model_fingerprint(without)

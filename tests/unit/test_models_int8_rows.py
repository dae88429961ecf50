"""The lean int8 kernel for few rows (models/int8_rows.c): bitwise the general path, used only
where it is, and a clear fallback where it cannot be built."""

from __future__ import annotations

import pytest
import torch

from quickdraft.models import int8_rows, native_build, quantize
from quickdraft.models.quantize import Int8Linear
from quickdraft.testing import build_tiny_model, forward_batch_and_steps

KERNEL, WHY_NOT = int8_rows.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"int8 rows kernel: {WHY_NOT}")
TILES = KERNEL is not None and KERNEL.tiles is not None
needs_tiles = pytest.mark.skipif(not TILES, reason=f"AMX tiles: {WHY_NOT or KERNEL.tiles_note}")
BACKENDS = [b for b in ("onednn", "int_mm") if b in quantize.exact_int8_backends()]


def _layer(k: int, n: int, bias: bool, backend: str, rows: int, seed: int = 0) -> Int8Linear:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
    weight[0] = 127  # a channel at the extreme: 128 * its sum is the largest correction
    scale = torch.rand(n, generator=generator) * 0.01
    bias_values = torch.randn(n, generator=generator) if bias else None
    return Int8Linear(weight, scale, bias_values, backend, rows=rows)


@needs_kernel
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("k", "n", "bias"),
    [(1536, 272, True), (8960, 32, False), (100, 48, True), (64, 16, False), (4, 16, True)],
)
def test_the_kernel_is_bitwise_the_general_path(backend, k, n, bias):
    layer = _layer(k, n, bias, backend, rows=int8_rows.MAX_ROWS, seed=k + n)
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in range(1, int8_rows.MAX_ROWS + 1):
            for magnitude in (1e-3, 1.0, 1e3):
                x = torch.randn(rows, k, generator=generator) * magnitude
                x[0, 0] = 0.0
                x[-1, -1] = -x[-1].abs().max() * 2  # a row whose largest value is negative
                lean = layer.rows_kernel_forward(x, KERNEL)
                assert torch.equal(lean, layer.general_forward(x)), (rows, magnitude)
        zeros = torch.zeros(2, k)  # the row scale clamps to the smallest normal float
        assert torch.equal(layer.rows_kernel_forward(zeros, KERNEL), layer.general_forward(zeros))


@needs_tiles
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("k", "n", "bias"),
    [(1536, 320, True), (8960, 64, False), (128, 96, True), (64, 32, False)],
)
def test_the_tiles_are_bitwise_the_general_path_at_any_rows(backend, k, n, bias):
    # 320 and 64 channels: four channel blocks a pass up to 16 rows; 96 and 32: pairs of row
    # tiles. The row counts cross every tile edge (16, 32) and a prefill chunk's 128.
    layer = _layer(k, n, bias, backend, rows=int8_rows.ANY_ROWS, seed=k + n)
    assert layer.kernel_rows == int8_rows.ANY_ROWS
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for rows in (1, 2, 5, 15, 16, 17, 31, 32, 33, 64, 128):
            for magnitude in (1e-3, 1e3):
                x = torch.randn(rows, k, generator=generator) * magnitude
                x[-1, -1] = -x[-1].abs().max() * 2
                lean = layer.rows_kernel_forward(x, KERNEL)
                assert torch.equal(lean, layer.general_forward(x)), (rows, magnitude)


@needs_tiles
def test_a_layer_the_tiles_take_makes_onednns_copy_only_when_a_call_needs_it():
    if "onednn" not in quantize.exact_int8_backends():
        pytest.skip("no exact oneDNN int8 here")
    tiled = _layer(256, 64, True, "onednn", rows=int8_rows.ANY_ROWS)
    narrow = _layer(256, 64, True, "onednn", rows=4)
    assert tiled._packed is None and narrow._packed is not None
    x = torch.randn(40, 256)
    with torch.inference_mode():
        assert torch.equal(tiled(x), narrow(x))  # 40 rows: the tiles, then oneDNN's
        assert tiled._packed is None
        assert torch.equal(tiled.general_forward(x), narrow(x))
    assert tiled._packed is not None


def test_a_cpu_without_amx_gets_the_vnni_loop_alone(monkeypatch, tmp_path):
    fresh_load(monkeypatch, int8_rows.NEEDED_FLAGS)  # AVX-512 VNNI, no AMX
    needs_compiler()
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is not None and kernel.tiles is None
    assert "lacks amx_tile, amx_int8" in why
    assert kernel.max_rows(2048, 1536) == int8_rows.MAX_ROWS


@needs_kernel
def test_forward_takes_the_kernel_up_to_its_rows_and_the_backend_past_them(monkeypatch):
    layer = _layer(256, 64, True, quantize.exact_int8_backends()[0], rows=2)
    odd = _layer(256, 40, True, quantize.exact_int8_backends()[0], rows=2)
    assert odd.kernel_rows == 0 and odd.weight_blocked is None  # 40 channels: not its layout
    calls = []
    original = int8_rows.RowKernel.call

    def counting(self, function, x, *args):
        calls.append(x.shape[0])
        return original(self, function, x, *args)

    monkeypatch.setattr(int8_rows.RowKernel, "call", counting)
    with torch.inference_mode():
        for rows in (1, 2, 3, 8):
            layer(torch.randn(rows, 256))
            odd(torch.randn(rows, 256))
        layer(torch.randn(1, 1, 256))  # a batch of one sequence: still one row
    assert calls == [1, 2, 1]


@needs_kernel
def test_a_tiny_model_stays_batch_invariant_with_the_kernel():
    model = quantize.quantize_model(build_tiny_model(200, seed=3))
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert sum(m.kernel_rows > 0 for m in linears) >= len(linears) - 1  # the 200-row head: not
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    for k in (2, 7):  # a verify forward the kernel takes whole, and one the backend takes
        batch, steps = forward_batch_and_steps(model, ids, 9, k)
        assert torch.equal(batch, steps), k


def fresh_load(monkeypatch, flags) -> None:
    """`int8_rows.load` as in a new process on a CPU listing `flags` (restored after the test)."""
    monkeypatch.setattr(int8_rows._KERNEL, "loaded", None)
    monkeypatch.setattr(int8_rows._KERNEL, "why_not", None)
    monkeypatch.setattr(int8_rows, "cpu_flags", lambda: frozenset(flags))


def needs_compiler() -> None:
    if native_build.shutil.which("cc") is None and native_build.shutil.which("gcc") is None:
        pytest.skip("no C compiler here")


def test_no_compiler_means_no_kernel_and_the_backend_alone(monkeypatch, tmp_path):
    fresh_load(monkeypatch, int8_rows.NEEDED_FLAGS)
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is None and "no C compiler" in why
    monkeypatch.setattr(quantize, "_FAST_ROWS", {})
    assert quantize.fast_rows("float64") == 0
    layer = _layer(64, 16, False, "float64", rows=None)
    assert layer.kernel_rows == 0 and layer.weight_blocked is None


def test_a_cpu_without_vnni_is_told_apart(monkeypatch, tmp_path):
    fresh_load(monkeypatch, ("avx2", "fma"))
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is None and "avx512_vnni" in why


def test_an_unwritable_cache_means_no_kernel_not_a_crash(monkeypatch, tmp_path):
    fresh_load(monkeypatch, int8_rows.NEEDED_FLAGS)
    needs_compiler()
    (tmp_path / "kernels").write_text("a file where the directory would be\n")
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is None and "could not build it in" in why


def test_an_emulated_avx2_cpu_gets_no_kernel(monkeypatch, tmp_path):
    fresh_load(monkeypatch, int8_rows.NEEDED_FLAGS)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is None and "ATEN_CPU_CAPABILITY=avx2" in why


def test_a_failing_build_says_what_the_compiler_said(monkeypatch, tmp_path):
    fresh_load(monkeypatch, int8_rows.NEEDED_FLAGS)
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(int8_rows, "SOURCE", broken)
    needs_compiler()
    kernel, why = int8_rows.load(home=tmp_path)
    assert kernel is None and "could not build it" in why
    assert not list((tmp_path / "kernels").glob("*.so"))


@needs_kernel
def test_the_onednn_layer_keeps_the_kernel_copy_only_where_the_kernel_runs():
    if "onednn" not in quantize.exact_int8_backends():
        pytest.skip("no exact oneDNN int8 here")
    with_kernel = _layer(128, 16, False, "onednn", rows=2)
    without = _layer(128, 16, False, "onednn", rows=0)
    assert with_kernel.weight_blocked is not None and without.weight_blocked is None
    assert with_kernel.step_weight_bytes == without.step_weight_bytes == 128 * 16 + 16 * 4
    assert with_kernel.weight_q is None and without.weight_q is None
    assert torch.equal(with_kernel.int8_weight(), without.int8_weight())


def test_the_layout_round_trips():
    weight = torch.randint(-127, 128, (48, 20), dtype=torch.int8)
    blocked = int8_rows.block_weights(weight)
    assert blocked.dtype == torch.uint8 and blocked.shape == (3, 5, 16, 4)
    assert int(blocked[1, 2, 3, 1]) == int(weight[16 + 3, 2 * 4 + 1]) + 128
    assert torch.equal(int8_rows.unblock_weights(blocked), weight)


def test_a_build_is_keyed_by_the_headers_its_source_includes(tmp_path):
    """A shared header (models/simd_exp.h) changed must build its includers again: the key's
    bytes hold each header a source includes from beside it; a missing one means no kernel."""
    source = tmp_path / "k.c"
    source.write_text('#include <math.h>\n#include "shared.h"\nint f(void) { return G; }\n')
    (tmp_path / "shared.h").write_text("#define G 1\n")
    before = native_build.source_bytes(source)
    assert before.endswith(b"#define G 1\n")
    (tmp_path / "shared.h").write_text("#define G 2\n")
    assert native_build.source_bytes(source) != before
    assert b"simd_exp.h" in native_build.source_bytes(quantize.attention_rows.SOURCE)
    (tmp_path / "shared.h").unlink()
    needs_compiler()
    flags = frozenset(("avx512f",))
    with pytest.raises(native_build.Unavailable, match="could not read its source"):
        native_build.build_and_load(source, ("f",), needed=(), flags=flags, home=tmp_path)

"""The measured CPU compute path (cpu_kernels) and runtime choice (runtime): the rules, the
cache, and a real measurement on this machine's CPU."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from quickdraft.machine import cpu_model
from quickdraft.models import cpu_kernels
from quickdraft.models.cpu_kernels import LayerShape, decide, score
from quickdraft.models.runtime import ModelShape, choose_runtime, torch_cost_estimate

FP32 = {"1": 10.0, "8": 40.0, "128": 200.0}


def times(scale: float) -> dict[str, float]:
    return {rows: ms * scale for rows, ms in FP32.items()}


def test_exact_int8_wins_when_it_is_not_slower():
    dtype, backend, reason = decide({"float32": FP32, "int8/onednn": times(0.4)})
    assert (dtype, backend) == ("int8", "onednn") and "onednn" in reason


def test_avx2_like_machine_never_picks_a_slow_integer_path():
    # The Zen 3 figures of issue 10: _int_mm 20-30x slower than float32, 7-bit oneDNN slower.
    timings = {
        "float32": FP32,
        "int8/onednn7": times(1.3),
        "int8/int_mm": {"1": 250.0},  # cut short: over 4x float32
    }
    dtype, backend, reason = decide(timings)
    assert (dtype, backend) == ("float32", None)
    assert "onednn7" in reason and "float32" in reason


def test_native_bfloat16_when_faster_and_no_exact_int8_is():
    dtype, _, reason = decide({"float32": FP32, "bfloat16": times(0.5), "int8/int_mm": times(2)})
    assert dtype == "bfloat16" and "bfloat16" in reason
    assert decide({"float32": FP32, "bfloat16": times(1.5)})[0] == "float32"


def test_a_candidate_cut_short_scores_infinitely_slow():
    assert score({"1": 1.0}) == float("inf")
    assert score(FP32) == pytest.approx(10 + 40 + 25)


def test_choice_is_cached_per_machine_and_not_when_busy(tmp_path, monkeypatch):
    config = SimpleNamespace(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )
    calls = []

    def measure(shape, threads, **_):
        calls.append(shape)
        return {"float32": FP32, "int8/onednn": times(0.5)}, busy

    monkeypatch.setattr(cpu_kernels, "measure", measure)
    busy = True
    first = cpu_kernels.choose(config, 2, home=tmp_path)
    assert first.busy and not first.cached and not list((tmp_path / "kernels").glob("*"))
    busy = False
    second = cpu_kernels.choose(config, 2, home=tmp_path)
    third = cpu_kernels.choose(config, 2, home=tmp_path)
    assert len(calls) == 2 and not second.cached and third.cached
    assert third.label == "int8/onednn" and third.timings_ms["float32"] == FP32
    saved = json.loads(next((tmp_path / "kernels").glob("*.json")).read_text())
    assert saved["dtype"] == "int8" and saved["cpu"] == cpu_model()
    # Another thread count (or CPU, or torch version) is another key: measured again.
    cpu_kernels.choose(config, 1, home=tmp_path)
    assert len(calls) == 3


def test_real_measurement_on_this_cpu_is_consistent(tmp_path):
    """A tiny layer measured for real: the candidates are float32 and the integer backends
    that are exact on this CPU (an AVX2-only CPU: 7-bit oneDNN, never 8-bit), each has its rows
    or was cut short for being over 4x float32, the choice is one of them and is no slower than
    float32, and nothing is cached when told not to."""
    from quickdraft.models.quantize import exact_int8_backends

    config = SimpleNamespace(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2
    )
    choice = cpu_kernels.choose(config, 1, home=tmp_path, use_cache=False)
    timings = choice.timings_ms
    exact = [f"int8/{backend}" for backend in exact_int8_backends()]
    assert "float32" in timings and set(timings) - {"float32", "bfloat16"} <= set(exact)
    assert set(timings["float32"]) == {"1", "8", "128"}
    for name, rows in timings.items():
        assert list(rows) == ["1", "8", "128"][: len(rows)] and rows, name
        if len(rows) < 3:  # cut short: its last size was over 4x float32's
            last = list(rows)[-1]
            assert rows[last] > 4 * timings["float32"][last], name
    assert choice.label in timings and choice.dtype in ("int8", "bfloat16", "float32")
    assert score(timings[choice.label]) <= score(timings["float32"])
    assert choice.cpu == cpu_model() and not choice.cached
    assert not (tmp_path / "kernels").exists()


def test_busy_is_judged_over_the_whole_measurement(monkeypatch):
    """/proc/stat counts 10 ms ticks: judged per few-millisecond timing, one tick of a
    background daemon reads as a busy machine, and the choice would never be cached. The
    share is taken once, over the whole measurement."""
    entered = []

    class Load:
        share = 0.05  # other processes' share of the CPUs over the block

        def __enter__(self):
            entered.append(self)
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(cpu_kernels, "OtherLoad", Load)
    shape = LayerShape.of(
        SimpleNamespace(
            hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
        )
    )
    timings, busy = cpu_kernels.measure(shape, 1, names=["float32", "int8/float64"])
    assert set(timings) == {"float32", "int8/float64"} and len(entered) == 1 and not busy
    Load.share = 0.5
    assert cpu_kernels.measure(shape, 1, names=["float32"])[1]


def test_torch_estimate_scales_a_layer_to_the_model():
    """Qwen2.5-Coder-1.5B's shape (28 layers, a 151936 x 1536 lm_head: about 4.99 layers'
    worth of linear weights) from one layer measured at 10/40/200 ms for 1/8/128 rows: the
    expected step costs, written out."""
    kernel = cpu_kernels.KernelChoice("float32", None, "", timings_ms={"float32": FP32})
    shape = ModelShape(1536, 8960, 12, 2, 28, 151936)
    costs = torch_cost_estimate(kernel, shape)
    # 1 row: 28 layers x 10 ms x 1.15 (the layer overhead) + the head, 4.99 x 10 ms = 371.9;
    # 2, 4, 16 and 32 rows are interpolated between the measured 1, 8 and 128.
    expected = {1: 371.874, 2: 531.248, 4: 849.998, 8: 1487.496, 16: 1884.161, 32: 2677.492}
    assert costs.target_ms == pytest.approx(expected, abs=0.01)
    # A 128-token prefill chunk: 28 x 200 ms x 1.15 + the head for its last row only.
    assert costs.prefill_tokens_per_s == pytest.approx(19.723, abs=0.001)
    assert costs.measured is False and "float32" in costs.notes["source"]


def fake_probe(ms: float):
    from quickdraft.models.llamacpp_probe import ProbeResult

    return ProbeResult(
        extra_bufts=False,
        target_ms={n: ms * (1 + 0.2 * (n - 1)) for n in (1, 2, 4, 8, 16)},
        prefill_tokens_per_s=100.0,
        context=256,
        threads=2,
        load_seconds=0.1,
    )


@pytest.mark.parametrize(("llama_ms", "expected"), [(50.0, "llamacpp"), (5000.0, "torch")])
def test_auto_runtime_takes_the_faster_measured_runtime(tmp_path, monkeypatch, llama_ms, expected):
    from quickdraft.decoding import llamacpp
    from quickdraft.models import llamacpp_probe

    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp_probe, "probe", lambda *a, **k: fake_probe(llama_ms))
    kernel = cpu_kernels.KernelChoice("float32", None, "", timings_ms={"float32": FP32})
    shape = ModelShape(1536, 8960, 12, 2, 28, 151936)
    gguf = tmp_path / "m.gguf"
    choice = choose_runtime(
        "auto",
        device_type="cpu",
        gguf=gguf,
        shape=lambda: shape,
        threads=2,
        kernel=lambda: kernel,
        home=tmp_path,
    )
    assert choice.runtime == expected
    assert set(choice.estimates_ms) == {"llamacpp", "torch"} and "llama.cpp" in choice.reason


def test_auto_runtime_falls_back_to_torch_with_its_reason(tmp_path, monkeypatch):
    from quickdraft.decoding import llamacpp
    from quickdraft.errors import ModelError
    from quickdraft.models import llamacpp_probe

    def unused():
        raise AssertionError("not needed")

    args = dict(shape=unused, threads=2, kernel=unused, home=tmp_path)
    assert "cuda" in choose_runtime("auto", device_type="cuda", gguf=None, **args).reason
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    no_llama = choose_runtime("auto", device_type="cpu", gguf=tmp_path / "m.gguf", **args)
    assert no_llama.runtime == "torch" and "quickdraft[llama]" in no_llama.reason
    with pytest.raises(ModelError, match=r"pip install 'quickdraft\[llama\]'"):
        choose_runtime("llamacpp", device_type="cpu", gguf=tmp_path / "m.gguf", **args)
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    no_gguf = choose_runtime("auto", device_type="cpu", gguf=None, **args)
    assert no_gguf.runtime == "torch" and no_gguf.gguf_missing and not no_gguf.llamacpp_missing

    def crashing(*a, **k):
        raise ModelError("llama.cpp cannot run m.gguf here: crashed (signal 11)")

    monkeypatch.setattr(llamacpp_probe, "probe", crashing)
    failed = choose_runtime("auto", device_type="cpu", gguf=tmp_path / "m.gguf", **args)
    assert failed.runtime == "torch" and "signal 11" in failed.reason


def test_once_the_budget_is_spent_int8_backends_still_get_their_one_row_time(monkeypatch):
    """On one AVX-512 EPYC oneDNN's int8 took seconds per layer: it spent the budget, and
    `torch._int_mm` after it was never timed, so a forced `dtype: int8` took the hopeless
    oneDNN. Past the budget each int8 backend is still timed at one row, and the forced choice
    takes the fastest of those."""
    from quickdraft.models.torch_loading import best_int8_backend

    asked = {}

    def fake_candidate(name, shape, generator, timings, rows=cpu_kernels.ROWS):
        asked[name] = rows
        return {"float32": FP32, "int8/onednn": {"1": 4300.0}}.get(name, {"1": 12.0})

    monkeypatch.setattr(cpu_kernels, "_measure_candidate", fake_candidate)
    shape = LayerShape(64, 128, 32)
    names = ["float32", "bfloat16", "int8/onednn", "int8/int_mm"]
    timings, _ = cpu_kernels.measure(shape, 1, names=names, budget_s=-1.0)  # spent at once
    assert asked["float32"] == cpu_kernels.ROWS and "bfloat16" not in asked
    assert asked["int8/onednn"] == asked["int8/int_mm"] == (1,)
    kernel = cpu_kernels.KernelChoice("float32", None, "", timings_ms=timings)
    assert best_int8_backend(kernel) == "int_mm"


def test_a_hopeless_candidate_is_not_timed_three_times():
    calls = []

    class Slow(torch.nn.Module):
        in_features = 8

        def forward(self, x):
            calls.append(x.shape[0])
            return x

    ms = cpu_kernels._time_layer([Slow()], 1, 8, torch.float32, 3, give_up_ms=0.0)
    assert len(calls) == 2 and ms >= 0  # the warm-up and one timed pass


def test_a_user_torch_serves_slowly_is_told_how_llama_cpp_would_run():
    """Where torch runs float32 (no fast exact int8) because llama.cpp is not installed, or
    because the preset's GGUF files were removed (fetched before llama.cpp was installed), the
    loader says what to do; where int8 runs, or llama.cpp was measured, it says nothing."""
    from quickdraft.models.cpu_kernels import KernelChoice
    from quickdraft.models.loading import llamacpp_hint
    from quickdraft.models.presets import get_preset
    from quickdraft.models.runtime import RuntimeChoice

    float32 = KernelChoice("float32", None, "exact int8 is 20x slower here")
    int8 = KernelChoice("int8", "onednn", "exact int8 scored best")
    preset = get_preset("qwen2.5-coder-1.5b")
    removed = RuntimeChoice("torch", "no GGUF", gguf_missing=True)
    hint = llamacpp_hint(removed, float32, preset)
    assert "`quickdraft models fetch qwen2.5-coder-1.5b`" in hint and "float32" in hint
    missing = llamacpp_hint(RuntimeChoice("torch", "", llamacpp_missing=True), float32, preset)
    assert "llama.cpp is not installed" in missing
    assert llamacpp_hint(removed, int8, preset) is None
    assert llamacpp_hint(removed, float32, None) is None  # not a preset: nothing to fetch
    assert llamacpp_hint(RuntimeChoice("torch", "measured: torch is faster"), float32) is None

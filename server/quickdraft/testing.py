"""Tiny random-init models and a byte-level tokenizer, for fast tests with no downloads.

Tests (and the e2e servers they start) need a real Hugging Face model directory that loads
through the same code as a real model. `save_tiny_pair` writes a target and a draft directory
with a shared tokenizer that knows the Qwen2.5-Coder FIM tokens, so the whole pipeline
(prompt building, FIM template, stop tokens) runs exactly as with the real pair.

Models default to float64: the engine's greedy identity with plain decoding is exact in float64,
whereas float32 kernels may reorder sums between a 1-token and a k-token forward and flip an
argmax on a near tie of random logits (real models have far fewer near ties; see README).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFWriter
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedTokenizerFast

from quickdraft.models.cpu_kernels import score
from quickdraft.models.loading import LoadedModels
from quickdraft.models.quantize import quantize_model

# The Qwen2.5-Coder special tokens, so the `qwen2.5-coder` FIM template works on tiny models.
TINY_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<|im_start|>",
    "<|im_end|>",
]


TINY_MERGE = ("Ā", "ā")
"""The byte-level symbols of the bytes 0x00 and 0x01."""


def build_tiny_tokenizer():
    """A byte-level BPE tokenizer: 256 byte tokens, one merge that ordinary text never uses,
    and the special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    # One merge, of the bytes 0x00 and 0x01 (no text the tests use holds them): GGUF readers
    # (llama.cpp, transformers) refuse a BPE vocabulary without merges.
    vocab[TINY_MERGE[0] + TINY_MERGE[1]] = len(vocab)
    core = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[TINY_MERGE]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens({"additional_special_tokens": TINY_SPECIAL_TOKENS})
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.pad_token = "<|fim_pad|>"
    return tokenizer


def build_tiny_model(
    vocab_size: int,
    *,
    arch: str = "qwen2",
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    dtype: torch.dtype = torch.float64,
    eos_token_id: int | None = None,
):
    """A randomly initialised causal LM of a real architecture (qwen2, llama, starcoder2)."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
    )
    config = AutoConfig.for_model(arch, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Random init gives nearly uniform logits; widen them so greedy decoding has clear winners
    # and sampling tests see a distribution with real structure.
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model.to(dtype).eval()


def build_tiny_int8_model(vocab_size: int, *, seed: int = 0, layers: int = 3):
    """A tiny qwen2 model in quickdraft's exact int8 with row-wise attention
    (`models.quantize.quantize_model`): the runner's exact paths (trees, part-way stops) run on
    it."""
    shape = dict(dtype=torch.float32, hidden=256, heads=8, kv_heads=2)
    return quantize_model(build_tiny_model(vocab_size, seed=seed, layers=layers, **shape))


def save_tiny_pair(
    directory: str | Path,
    *,
    arch: str = "qwen2",
    target_seed: int = 0,
    draft_seed: int = 1,
    dtype: torch.dtype = torch.float64,
) -> tuple[Path, Path]:
    """Write `directory/target` and `directory/draft`: two tiny models sharing one tokenizer."""
    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    paths = []
    for name, seed, layers in (("target", target_seed, 2), ("draft", draft_seed, 1)):
        path = directory / name
        model = build_tiny_model(
            len(tokenizer), arch=arch, seed=seed, layers=layers, dtype=dtype, eos_token_id=eos
        )
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


def build_tiny_loaded_models():
    """What `quickdraft.models.load_models` returns, for tiny in-memory models (no files)."""
    tokenizer = build_tiny_tokenizer()
    vocab = len(tokenizer)
    stops = {
        tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>")
    }
    return LoadedModels(
        target=build_tiny_model(vocab, seed=0),
        draft=build_tiny_model(vocab, seed=1, layers=1),
        tokenizer=tokenizer,
        family="qwen2.5-coder",
        stop_token_ids=stops,
        preset=None,
        device=torch.device("cpu"),
        dtype="float64",
        shared_vocab_size=vocab,
        runtime_reason="tiny test models",
    )


def forward_batch_and_steps(model, ids: torch.Tensor, n: int, k: int):
    """Logits of tokens n..n+k-1 of `ids` (shape (1, >= n+k)) on top of a cache holding the
    first n: computed in one k-token forward, then again as k one-token steps. Returns
    (batch, steps), each (k, V); a batch-invariant model gives them bitwise equal."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :n], cache=cache)
        batch = model(input_ids=ids[:, n : n + k], cache=cache).logits[0]
        cache.crop(-k)
        steps = torch.stack(
            [model(input_ids=ids[:, n + i : n + i + 1], cache=cache).logits[0, 0] for i in range(k)]
        )
    return batch, steps


def ngram_source_tokens(index, source: str) -> list[int] | None:
    """The tokens an n-gram index holds for `source` (None when it has no such source)."""
    tokens = index._tokens.get(source)
    return None if tokens is None else list(tokens)


def write_tiny_gguf(path: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64):
    """A real GGUF file (qwen2 architecture, F32 tensors, GPT-2 style tokenizer metadata)."""
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
    writer.add_token_merges([" ".join(TINY_MERGE)])
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


def local_completer(models: LoadedModels, config=None):
    """A Completer over models already loaded (the tests build theirs; `backends.load_completer`
    loads them from the settings)."""
    from quickdraft.completer import Completer
    from quickdraft.local_backend import LocalBackend

    return Completer(LocalBackend(models, config), config)


def int8_unusable_reason(loaded: Any) -> str | None:
    """Why the forced int8 path cannot be tested here: on one AMD EPYC with AVX-512 (Zen 4
    class) oneDNN's int8 took over 4 s for one layer's linears at one row, so the kernel
    measurement cut it short (over 4x float32) and these tests ran past any timeout. The
    server never picks such a path (`dtype: auto` takes the fastest measured)."""
    backend = getattr(loaded.target, "_quickdraft_int8", {}).get("backend")
    kernel = loaded.kernel
    if backend is None or kernel is None:
        return None
    timings = kernel.timings_ms.get(f"int8/{backend}")
    if timings is None or score(timings) != float("inf"):
        return None
    one_row = timings.get("1")
    return (
        f"exact int8 ({backend}) is unusable on this CPU ({one_row} ms for one layer's linears"
        " at one row, over 4x float32): the int8 identity tests need a CPU where it runs"
    )

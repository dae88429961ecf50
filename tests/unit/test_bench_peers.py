"""Peers: transformers' own speculative modes on tiny models, llama.cpp with a stand-in module."""

from __future__ import annotations

import sys
import types

import pytest

from quickdraft.bench.peers import HFPeer, LlamaCppPeer, emit
from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    target = build_tiny_model(len(tokenizer), seed=0, layers=2, eos_token_id=eos)
    draft = build_tiny_model(len(tokenizer), seed=1, layers=1, eos_token_id=eos)
    prompt = tokenizer.encode("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return")
    engine = Engine(target, draft, stop_token_ids={eos})
    ar = engine.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=16, strategy="ar"))
    return types.SimpleNamespace(
        tokenizer=tokenizer, eos=eos, target=target, draft=draft, prompt=prompt, ar=ar.tokens
    )


def test_emit_follows_the_engine_rule():
    assert emit([5, 6, 0, 7], frozenset({0}), 10, None) == [5, 6]
    assert emit([5, 6, 7, 8], frozenset({0}), 3, None) == [5, 6, 7]
    assert emit([5, 6, 7, 8], frozenset(), 10, lambda new: new[-1] == 6) == [5, 6]


@pytest.mark.parametrize("name", ["hf-assisted", "hf-prompt-lookup"])
def test_transformers_peers_match_plain_greedy_decoding(tiny, name):
    peer = HFPeer(
        name, tiny.target, tiny.draft if name == "hf-assisted" else None, pad_token_id=tiny.eos
    )
    assert peer.unavailable() is None
    out = peer.run(tiny.prompt, 16, frozenset({tiny.eos}), None)
    assert out.tokens == tiny.ar
    assert out.target_forwards >= 1
    assert out.prefill_ms is not None and out.decode_ms is not None
    assert out.latency_ms >= out.prefill_ms
    # The server's stop rule ends the peer exactly where it ends the engine.
    stopped = peer.run(tiny.prompt, 16, frozenset({tiny.eos}), lambda new: len(new) >= 5)
    assert stopped.tokens == tiny.ar[:5]


def test_assisted_needs_a_draft_and_describes_its_settings(tiny):
    assert "draft" in HFPeer("hf-assisted", tiny.target, None).unavailable()
    described = HFPeer("hf-assisted", tiny.target, tiny.draft).describe()
    assert described["num_assistant_tokens"] == 20
    assert HFPeer("hf-prompt-lookup", tiny.target).describe() == {"prompt_lookup_num_tokens": 10}


def test_llama_cpp_is_optional(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr("quickdraft.bench.peers.llama_cpp_available", lambda: False)
    assert "not installed" in LlamaCppPeer("llama-cpp", tmp_path / "m.gguf").unavailable()
    monkeypatch.setattr("quickdraft.bench.peers.llama_cpp_available", lambda: True)
    assert ".gguf" in LlamaCppPeer("llama-cpp", None).unavailable()
    assert ".gguf" in LlamaCppPeer("llama-cpp", tmp_path / "model").unavailable()
    assert "does not exist" in LlamaCppPeer("llama-cpp", tmp_path / "m.gguf").unavailable()


def test_llama_cpp_peer_runs_greedy_with_prompt_lookup(tmp_path, monkeypatch):
    made = {}

    class FakeLlama:
        def __init__(self, **kwargs):
            made.update(kwargs)
            self.resets = 0

        def reset(self):
            self.resets += 1

        def generate(self, tokens, **kwargs):
            assert kwargs["temp"] == 0.0 and kwargs["top_k"] == 1
            yield from [11, 12, 13, 14, 0, 15]

    class FakeLookup:
        def __init__(self, num_pred_tokens):
            self.num_pred_tokens = num_pred_tokens

    llama_cpp = types.ModuleType("llama_cpp")
    llama_cpp.Llama = FakeLlama
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = FakeLookup
    monkeypatch.setitem(sys.modules, "llama_cpp", llama_cpp)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    monkeypatch.setattr("quickdraft.bench.peers.llama_cpp_available", lambda: True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    peer = LlamaCppPeer("llama-cpp-lookup", gguf)
    assert peer.unavailable() is None
    out = peer.run([1, 2, 3], 10, frozenset({0}), None)
    assert out.tokens == [11, 12, 13, 14]
    assert made["logits_all"] is True and made["draft_model"].num_pred_tokens == 10
    assert peer.run([1, 2, 3], 2, frozenset({0}), None).tokens == [11, 12]
    assert peer.run([1, 2, 3], 10, frozenset({0}), lambda new: 12 in new).tokens == [11, 12]
    assert out.target_forwards is None

"""Peers: transformers' own speculative modes on tiny models, llama.cpp with a stand-in module."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from quickdraft.bench.peers import HFPeer, LlamaCppPeer, PeerCrashed, emit, probe_extra_bufts
from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.models.llamacpp_probe import ProbeResult
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


FAKE_LLAMA = """
import json, os, signal

class _Params:
    use_extra_bufts = True

def llama_model_default_params():
    return _Params()

class Llama:
    def __init__(self, **kwargs):
        kwargs["use_extra_bufts"] = llama_model_default_params().use_extra_bufts
        draft = kwargs.pop("draft_model", None)
        kwargs["num_pred_tokens"] = getattr(draft, "num_pred_tokens", None)
        with open(os.environ["FAKE_LLAMA_MADE"], "w") as f:
            json.dump(kwargs, f)

    def reset(self):
        pass

    def generate(self, tokens, **kwargs):
        assert kwargs["temp"] == 0.0 and kwargs["top_k"] == 1
        for token in [11, 12, 13, 14, 0, 15]:
            if os.environ.get("FAKE_LLAMA_CRASH") and token == 12:
                os.kill(os.getpid(), signal.SIGSEGV)
            yield token
"""
FAKE_SPECULATIVE = """
class LlamaPromptLookupDecoding:
    def __init__(self, num_pred_tokens):
        self.num_pred_tokens = num_pred_tokens
"""


def fake_llama_peer(tmp_path, monkeypatch, name, *, crash=False, buffers=(True, "ran")):
    """A LlamaCppPeer whose child process imports a stand-in for llama_cpp."""
    package = tmp_path / "fake" / "fake_llama"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_LLAMA)
    (package / "llama_speculative.py").write_text(FAKE_SPECULATIVE)
    monkeypatch.setattr("quickdraft.bench.peers.llama_cpp_available", lambda: True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), *sys.path]),
        "FAKE_LLAMA_MADE": str(tmp_path / "made.json"),
    }
    if crash:
        env["FAKE_LLAMA_CRASH"] = "1"
    child = (sys.executable, "-m", "quickdraft.bench.llamacpp_peer_child")
    return LlamaCppPeer(
        name,
        gguf,
        threads=2,
        extra_bufts=lambda path, threads: buffers,
        child=(*child, "--llama-module", "fake_llama"),
        child_env=env,
    )


def test_llama_cpp_peer_runs_greedy_with_prompt_lookup_in_a_child(tmp_path, monkeypatch):
    peer = fake_llama_peer(tmp_path, monkeypatch, "llama-cpp-lookup")
    try:
        assert peer.unavailable() is None
        out = peer.run([1, 2, 3], 10, frozenset({0}), None)
        assert out.tokens == [11, 12, 13, 14]
        made = json.loads((tmp_path / "made.json").read_text())
        assert made["logits_all"] is True and made["num_pred_tokens"] == 10
        assert made["n_threads"] == 2 and made["use_extra_bufts"] is True
        # One child serves every hole; the budget and the server's stop rule end it where
        # they end the engine.
        assert peer.run([1, 2, 3], 2, frozenset({0}), None).tokens == [11, 12]
        assert peer.run([1, 2, 3], 10, frozenset({0}), lambda new: 12 in new).tokens == [11, 12]
        assert peer.run([1, 2, 3], 1, frozenset({0}), None).tokens == [11]
        assert out.target_forwards is None
        assert peer.note() is None
    finally:
        peer.close()


def test_llama_cpp_peer_loads_without_extra_buffers_where_the_probe_says_so(tmp_path, monkeypatch):
    reason = "without llama.cpp's extra (AMX) buffers: they crashed in the probe"
    peer = fake_llama_peer(tmp_path, monkeypatch, "llama-cpp", buffers=(False, reason))
    try:
        assert peer.unavailable() is None
        assert peer.run([1, 2], 3, frozenset({0}), None).tokens == [11, 12, 13]
        made = json.loads((tmp_path / "made.json").read_text())
        assert made["use_extra_bufts"] is False and made["num_pred_tokens"] is None
        assert peer.describe()["extra_buffers"] is False
        assert reason in peer.note()
    finally:
        peer.close()


def test_a_crashing_llama_cpp_peer_raises_and_can_start_again(tmp_path, monkeypatch):
    peer = fake_llama_peer(tmp_path, monkeypatch, "llama-cpp", crash=True)
    try:
        with pytest.raises(PeerCrashed, match="signal 11"):
            peer.run([1, 2], 5, frozenset({0}), None)
        with pytest.raises(PeerCrashed, match="signal 11"):  # a fresh child, the same fate
            peer.run([1, 2], 5, frozenset({0}), None)
    finally:
        peer.close()


def test_the_probe_decides_the_peers_buffers(tmp_path, monkeypatch):
    crashed = ProbeResult(
        extra_bufts=False,
        target_ms={1: 1.0},
        prefill_tokens_per_s=1.0,
        context=256,
        threads=2,
        load_seconds=0.1,
        crashed_with_extra_bufts=True,
    )
    monkeypatch.setattr("quickdraft.models.llamacpp_probe.probe", lambda path, threads: crashed)
    on, why = probe_extra_bufts(tmp_path / "m.gguf", 2)
    assert on is False and "crashed" in why
    crashed.extra_bufts = True
    assert probe_extra_bufts(tmp_path / "m.gguf", 2)[0] is True

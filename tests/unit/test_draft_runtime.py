"""The draft on its cheapest runtime: the choice from the two step costs, and a torch target
verifying a llama.cpp draft's tokens (they exchange only token ids)."""

from __future__ import annotations

import os

import pytest

from quickdraft.decoding import Engine, GenerationRequest, llamacpp
from quickdraft.errors import ModelError
from quickdraft.models import draft_runtime
from quickdraft.models.draft_runtime import choose_draft_runtime
from quickdraft.models.llamacpp_probe import ProbeResult

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def probe_stepping(ms: float, extra_bufts: bool = True):
    return ProbeResult(
        extra_bufts=extra_bufts,
        target_ms={1: ms, 2: ms},
        prefill_tokens_per_s=100.0,
        context=256,
        threads=2,
        load_seconds=0.1,
    )


@pytest.fixture
def probed(monkeypatch):
    """llama.cpp's probe answers with the step set here; the calls are counted."""
    state = {"ms": 48.4, "calls": 0, "extra_bufts": False}

    def probe(path, threads, **_):
        state["calls"] += 1
        if state["ms"] is None:
            raise ModelError("llama.cpp cannot run draft.gguf here")
        return probe_stepping(state["ms"], state["extra_bufts"])

    monkeypatch.setattr(draft_runtime.llamacpp_probe, "probe", probe)
    return state


class Timer:
    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.ms


def test_a_torch_target_takes_the_llamacpp_draft_where_it_steps_cheaper(probed):
    # The AMX Xeon's figures: torch int8 71.4 ms, llama.cpp Q4 48.4 ms.
    timer = Timer(71.4)
    choice = choose_draft_runtime("torch", gguf="draft.gguf", threads=2, torch_ms=timer)
    assert choice.runtime == "llamacpp" and timer.calls == 1
    assert choice.step_ms == {"llamacpp": 48.4, "torch": 71.4}
    assert choice.extra_bufts is False  # the probe's finding goes with it
    assert "48.4" in choice.reason and "71.4" in choice.reason


def test_the_target_runtime_keeps_the_draft_unless_the_other_is_clearly_cheaper(probed):
    probed["ms"] = 68.0  # within the margin of torch's 71.4: noise decides nothing
    assert (
        choose_draft_runtime("torch", gguf="d.gguf", threads=2, torch_ms=Timer(71.4)).runtime
        == "torch"
    )
    probed["ms"] = 90.0
    assert (
        choose_draft_runtime("torch", gguf="d.gguf", threads=2, torch_ms=Timer(71.4)).runtime
        == "torch"
    )


def test_a_llamacpp_target_never_loads_a_torch_draft_that_cannot_win(probed):
    # AVX2 with llama.cpp: torch's linears alone are estimated slower, so it is not loaded.
    timer = Timer(10.0)
    choice = choose_draft_runtime(
        "llamacpp", gguf="d.gguf", threads=2, torch_ms=timer, torch_estimate_ms=lambda: 60.0
    )
    assert choice.runtime == "llamacpp" and timer.calls == 0
    assert choice.step_ms == {"llamacpp": 48.4, "torch": 60.0}
    # No estimate at all: not loaded either.
    choice = choose_draft_runtime(
        "llamacpp", gguf="d.gguf", threads=2, torch_ms=timer, torch_estimate_ms=lambda: None
    )
    assert choice.runtime == "llamacpp" and timer.calls == 0
    # An estimate that might win: torch is loaded and timed, and taken when it does win.
    choice = choose_draft_runtime(
        "llamacpp", gguf="d.gguf", threads=2, torch_ms=timer, torch_estimate_ms=lambda: 9.0
    )
    assert choice.runtime == "torch" and timer.calls == 1


def test_without_a_gguf_or_a_working_llamacpp_the_draft_stays(probed):
    assert (
        choose_draft_runtime("torch", gguf=None, threads=2, torch_ms=Timer(70)).runtime == "torch"
    )
    assert probed["calls"] == 0
    probed["ms"] = None
    choice = choose_draft_runtime("torch", gguf="d.gguf", threads=2, torch_ms=Timer(70))
    assert choice.runtime == "torch" and "cannot run" in choice.reason
    with pytest.raises(ModelError):  # a llama.cpp target whose draft cannot run: say so
        choose_draft_runtime("llamacpp", gguf="d.gguf", threads=2, torch_ms=None)


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def test_a_torch_target_verifies_a_llamacpp_drafts_tokens(tmp_path):
    from quickdraft.models.llamacpp import LlamaCppModel
    from quickdraft.testing import write_tiny_gguf

    target, tokenizer = write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    write_tiny_gguf(tmp_path / "draft.gguf", seed=0)  # the same weights: its drafts are right
    draft = LlamaCppModel(tmp_path / "draft.gguf", threads=1, extra_bufts=False)
    engine = Engine(target, draft, stop_token_ids={tokenizer.eos_token_id})
    prompt = tokenizer.encode("def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n" * 2)
    outputs = {}
    for strategy in ("ar", "draft"):
        engine.reset_cache()
        result = engine.generate(
            GenerationRequest(prompt, max_new_tokens=12, strategy=strategy, draft_length=3)
        )
        outputs[strategy] = result
    drafted = outputs["draft"].stats
    assert drafted.drafted_by_source.get("draft", 0) > 0
    assert drafted.accepted_by_source.get("draft", 0) > 0
    assert drafted.target_forwards < outputs["ar"].stats.target_forwards
    assert outputs["draft"].tokens == outputs["ar"].tokens
    draft.close()


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
def test_load_models_puts_the_draft_where_it_steps_cheaper(tmp_path, monkeypatch, probed):
    from quickdraft.completer import Completer, CompletionRequest
    from quickdraft.config import ModelConfig, QuickdraftConfig
    from quickdraft.local_backend import LocalBackend
    from quickdraft.models import loading
    from quickdraft.models.llamacpp import LlamaCppModel
    from quickdraft.models.runtime import RuntimeChoice
    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, layers=1)
    monkeypatch.setenv("QUICKDRAFT_HOME", str(tmp_path / "home"))
    # The target on torch (as on an AMX Xeon), whatever this machine would pick.
    monkeypatch.setattr(
        loading, "choose_runtime", lambda *a, **k: RuntimeChoice("torch", "torch int8 won")
    )
    probed["ms"] = 0.001  # llama.cpp steps the draft faster than any torch step
    loaded = loading.load_models(
        ModelConfig(
            target=str(tmp_path / "target.gguf"), draft=str(tmp_path / "draft.gguf"), threads=1
        )
    )
    assert isinstance(loaded.draft, LlamaCppModel) and not isinstance(loaded.target, LlamaCppModel)
    assert loaded.draft_runtime.runtime == "llamacpp" and loaded.runtime == "torch"
    assert " on llama.cpp (torch " in loaded.summary()
    described = loaded.describe()
    assert described["draft"]["runtime"] == "llamacpp"
    assert described["draft_runtime"]["step_ms"]["llamacpp"] == 0.001
    completer = Completer(LocalBackend(loaded, QuickdraftConfig()), QuickdraftConfig())
    text = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return "
    completion = completer.complete(CompletionRequest("file:///t.py", text, 4, 11, "python"))
    assert completion.stats.prefill_tokens > 0
    # A draft that steps slower on llama.cpp stays on torch, the target's runtime.
    probed["ms"] = 1e6
    again = loading.load_models(
        ModelConfig(
            target=str(tmp_path / "target.gguf"), draft=str(tmp_path / "draft.gguf"), threads=1
        )
    )
    assert not isinstance(again.draft, LlamaCppModel) and again.draft_runtime.runtime == "torch"
    loaded.draft.close()

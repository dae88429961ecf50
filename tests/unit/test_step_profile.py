"""Where a decode step goes: the parts add up to the step, the weight bytes are what a step
reads, the floor is those bytes over the bandwidth."""

from __future__ import annotations

import pytest
import torch

from quickdraft.decoding.runner import ModelRunner
from quickdraft.models import step_profile
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(len(build_tiny_tokenizer()), seed=3, layers=2)


def test_the_parts_of_a_step_add_up_and_each_is_timed(model):
    runner = ModelRunner(model)
    profile = step_profile.profile_step(
        runner, model, bandwidth_gbs=10.0, weight_bytes=10_000_000, context_tokens=16, repeats=2
    )
    parts = profile.parts_ms
    assert tuple(parts) == step_profile.CATEGORIES
    assert sum(parts.values()) == pytest.approx(profile.profiled_step_ms)
    assert parts["linears"] > 0 and parts["attention"] > 0 and parts["lm_head"] > 0
    assert parts["norms/rotary"] > 0 and all(v >= 0 for v in parts.values())
    assert profile.floor_ms == pytest.approx(1.0)  # 10 MB at 10 GB/s
    assert runner.tokens == []  # the cache is left empty
    # The hooks are gone: a forward afterwards runs none of them.
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_weight_bytes_count_the_embedding_only_when_the_head_reads_it():
    tied = build_tiny_model(300, seed=1, layers=1)
    embedding = tied.get_input_embeddings().weight
    every = sum(p.numel() * p.element_size() for p in tied.parameters())
    every += sum(b.numel() * b.element_size() for b in tied.buffers())
    if tied.get_output_embeddings().weight is embedding:
        assert step_profile.torch_weight_bytes(tied) == every
    else:
        assert (
            step_profile.torch_weight_bytes(tied)
            == every - embedding.numel() * embedding.element_size()
        )
    untied = build_tiny_model(300, seed=1, layers=1)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    table = untied.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in untied.parameters())
    total += sum(b.numel() * b.element_size() for b in untied.buffers())
    assert step_profile.torch_weight_bytes(untied) == total - table.numel() * table.element_size()


def test_gguf_weight_bytes(tmp_path):
    from gguf import GGUFReader

    from quickdraft.testing import write_tiny_gguf

    write_tiny_gguf(tmp_path / "m.gguf", seed=0)
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(tmp_path / "m.gguf")).tensors}
    expected = sum(tensors.values())
    if "output.weight" in tensors:
        expected -= tensors["token_embd.weight"]
    assert step_profile.gguf_weight_bytes(tmp_path / "m.gguf") == expected


def test_bandwidth_is_measured():
    assert step_profile.read_bandwidth_gbs(repeats=1) > 0.1


@pytest.mark.parametrize("backend", ["onednn", "int_mm"])
def test_weight_bytes_of_int8_count_each_weight_byte_once_packed_or_not(backend):
    """oneDNN's prepacked weights are neither parameters nor buffers (the profile read 3.6 MiB
    for the 1.5B's step), and the lean kernel's copy is another (int8_rows): fused or not, with
    one copy or two, an int8 model reads one byte per weight."""
    from quickdraft.models.quantize import exact_int8_backends, quantize_model

    if backend not in exact_int8_backends():
        pytest.skip(f"{backend} is not exact on this CPU")
    model = build_tiny_model(300, seed=1, layers=2, dtype=torch.float32)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = sum(m.in_features * m.out_features for m in linears)
    quantize_model(model, backend=backend)
    floats = sum(
        t.numel() * t.element_size()
        for name, t in (*model.named_parameters(), *model.named_buffers())
        if t.dtype not in (torch.int8, torch.uint8) and "embed_tokens" not in name
    )
    assert step_profile.torch_weight_bytes(model) == weights + floats

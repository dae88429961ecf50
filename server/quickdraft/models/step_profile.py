"""Where one decode step goes, against the floor the machine's memory sets.

A decode step reads every weight once (the embedding table aside: one row), so its floor is

    floor = weight bytes read per step / the machine's read bandwidth

and a step far above it pays for something else: fixed costs per kernel, per layer and per
token (dispatch, Python frames, small kernels that never reach the bandwidth). For a torch
model one step is split by module, timed with forward hooks around each (inclusive wall time;
CPU kernels are synchronous):

    linears          the projections of every layer (q, k, v, o; gate, up, down)
    attention        the attention modules less their projections (scores, softmax, cache)
    lm_head          the output projection over the vocabulary
    norms/rotary     RMSNorm and the rotary embedding
    python/dispatch  the step's time that no module above accounts for (the decoder loop,
                     the model's glue, the runner)

The hooks cost a little time of their own, which lands in python/dispatch, so the profiled
step is reported beside the unhooked one. A model whose decoder runs in one loop
(`decoder_loop`) runs its own forward while hooked, so the profiled step's python/dispatch
also holds the frames the loop saves the unhooked step. llama.cpp runs its graph in C: only its whole step
is timed, and its weight bytes come from the GGUF's tensors.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader

from quickdraft.decoding.runner import Runner, synchronize

BANDWIDTH_BYTES = 1 << 30
"""What the bandwidth measurement reads: far larger than any cache."""
ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
CATEGORIES = ("linears", "attention", "lm_head", "norms/rotary", "python/dispatch")


def read_bandwidth_gbs(repeats: int = 3) -> float:
    """The machine's read bandwidth (GB/s, 1e9 bytes): the best of `repeats` sums over a
    1 GiB float32 buffer with torch's threads (a sum reads each byte once and computes little)."""
    buffer = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    buffer.sum()  # the pages are touched before timing
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    del buffer
    return BANDWIDTH_BYTES / best / 1e9


def torch_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer once, the input
    embedding's table not (one row), unless the lm_head shares it (then it is read whole), and
    an int8 linear's weights once, whichever of its copies the step reads."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    skip = set()
    if embedding is not None and not (
        head is not None and getattr(head, "weight", None) is getattr(embedding, "weight", 0)
    ):
        skip = {id(t) for t in (*embedding.parameters(), *embedding.buffers())}
    # An int8 linear may hold its weights twice (oneDNN's opaque prepacked copy, neither
    # parameter nor buffer; the lean kernel's layout; the plain one): a step reads one.
    total = 0
    for module in model.modules():
        read = getattr(module, "step_weight_bytes", None)
        if read is not None:
            total += read
            skip |= {id(t) for t in module.buffers(recurse=False)}
    seen: set[int] = set()
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) in seen or id(tensor) in skip or tensor.is_meta:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of weights one decode step reads from a GGUF: every tensor, the token embedding
    only when no separate output tensor exists (the head reads it whole)."""
    reader = GGUFReader(str(path))
    names = {tensor.name: int(tensor.n_bytes) for tensor in reader.tensors}
    total = sum(names.values())
    if "output.weight" in names:
        total -= names.get("token_embd.weight", 0)
    return total


def _category(name: str, module: torch.nn.Module, head: torch.nn.Module | None) -> str | None:
    if module is head:
        return "lm_head"
    last = name.rsplit(".", 1)[-1]
    if last in ATTENTION_LINEARS:
        return "attention_linears"  # timed apart: attention's own time includes them
    if last in MLP_LINEARS:
        return "linears"
    kind = type(module).__name__
    if kind.endswith("Attention"):
        return "attention"
    if kind.endswith("RMSNorm") or kind.endswith("RotaryEmbedding"):
        return "norms/rotary"
    return None


@dataclass
class StepProfile:
    step_ms: float
    """One decode step, unhooked (best of the repeats)."""
    weight_bytes: int
    bandwidth_gbs: float
    parts_ms: dict[str, float] = field(default_factory=dict)
    """Category -> ms of one step (torch only; empty for llama.cpp)."""
    profiled_step_ms: float | None = None
    """The hooked step the parts add up to."""

    @property
    def floor_ms(self) -> float:
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1000

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_ms": round(self.step_ms, 2),
            "weight_bytes": self.weight_bytes,
            "bandwidth_gbs": round(self.bandwidth_gbs, 2),
            "floor_ms": round(self.floor_ms, 4),
            "step_over_floor": round(self.step_ms / self.floor_ms, 2),
            "parts_ms": {k: round(v, 2) for k, v in self.parts_ms.items()},
            "profiled_step_ms": None
            if self.profiled_step_ms is None
            else round(self.profiled_step_ms, 2),
        }


def _timed_steps(runner: Runner, context: list[int], token: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        runner.keep(len(context))
        synchronize(runner.device)
        started = time.perf_counter()
        runner.forward([token])
        synchronize(runner.device)
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


def profile_step(
    runner: Runner,
    model: Any,
    *,
    bandwidth_gbs: float,
    weight_bytes: int,
    context_tokens: int = 256,
    repeats: int = 5,
) -> StepProfile:
    """Profile one decode step of `runner` (over `model`) on a `context_tokens` context; the
    runner's cache is left empty."""
    high = max(2, min(runner.vocab_size, 30000))
    ids = torch.randint(1, high, (context_tokens + 1,), generator=torch.Generator().manual_seed(0))
    context, token = ids[:-1].tolist(), int(ids[-1])
    runner.reset()
    runner.extend(context)
    step = _timed_steps(runner, context, token, repeats + 1)
    parts: dict[str, float] = {}
    profiled = None
    if isinstance(model, torch.nn.Module):
        parts, profiled = _hooked_step(runner, model, context, token, repeats)
    runner.reset()
    return StepProfile(step, weight_bytes, bandwidth_gbs, parts, profiled)


def _hooked_step(
    runner: Runner, model: torch.nn.Module, context: list[int], token: int, repeats: int
) -> tuple[dict[str, float], float]:
    """The best of `repeats` hooked steps, split by CATEGORIES (ms)."""
    head = model.get_output_embeddings()
    spent: dict[str, float] = defaultdict(float)
    starts: dict[int, float] = {}
    handles = []

    def before(module, args, key: int) -> None:
        starts[key] = time.perf_counter()

    def after(module, args, output, key: int, category: str) -> None:
        spent[category] += (time.perf_counter() - starts.pop(key)) * 1000

    categorized = {}
    for name, module in model.named_modules():
        category = _category(name, module, head)
        if category is not None:
            categorized[id(module)] = (module, category)
    for key, (module, category) in categorized.items():
        handles.append(module.register_forward_pre_hook(lambda m, a, key=key: before(m, a, key)))
        handles.append(
            module.register_forward_hook(
                lambda m, a, o, key=key, category=category: after(m, a, o, key, category)
            )
        )
    best: tuple[float, dict[str, float]] | None = None
    try:
        for _ in range(repeats):
            spent.clear()
            total = _timed_steps(runner, context, token, 1)
            if best is None or total < best[0]:
                best = (total, dict(spent))
    finally:
        for handle in handles:
            handle.remove()
    assert best is not None
    total, raw = best
    inside_attention = raw.get("attention_linears", 0.0)  # q, k, v, o: inside attention's time
    parts = dict.fromkeys(CATEGORIES, 0.0)
    parts["linears"] = raw.get("linears", 0.0) + inside_attention
    parts["attention"] = max(0.0, raw.get("attention", 0.0) - inside_attention)
    parts["lm_head"] = raw.get("lm_head", 0.0)
    parts["norms/rotary"] = raw.get("norms/rotary", 0.0)
    parts["python/dispatch"] = max(0.0, total - sum(parts.values()))
    return parts, total

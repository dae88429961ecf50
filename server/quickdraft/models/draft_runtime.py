"""Which runtime runs the draft model: the one where its step is cheaper, whatever the target's.

Draft and target exchange only token ids (the engine verifies the draft's tokens with the
target's logits), so they need not share a runtime. The draft's step is what decides whether
drafting pays: on a 2-core Sapphire Rapids torch int8 stepped the 0.5B draft in 71.4 ms (24
layers of small kernels, each with fixed overhead) and llama.cpp's Q4 GGUF in 48.4 ms, while
the 1.5B target was fastest on torch (exact int8, cheap wide forwards).

So at load, with `model.runtime: auto` on a CPU, a draft that has a GGUF file is measured on
both runtimes and kept on the cheaper one:

    llama.cpp   its probe (models/llamacpp_probe.py, in a child process, cached per machine):
                a one-token forward over a 256-token context
    torch       the loaded draft itself, timed over a few one-token steps on the probe's
                context when it is loaded; when the target runs on llama.cpp, first an
                estimate from the kernel measurement (one layer's linears, a lower bound):
                if even that is slower, the torch draft is never loaded

A draft that runs on another runtime than the target is reported in the load summary.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from quickdraft.decoding.costmodel import BUSY_SHARE
from quickdraft.decoding.runner import ModelRunner, synchronize
from quickdraft.errors import ModelError
from quickdraft.machine import OtherLoad
from quickdraft.models import llamacpp_probe

log = logging.getLogger(__name__)

MARGIN = 0.9
"""The other runtime must step the draft in at most this share of the time to be taken:
below it, the measurements' noise decides nothing."""
STEP_CONTEXT = llamacpp_probe.PROBE_CONTEXT
"""The torch draft is timed on the context llama.cpp's probe uses."""
STEP_REPEATS = 4


@dataclass
class DraftRuntime:
    runtime: str
    """"torch" or "llamacpp"."""
    reason: str
    step_ms: dict[str, float] = field(default_factory=dict)
    """Runtime -> one draft step (ms), as measured (or estimated, which `reason` says)."""
    extra_bufts: bool = True
    """For llama.cpp: whether its extra buffers work here (the probe's finding)."""


def torch_step_ms(model: torch.nn.Module, vocab_size: int) -> float:
    """One decode step of a loaded torch model, best of STEP_REPEATS on a short context."""
    runner = ModelRunner(model)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(
        1, max(2, min(vocab_size, 30000)), (STEP_CONTEXT + 1,), generator=generator
    )
    ids = tokens.tolist()
    device = next(model.parameters()).device
    runner.extend(ids[:STEP_CONTEXT])
    best = float("inf")
    with OtherLoad() as load:
        for _ in range(STEP_REPEATS + 1):
            runner.keep(STEP_CONTEXT)
            synchronize(device)
            started = time.perf_counter()
            runner.forward(ids[STEP_CONTEXT:])
            synchronize(device)
            best = min(best, (time.perf_counter() - started) * 1000)
    runner.reset_all()
    if load.share is not None and load.share > BUSY_SHARE:
        log.info(
            "the torch draft's step was timed on a busy machine (%.0f %% load)", 100 * load.share
        )
    return best


def choose_draft_runtime(
    target_runtime: str,
    *,
    gguf: Any,
    threads: int,
    torch_ms: Callable[[], float] | None,
    torch_estimate_ms: Callable[[], float | None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DraftRuntime:
    """Where the draft runs: `target_runtime` unless the other runtime steps it in at most
    MARGIN of the time. `gguf`: the draft's GGUF file (None: llama.cpp cannot run it).
    `torch_ms`: times the torch draft (None: it cannot be had); `torch_estimate_ms`: a lower
    bound for it that costs no loading, asked first when the target is on llama.cpp."""
    if gguf is None:
        return DraftRuntime(target_runtime, "the draft has no GGUF file for llama.cpp")
    if progress is not None and not llamacpp_probe.is_measured(gguf, threads):
        progress("measuring the draft's step on llama.cpp (once per machine)")
    try:
        probe = llamacpp_probe.probe(gguf, threads)
    except ModelError as exc:
        if target_runtime == "llamacpp":
            raise
        return DraftRuntime("torch", f"llama.cpp cannot run the draft here ({exc})")
    llama = probe.target_ms[1]
    steps = {"llamacpp": llama}
    if target_runtime == "llamacpp":
        estimate = torch_estimate_ms() if torch_estimate_ms is not None else None
        if estimate is None:  # timing torch would mean converting and loading the draft
            return DraftRuntime(
                "llamacpp",
                f"the draft steps in {llama:.1f} ms on llama.cpp; torch's step has no estimate"
                " here without loading it",
                steps,
                probe.extra_bufts,
            )
        if estimate >= MARGIN * llama:
            steps["torch"] = estimate
            return DraftRuntime(
                "llamacpp",
                f"the draft steps in {llama:.1f} ms on llama.cpp; torch's linears alone are "
                f"estimated at {estimate:.1f} ms",
                steps,
                probe.extra_bufts,
            )
    if torch_ms is None:
        return DraftRuntime(
            target_runtime, "the torch draft cannot be had", steps, probe.extra_bufts
        )
    if progress is not None:
        progress("measuring the draft's step on torch")
    steps["torch"] = torch_ms()
    other = "torch" if target_runtime == "llamacpp" else "llamacpp"
    winner = other if steps[other] <= MARGIN * steps[target_runtime] else target_runtime
    return DraftRuntime(
        winner,
        f"the draft steps in {steps['llamacpp']:.1f} ms on llama.cpp and {steps['torch']:.1f} ms "
        f"on torch (measured)",
        steps,
        probe.extra_bufts,
    )

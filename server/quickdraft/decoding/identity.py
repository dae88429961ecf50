"""Greedy identity with plain decoding, measured on one engine (one runtime, dtype and cache).

The engine promises that the greedy output of every strategy equals `ar`'s. Where the target's
forward is batch-invariant (a k-token verify forward gives bitwise the logits of k one-token
steps, and a prefill gives the same rows however it was chunked), that holds by construction.
On other paths it holds until a last-bit difference flips a near tie. `measure_identity`
counts both: the tokens (every strategy and draft length against `ar`, warm against cold) and
the logits behind them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quickdraft.decoding.engine import Engine, GenerationRequest


@dataclass
class Tally:
    same: int = 0
    runs: int = 0

    def add(self, same: bool) -> None:
        self.same += int(same)
        self.runs += 1

    @property
    def rate(self) -> float | None:
        return self.same / self.runs if self.runs else None

    def to_dict(self) -> dict[str, Any]:
        rate = self.rate
        return {
            "same": self.same,
            "runs": self.runs,
            "rate": None if rate is None else round(rate, 4),
        }


def case_name(strategy: str, draft_length: int | None) -> str:
    return strategy if draft_length is None else f"{strategy} k={draft_length}"


def _greedy(engine: Engine, prompt: Sequence[int], strategy: str, k: int | None, n: int):
    request = GenerationRequest(list(prompt), max_new_tokens=n, strategy=strategy, draft_length=k)
    return engine.generate(request).tokens


def measure_identity(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    *,
    strategies: Sequence[str] = ("ngram", "draft", "hybrid"),
    draft_lengths: Sequence[int | None] = (None, 4),
    max_new_tokens: int = 32,
    verify_tokens: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Per prompt (each at least 2 tokens), from a cold cache unless said otherwise:

    * `cases`: every strategy at every draft length (None: adaptive) against `ar`;
    * `warm_equals_cold`: `ar` after a request on the prompt cut at a random point (the cache
      reuses that prefix and prefills the rest in other chunks) against cold `ar`;
    * `after_completion`: the prompt cut there, followed by what `ar` wrote there and by the
      rest of the prompt (the next request once a completion was accepted), warm against cold;
    * `verify_logits`: one forward of the last prompt token and `verify_tokens` tokens of `ar`'s
      output against as many one-token steps, bitwise; `prefill_logits`: the logits after the
      prompt, prefilled warm (from the cut) against cold, bitwise; `max_abs_diff` over both.

    Strategies the engine cannot run (`draft` without a draft model) are left out.
    """
    rng = random.Random(seed)
    usable = [s for s in strategies if s != "draft" or engine.drafter is not None]
    cases = {case_name(s, k): Tally() for s in usable for k in draft_lengths}
    warm, after, verify, prefill = Tally(), Tally(), Tally(), Tally()
    max_diff = 0.0
    for prompt in prompts:
        prompt = [int(t) for t in prompt]
        engine.reset_cache()
        expected = _greedy(engine, prompt, "ar", None, max_new_tokens)
        for strategy in usable:
            for k in draft_lengths:
                engine.reset_cache()
                got = _greedy(engine, prompt, strategy, k, max_new_tokens)
                cases[case_name(strategy, k)].add(got == expected)

        cut = rng.randint(1, len(prompt) - 1)
        engine.reset_cache()
        written = _greedy(engine, prompt[:cut], "ar", None, 8)
        warm.add(_greedy(engine, prompt, "ar", None, max_new_tokens) == expected)
        follow = prompt[:cut] + written + prompt[cut:]
        engine.reset_cache()
        cold_follow = _greedy(engine, follow, "ar", None, max_new_tokens)
        engine.reset_cache()
        _greedy(engine, prompt[:cut], "ar", None, 8)
        after.add(_greedy(engine, follow, "ar", None, max_new_tokens) == cold_follow)

        same, diff = _verify_against_steps(engine, prompt, expected[:verify_tokens])
        verify.add(same)
        max_diff = max(max_diff, diff)
        same, diff = _warm_against_cold_prefill(engine, prompt, cut)
        prefill.add(same)
        max_diff = max(max_diff, diff)
    engine.reset_cache()
    total = Tally(sum(t.same for t in cases.values()), sum(t.runs for t in cases.values()))
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "identical_to_ar": total.to_dict(),
        "cases": {name: tally.to_dict() for name, tally in cases.items()},
        "warm_equals_cold": warm.to_dict(),
        "after_completion": after.to_dict(),
        "verify_logits": verify.to_dict(),
        "prefill_logits": prefill.to_dict(),
        "max_abs_diff": max_diff,
    }


def _difference(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    if torch.equal(a, b):
        return True, 0.0
    return False, float((a.float() - b.float()).abs().max())


def _verify_against_steps(
    engine: Engine, prompt: list[int], continuation: list[int]
) -> tuple[bool, float]:
    runner = engine.target
    tokens = [prompt[-1], *continuation]
    runner.reset()
    runner.extend(prompt[:-1])
    batch = runner.forward(tokens)
    runner.keep(len(prompt) - 1)
    steps = torch.cat([runner.forward([token]) for token in tokens])
    runner.reset()
    return _difference(batch, steps)


def _warm_against_cold_prefill(engine: Engine, prompt: list[int], cut: int) -> tuple[bool, float]:
    runner = engine.target
    runner.reset()
    _, _, cold = runner.extend(prompt)
    runner.reset()
    runner.extend(prompt[:cut])
    _, _, warm = runner.extend(prompt)
    runner.reset()
    assert cold is not None and warm is not None
    return _difference(cold, warm)

"""What a speculative step costs on this hardware, and which step to take.

Speculation pays only when verifying k drafts costs about as much as producing one token. How
close a machine comes depends on its runtime and kernels (a GPU, llama.cpp or exact int8 on a
CPU come close; stock float32 on a 2-core CPU does not: docs/performance.md has the figures). So
instead of a fixed schedule, the engine measures the target's forward time for 1, 2, 4, 8, 16,
32 new tokens and the draft model's time per token, and before every step picks the drafter and
draft length k that maximise expected tokens per second:

    with per-token acceptance a, k drafts yield E[tokens] = (1 - a^(k+1)) / (1 - a)
    at a cost of T_target(k + 1) + k * T_draft  (T_draft = 0 for n-gram and copy drafts)

and plain decoding (k = 0) is always a candidate, so the choice is never slower than `ar` by
more than the estimation error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from quickdraft.decoding.runner import PREFILL_CHUNK, Runner, synchronize
from quickdraft.machine import OtherLoad

MEASURED_SIZES = (1, 2, 4, 8, 16, 32)
"""The forward sizes (new tokens) whose cost is measured: by the calibration, by llama.cpp's
probe (models/llamacpp_probe.py), and estimated for torch (models/runtime.py)."""
CALIBRATION_FORMAT = 3
"""Part of the calibration cache's key: raised when the figures a calibration keeps change
meaning (2: sizes made monotone from the largest down, `fill_sizes`; 3: the sizes timed in
turns), so older files are measured again."""
MEASUREMENT_ORDER = (1, 8, *(n for n in MEASURED_SIZES if n not in (1, 8)))
"""The order the calibration measures them in, most needed first (a decode step, a typical
verify), so a budget that runs out leaves the least needed to be filled in."""
TREE_SIZES = (32, 16, 8)
"""Tree verify forwards tried, largest first (`CostModel.tree_tokens`); each is measured."""
TREE_MAX_STEPS = 1.5
"""A tree forward may cost at most this many one-token steps (`CostModel.tree_tokens`); within
that, each step's tree keeps the nodes its measured odds and the measured forward costs pay for
(`tree.worth_its_cost`). A fixed bound alone decided badly: on 2 AMX cores trees of 8 took
the decode of 12 held-out holes (openai-agents 0.24.0, `ngram`) from 21.4 s as chains to
19.1 s (in another run, 18.6 s against 20.9 s for trees of 16), yet one calibration timed 8
tokens at 1.27 steps, and a bound of 1.2 then kept every request to chains
(docs/performance.md)."""
PREFILL_CHUNKS = (PREFILL_CHUNK, 2 * PREFILL_CHUNK, 4 * PREFILL_CHUNK)
"""Prefill chunk sizes a torch runner on a CPU may take (`prefill_chunk_for`)."""
MAX_PREFILL_CHUNK_S = 2.5
"""The longest a request's prefill chunk may be expected to take at the measured prefill speed.
A prefill chunk runs whole, even once a newer request stops its job (its work is the prefix
the next request reuses: runner.stopping_at), so the newer request waits for it; a chunk is
kept short where prefill is slow. Where it is fast, a longer chunk reads the weights fewer
times: on 2 AMX cores (torch int8) 1,408 tokens prefilled at 261 tokens/s in chunks of 128,
284 in 256 and 312 in 512, the same bits; and the typing bench (4 held-out holes,
openai-agents 0.24.0, a keystroke every 120 ms) answered cold requests 12-26 % sooner with
512 (chunks of about 1.7 s) with as many keystrokes answered (docs/performance.md). Warm-ups,
which any request may stop, keep PREFILL_CHUNK (`Engine.warm`)."""
BUSY_SHARE = 0.2
"""Measurements during which other processes used more than this share of the CPUs are not
taken as this machine's truth (not cached)."""


def prefill_chunk_for(tokens_per_s: float) -> int:
    """The largest of PREFILL_CHUNKS expected to take at most MAX_PREFILL_CHUNK_S at
    `tokens_per_s` (measured with chunks of PREFILL_CHUNK: a larger chunk is faster than that,
    so the estimate errs long); PREFILL_CHUNK where none does or nothing was measured."""
    if tokens_per_s <= 0:
        return PREFILL_CHUNK
    fitting = [n for n in PREFILL_CHUNKS if n / tokens_per_s <= MAX_PREFILL_CHUNK_S]
    return max(fitting, default=PREFILL_CHUNK)


def interpolate(points: Mapping[int, float], n: int, per_extra: float | None = None) -> float:
    """The cost at `n` from measured `points` (size -> ms): the line between the neighbours;
    below the smallest, the smallest's; past the largest, `per_extra` for each further token
    (a prefill token's cost: a long forward is a prefill chunk) when known, else the line
    through the last two points (never falling)."""
    known = sorted(points.items())
    if n <= known[0][0] or len(known) == 1:
        return known[0][1] if n <= known[0][0] else known[-1][1]
    for (low, t_low), (high, t_high) in zip(known, known[1:], strict=False):
        if n <= high:
            return t_low + (t_high - t_low) * (n - low) / (high - low)
    (low, t_low), (high, t_high) = known[-2], known[-1]
    slope = per_extra if per_extra is not None else max(0.0, (t_high - t_low) / (high - low))
    return t_high + slope * (n - high)


def fill_sizes(measured: Mapping[int, float], per_extra: float | None = None) -> dict[int, float]:
    """Every MEASURED_SIZES entry from the measured ones (`interpolate`); fewer new tokens never
    cost more. Timing noise only ever adds time (another process, a page fault), so where a
    smaller forward measured slower than a larger one, the larger one's time is the better
    figure for both: on 2 AMX cores one calibration read 1, 2, 4, 8, 16, 32 tokens as 90.8,
    93.1, 145.9, 101.0, 195.2, 154.0 ms, and the next 92.5, 95.0, 95.9, 102.4, 117.5, 155.8.
    (Raising each size to the one below it instead once made a 202 ms one-token outlier every
    size's cost, and wide forwards look free.)"""
    out = {
        n: measured[n] if n in measured else interpolate(measured, n, per_extra)
        for n in MEASURED_SIZES
    }
    for smaller, larger in reversed(list(zip(MEASURED_SIZES, MEASURED_SIZES[1:], strict=False))):
        out[smaller] = min(out[smaller], out[larger])
    return out


def expected_tokens(acceptance: float, k: int) -> float:
    """Expected tokens emitted by one step with k drafts, each accepted with prob `acceptance`."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class CostModel:
    target_ms: dict[int, float]
    """Target forward time (ms) by number of new tokens in the forward."""
    draft_ms_per_token: float | None = None
    """Draft model time (ms) per proposed token; None when there is no draft model."""
    prefill_tokens_per_s: float = 0.0
    draft_prefill_tokens_per_s: float = 0.0
    context_tokens: int = 0
    measured: bool = False
    """False for the built-in estimate used when nothing was measured."""
    busy: bool = False
    """Measured while other processes kept the machine busy: not worth keeping."""
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def estimate(cls, has_draft: bool) -> CostModel:
        """Accelerator-like costs, used when calibration is skipped (tests, --no-calibrate)."""
        return cls(
            target_ms={n: 10.0 + 0.5 * (n - 1) for n in MEASURED_SIZES},
            draft_ms_per_token=2.0 if has_draft else None,
            prefill_tokens_per_s=5000.0,
            draft_prefill_tokens_per_s=20000.0 if has_draft else 0.0,
        )

    def target_step_ms(self, new_tokens: int) -> float:
        """The measured forward times, interpolated (`interpolate`); past the largest measured
        size (copy drafts run to hundreds of tokens) a prefill token per further token."""
        return interpolate(self.target_ms, new_tokens, self.prefill_ms_per_token())

    def prefill_chunks(self) -> tuple[int, int]:
        """(target's, draft's) prefill chunk on a CPU torch runner (`prefill_chunk_for`), from
        the measured prefill speeds; PREFILL_CHUNK for what was not measured."""
        if not self.measured:
            return PREFILL_CHUNK, PREFILL_CHUNK
        return (
            prefill_chunk_for(self.prefill_tokens_per_s),
            prefill_chunk_for(self.draft_prefill_tokens_per_s),
        )

    def prefill_ms_per_token(self) -> float | None:
        """What a token of prefill costs, when it was measured (None: not known)."""
        if self.measured and self.prefill_tokens_per_s > 0:
            return 1000.0 / self.prefill_tokens_per_s
        return None

    def catch_up_ms(self, tokens: int) -> float:
        """Time for the draft model to compute `tokens` it has not seen (a prefill)."""
        if tokens <= 1 or self.draft_prefill_tokens_per_s <= 0:
            return 0.0
        return 1000.0 * (tokens - 1) / self.draft_prefill_tokens_per_s

    def tokens_per_ms(
        self,
        source: str,
        acceptance: float,
        k: int,
        catch_up: int = 0,
        remaining_tokens: int = 1,
    ) -> float:
        """Expected throughput of one step: `source` ("ngram", "copy" or "draft") proposing k
        tokens; only the draft model's tokens cost time of their own.

        A draft model that lags the sequence by `catch_up` tokens (a cold cache) must compute
        them first. That prefill is paid once and serves every later draft step, so this step
        is charged only its share: the tokens it is expected to yield out of `remaining_tokens`.
        """
        tokens = expected_tokens(acceptance, k)
        cost = self.target_step_ms(k + 1)
        if source == "draft" and k > 0:
            if self.draft_ms_per_token is None:
                return 0.0
            share = min(1.0, tokens / max(remaining_tokens, 1))
            cost += k * self.draft_ms_per_token + self.catch_up_ms(catch_up) * share
        return tokens / cost

    def best_k(
        self,
        source: str,
        acceptance: float,
        max_k: int,
        catch_up: int = 0,
        remaining_tokens: int = 1,
    ) -> tuple[int, float]:
        """The draft length (0..max_k) with the highest expected tokens per ms, and that rate."""
        best = (0, 1.0 / self.target_step_ms(1))
        for k in range(1, max_k + 1):
            rate = self.tokens_per_ms(source, acceptance, k, catch_up, remaining_tokens)
            if rate > best[1]:
                best = (k, rate)
        return best

    def typical_completion_ms(
        self,
        prompt_tokens: int = 256,
        new_tokens: int = 32,
        acceptance: float = 0.6,
        max_k: int = 8,
    ) -> float:
        """What one completion of that shape costs: a prefill, then decoding with n-gram
        drafts at the best length for that acceptance (plain decoding when none pays). Used
        to compare runtimes and kernels on this machine."""
        prefill_ms = 1000.0 * prompt_tokens / max(self.prefill_tokens_per_s, 1e-9)
        _, rate = self.best_k("ngram", acceptance, max_k)
        return prefill_ms + new_tokens / rate

    def tree_tokens(self) -> int:
        """How many tokens a tree verify forward may hold (decoding/tree.py), 0 for chains
        only: the largest of TREE_SIZES whose measured forward costs at most TREE_MAX_STEPS
        one-token steps (16 on 2 AMX cores, 32 where wide forwards are nearly free, as on a
        GPU). Where wide forwards cost several steps (llama.cpp and torch float32 on AVX2: 16
        tokens cost 8.6 steps) or nothing was measured, 0."""
        if not self.measured:
            return 0
        step = self.target_step_ms(1)
        for size in TREE_SIZES:
            if size in self.target_ms and self.target_ms[size] <= TREE_MAX_STEPS * step:
                return size
        return 0

    def expected_speedup(self, acceptance: float, k: int, source: str) -> float:
        """Predicted speedup over plain decoding for drafts of length k at that acceptance."""
        return self.tokens_per_ms(source, acceptance, k) * self.target_step_ms(1)

    def to_dict(self) -> dict:
        return {
            "target_ms": {str(k): v for k, v in self.target_ms.items()},
            "draft_ms_per_token": self.draft_ms_per_token,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "draft_prefill_tokens_per_s": self.draft_prefill_tokens_per_s,
            "context_tokens": self.context_tokens,
            "measured": self.measured,
            "busy": self.busy,
            "notes": dict(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        return cls(
            target_ms={int(k): float(v) for k, v in data["target_ms"].items()},
            draft_ms_per_token=data.get("draft_ms_per_token"),
            prefill_tokens_per_s=float(data.get("prefill_tokens_per_s", 0.0)),
            draft_prefill_tokens_per_s=float(data.get("draft_prefill_tokens_per_s", 0.0)),
            context_tokens=int(data.get("context_tokens", 0)),
            measured=bool(data.get("measured", False)),
            busy=bool(data.get("busy", False)),
            notes=dict(data.get("notes", {})),
        )


class AcceptanceTracker:
    """Recent per-token acceptance, per (language, source), as a decaying success ratio.

    A step that drafted k and accepted j counts j successes and, if j < k, one failure: the
    maximum-likelihood per-token acceptance of a geometric run.
    """

    PRIORS = {"ngram": 0.7, "ngram:short": 0.4, "draft": 0.6, "copy": 0.99}
    """Before any evidence. A copy source is most of a rewrite: its drafts are mostly right
    (next edits on real history accepted 98-100 % of the copy tokens drafted; at 0.9 the
    first drafts were 16 tokens long, and forwards that short cost half again as much per
    token as long ones on a CPU)."""

    def __init__(self, decay: float = 0.9, prior_weight: float = 4.0) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self._counts: dict[tuple[str, str], list[float]] = {}

    def rate(self, language: str | None, source: str) -> float:
        prior = self.PRIORS.get(source, 0.5)
        successes, failures = self._counts.get((language or "", source), (0.0, 0.0))
        w = self.prior_weight
        return (successes + w * prior) / (successes + failures + w)

    def update(self, language: str | None, source: str, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        counts = self._counts.setdefault((language or "", source), [0.0, 0.0])
        counts[0] = counts[0] * self.decay + accepted
        counts[1] = counts[1] * self.decay + (1.0 if accepted < drafted else 0.0)


class LengthTracker:
    """How long recent completions were, per key (language and kind of completion), as a
    decaying mean. A cold draft cache's catch-up is shared over the tokens a request will still
    produce; a one-line completion of 8 tokens cannot repay what 32 could."""

    def __init__(self, decay: float = 0.7) -> None:
        self.decay = decay
        self._means: dict[str, float] = {}

    def expected(self, key: str) -> float | None:
        """The recent mean length of `key`'s completions; for a key with none yet, the mean
        over the keys that have some (None before any). A kind not met yet is no likelier to
        run to the token budget than those met: taking the budget for it, the first move to a
        new place in a file on 2 AMX cores paid 1.5-2 s for a draft model 296 tokens behind,
        on the promise of 62 tokens to share it over, and then wrote 9."""
        mean = self._means.get(key)
        if mean is None and self._means:
            return sum(self._means.values()) / len(self._means)
        return mean

    def update(self, key: str, length: int) -> None:
        mean = self._means.get(key)
        self._means[key] = length if mean is None else self.decay * mean + (1 - self.decay) * length


# --- measuring --------------------------------------------------------------------------------


def measure_step_costs(
    target: Runner,
    draft: Runner | None,
    *,
    vocab_size: int,
    device: torch.device,
    context_tokens: int = 256,
    repeats: int = 2,
    budget_s: float = 15.0,
    on_forward: Callable[[int], None] | None = None,
) -> CostModel:
    """Measure this machine's step costs on two runners (their caches are left empty).

    Target: prefill speed, then the forward time for MEASUREMENT_ORDER's sizes on top of a
    `context_tokens` context, best of `repeats` after a warm-up, the sizes timed in turns.
    Draft: prefill speed and time per token. Bounded by `budget_s`: sizes left unmeasured when
    it runs out are filled in (`fill_sizes`), and `notes["measured_sizes"]` says which were
    measured. A machine kept busy by other processes meanwhile is noted (`CostModel.busy`).
    `on_forward(n)` hears of each timed target forward of n new tokens (tests count them).
    """
    with OtherLoad() as load:
        deadline = time.monotonic() + budget_s
        generator = torch.Generator().manual_seed(0)
        high = max(2, min(vocab_size, 30000))
        extra = max(MEASURED_SIZES)  # the new tokens of the largest forward measured
        context = torch.randint(1, high, (context_tokens + extra,), generator=generator).tolist()
        base = context[:context_tokens]

        def timed(fn) -> float:
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            return (time.perf_counter() - t0) * 1000

        def measure_prefill(runner: Runner, share: float) -> float:
            """Tokens per second over as much of `base` as a share of the time left allows
            (at least one chunk)."""
            runner.reset()
            stop = time.monotonic() + max(0.0, deadline - time.monotonic()) * share
            t0 = time.perf_counter()
            _, computed, _ = runner.extend(base, deadline=stop)
            if computed == 0:
                runner.extend(base[: runner.prefill_chunk])
                computed = len(runner.tokens)
            return computed / max(time.perf_counter() - t0, 1e-6)

        def target_forward(n: int) -> None:
            if on_forward is not None:
                on_forward(n)
            target.forward(context[held : held + n])

        prefill_tps = measure_prefill(target, 0.3)
        held = len(target.tokens)
        samples: dict[int, list[float]] = {}

        def sample(n: int) -> None:
            target.keep(held)
            samples.setdefault(n, []).append(timed(lambda: target_forward(n)))

        # First pass: each size in MEASUREMENT_ORDER warmed up (its first forward builds its
        # kernels) and timed once. Further passes time each size once more, in turn, so a
        # burst of noise (another process, the VM's neighbours) lands on one sample of
        # several sizes rather than on every sample of one: the minimum of a size's samples
        # is its cost.
        for n in MEASUREMENT_ORDER:
            sample(n)
            if repeats > 0 and time.monotonic() < deadline:
                sample(n)
            if time.monotonic() >= deadline and n != 1:
                break
        for _ in range(repeats - 1):
            for n in MEASUREMENT_ORDER:
                if n not in samples or time.monotonic() >= deadline:
                    break
                sample(n)
        target_ms = {n: min(times[1:] or times) for n, times in samples.items()}
        measured_sizes = sorted(target_ms)
        target_ms = fill_sizes(target_ms, 1000.0 / max(prefill_tps, 1e-6))
        target.reset()

        draft_ms = None
        draft_prefill_tps = 0.0
        if draft is not None:
            draft_prefill_tps = measure_prefill(draft, 0.5)
            draft_held = len(draft.tokens)
            samples = []
            for i in range(repeats + 2):
                if len(samples) >= 2 and time.monotonic() >= deadline:
                    break
                draft.keep(draft_held)
                samples.append(timed(lambda i=i: draft.forward([context[held + i]])))
            draft_ms = min(samples[1:] or samples)
            draft.reset()

    return CostModel(
        target_ms=target_ms,
        draft_ms_per_token=draft_ms,
        prefill_tokens_per_s=prefill_tps,
        draft_prefill_tokens_per_s=draft_prefill_tps,
        context_tokens=held,
        measured=True,
        busy=load.share is not None and load.share > BUSY_SHARE,
        notes={"measured_sizes": ",".join(map(str, measured_sizes))},
    )

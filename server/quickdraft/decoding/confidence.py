"""How sure the target was of each token it wrote, and where another answer should branch.

Every decode forward already yields the target's distribution at each position it emits a
token from. `token_choices` keeps, per emitted token, its log-probability and the runner-up
(the best other token) with its log-probability: enough to score an answer (`confidence`) and
to pick the positions where an alternative answer should start (`branch_points`), with no
forward of its own.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenChoice:
    """The target's view of one emitted token."""

    logprob: float
    """Log-probability of the emitted token (natural log; -inf where a constraint forbade it)."""
    runner_up: int
    """The most likely other token."""
    runner_up_logprob: float
    """Its log-probability: -inf where no other token was allowed (token healing)."""


def token_choices(logits: torch.Tensor, emitted: Sequence[int]) -> list[TokenChoice]:
    """`logits` (n >= len(emitted), V): row i the distribution emitted[i] was taken from."""
    if not emitted:
        return []
    rows = torch.log_softmax(logits[: len(emitted)].float(), dim=-1)
    top = rows.topk(2, dim=-1)
    values, indices = top.values.tolist(), top.indices.tolist()
    chosen = rows.gather(1, torch.tensor([[int(t)] for t in emitted])).squeeze(1).tolist()
    choices = []
    for token, logprob, best, best_logprob in zip(emitted, chosen, indices, values, strict=True):
        other = 1 if best[0] == token else 0  # sampling may emit a token below the top one
        choices.append(TokenChoice(logprob, int(best[other]), float(best_logprob[other])))
    return choices


def confidence(choices: Sequence[TokenChoice]) -> float:
    """The probability the target gives the whole sequence: the product of its token
    probabilities. It is the model's own estimate that these exact tokens come next, so it
    falls with every token the model was unsure of (a long answer has more chances to go
    wrong, and is wrong more often). 1.0 for no tokens."""
    total = sum(choice.logprob for choice in choices)
    return math.exp(total) if total > -math.inf else 0.0


def branch_points(
    choices: Sequence[TokenChoice], count: int, end_tokens: Collection[int] = ()
) -> list[int]:
    """The `count` positions where the target was least sure, most likely runner-up first:
    where an alternative answer starts with the runner-up token. Positions whose runner-up was
    not allowed, or would end the answer there (`end_tokens`: a shorter answer is no fork),
    are never chosen."""
    allowed = [
        i
        for i, choice in enumerate(choices)
        if choice.runner_up_logprob > -math.inf and choice.runner_up not in end_tokens
    ]
    allowed.sort(key=lambda i: (-choices[i].runner_up_logprob, i))
    return allowed[: max(0, count)]

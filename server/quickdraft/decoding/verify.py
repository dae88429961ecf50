"""Turning one target forward over [pending, d1..dk] into accepted tokens.

The target forward yields k+1 next-token distributions: p_1 (after `pending`, judging d1),
p_2 (after d1, judging d2), ..., p_{k+1} (after dk, the bonus position). Both rules below
always emit at least one token: the target's own token at the first rejection, or the bonus
token after all k drafts were accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def warp(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sampling distribution from logits: temperature, then nucleus (top-p) truncation.

    logits (n, V) -> probs (n, V). Applied identically to draft and target, as exactness needs.
    """
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix of tokens whose mass reaches top_p (always at least one).
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def accept_greedy(drafts: Sequence[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy rule: accept the longest prefix of drafts equal to the target's argmax.

    target_logits (k+1, V). Returns (emitted tokens, number of drafts accepted). The emitted list
    is exactly what plain greedy decoding of the target would produce next.
    """
    choice = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
        accepted += 1
    # choice[accepted] is the correction at the first mismatch, or the bonus token.
    return list(drafts[:accepted]) + [choice[accepted]], accepted


def accept_sampling(
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    drafts: k tokens, draft_probs (k, V) = q, or None for a deterministic proposal (n-gram: q is
    one-hot on the drafted token); target_probs (k+1, V) = p.

    For each draft x_i in order: accept with probability min(1, p_i(x_i) / q_i(x_i)). On the
    first rejection, emit a token drawn from the residual normalize(max(0, p_i - q_i)) and stop.
    If all k are accepted, emit a bonus token drawn from p_{k+1}. The emitted tokens are then
    distributed exactly as if drawn from the target one at a time.
    """
    for i, token in enumerate(drafts):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[token] = 1.0
        else:
            q = draft_probs[i]
        p_x = float(p[token])
        q_x = float(q[token])
        u = float(torch.rand((), generator=generator, device=generator.device))
        if q_x > 0 and u < min(1.0, p_x / q_x):
            continue
        residual = (p - q).clamp_min(0.0)
        total = float(residual.sum())
        # total == 0 only if p == q, where rejection has probability 0; guard numerics anyway.
        residual = residual / total if total > 0 else p
        correction = int(torch.multinomial(residual, 1, generator=generator))
        return list(drafts[:i]) + [correction], i
    bonus = int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator))
    return list(drafts) + [bonus], len(drafts)

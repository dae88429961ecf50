"""Acceptance rules. Speculative sampling must reproduce the target's distribution exactly."""

from __future__ import annotations

import itertools

import pytest
import torch

from quickdraft.decoding.verify import accept_greedy, accept_sampling, warp

V = 4
# A toy bigram "language model": row x is the next-token distribution after token x.
P = torch.tensor(
    [
        [0.50, 0.20, 0.20, 0.10],
        [0.05, 0.05, 0.60, 0.30],
        [0.25, 0.25, 0.25, 0.25],
        [0.70, 0.10, 0.10, 0.10],
    ],
    dtype=torch.float64,
)
Q = torch.tensor(  # a poor draft: often wrong, sometimes zero where p is not
    [
        [0.10, 0.60, 0.30, 0.00],
        [0.40, 0.40, 0.10, 0.10],
        [0.70, 0.10, 0.10, 0.10],
        [0.25, 0.25, 0.25, 0.25],
    ],
    dtype=torch.float64,
)


def speculative_pair(
    first: int, k: int, generator: torch.Generator, one_hot: bool
) -> tuple[int, int]:
    """Generate two tokens after `first` by speculative sampling with k drafts per step."""
    sequence = [first]
    while len(sequence) < 3:
        drafts, q_rows = [], []
        last = sequence[-1]
        for _ in range(k):
            if one_hot:  # a deterministic drafter, like prompt lookup: always proposes (last+1) % V
                token = (last + 1) % V
            else:
                q_rows.append(Q[last])
                token = int(torch.multinomial(Q[last], 1, generator=generator))
            drafts.append(token)
            last = token
        context = [sequence[-1], *drafts]
        p_rows = torch.stack([P[t] for t in context])  # (k+1, V): p after each prefix
        emitted, accepted = accept_sampling(
            drafts, None if one_hot else torch.stack(q_rows), p_rows, generator
        )
        assert 0 <= accepted <= k and len(emitted) == accepted + 1
        sequence.extend(emitted)
    return sequence[1], sequence[2]


@pytest.mark.parametrize("k,one_hot", [(1, False), (3, False), (2, True)])
def test_speculative_sampling_matches_the_target_distribution(k, one_hot):
    generator = torch.Generator().manual_seed(1234 + k)
    samples = 30000
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(samples):
        a, b = speculative_pair(0, k, generator, one_hot)
        counts[a, b] += 1
    expected = samples * P[0][:, None] * P  # p(a | 0) * p(b | a)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 15 degrees of freedom: the 99.99th percentile is about 44.3. A wrong residual
    # (e.g. resampling from p instead of max(0, p - q)) lands in the hundreds.
    assert chi2 < 44.3, (chi2, counts / samples, expected / samples)


def test_a_wrong_residual_would_be_caught():
    """The statistical test above has teeth: resampling from p on rejection is detectably biased."""
    generator = torch.Generator().manual_seed(7)
    samples = 30000
    counts = torch.zeros(V, dtype=torch.float64)
    for _ in range(samples):
        token = int(torch.multinomial(Q[0], 1, generator=generator))
        if float(torch.rand((), generator=generator)) < min(1.0, float(P[0][token] / Q[0][token])):
            counts[token] += 1
        else:
            counts[int(torch.multinomial(P[0], 1, generator=generator))] += (
                1  # wrong: not the residual
            )
    expected = samples * P[0]
    assert float(((counts - expected) ** 2 / expected).sum()) > 100


def test_draft_equal_to_target_is_always_accepted():
    generator = torch.Generator().manual_seed(0)
    for first, k in itertools.product(range(V), (1, 4)):
        drafts, last = [], first
        for _ in range(k):
            last = int(torch.multinomial(P[last], 1, generator=generator))
            drafts.append(last)
        p_rows = torch.stack([P[t] for t in [first, *drafts]])
        emitted, accepted = accept_sampling(drafts, p_rows[:k], p_rows, generator)
        assert accepted == k and emitted[:k] == drafts and len(emitted) == k + 1


def test_greedy_accepts_the_longest_agreeing_prefix_then_the_targets_token():
    logits = torch.tensor([[0.0, 5.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    assert accept_greedy([1, 0, 2], logits) == ([1, 0, 2, 0], 3)  # all accepted + bonus
    assert accept_greedy([1, 2, 2], logits) == ([1, 0], 1)  # second draft wrong: correction 0
    assert accept_greedy([], logits[:1]) == ([1], 0)  # plain decoding step


def test_warp_temperature_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = warp(logits, 1.0, 1.0)
    assert torch.allclose(probs.sum(), torch.tensor(1.0))
    nucleus = warp(logits, 1.0, 0.7)
    # The two most likely tokens hold >= 0.7 of the mass; the rest are cut.
    assert (
        nucleus[0, 2] == 0
        and nucleus[0, 3] == 0
        and torch.allclose(nucleus.sum(), torch.tensor(1.0))
    )
    assert float(warp(logits, 0.1, 1.0)[0, 0]) > 0.99  # low temperature: nearly greedy

"""Many branches in one verify forward, from proposals that cost nothing.

Where a forward of 16 new tokens costs little more than one (the target's weights are read once
either way: AMX CPUs, GPUs), one chain of drafts wastes most of it. A tree spends it: the
engine's chain proposal (n-gram or draft model) is its first branch, and the rest is filled
from the target's own runner-up tokens (token recycling, Luo et al. 2024): every forward's top
candidates after each token it saw are kept per pair of tokens (the one before, the one seen)
and per token, and a tree is grown from the pending token through them, widest near the root
where guesses are likeliest to be needed.

One forward checks every node (`Runner.forward_tree`: each row attends to its own path only),
and greedy acceptance walks from the root, taking at each node the child whose token is the
target's argmax there. The walk emits exactly the tokens plain greedy decoding gives (each
row's logits are, on the row-wise int8 path bitwise, those of one-token steps along its path).
Sampling stays a chain (the rejection rule is for one proposal per position).

The cost model decides the tree's size from the measured forward costs
(`CostModel.tree_tokens`): where a wide forward costs several steps (AVX2 CPUs, llama.cpp) the
proposals stay a chain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

BRANCHING = (4, 3, 2, 2, 1)
"""Children added from the recycled candidates at each depth below the root (depth 0 first);
deeper nodes get the last figure. A guess near the root is needed by every longer path."""
RECYCLED_WIDTH = 8
"""Candidates kept per token: the target's top tokens after it, from its latest forward."""
RECYCLED_PAIRS = 1 << 16
"""Pairs of tokens whose candidates are kept, the least recently seen dropped first (a day of
typing would otherwise grow the table without end; single tokens are bounded by the
vocabulary)."""


@dataclass
class DraftTree:
    """Tokens with a parent each; node 0 is the pending token (parent -1). Parents come before
    their children, and no node has two children with one token."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])

    @classmethod
    def rooted_at(cls, pending: int) -> DraftTree:
        return cls([int(pending)])

    def __len__(self) -> int:
        return len(self.tokens)

    def previous(self, before_root: int | None) -> list[int | None]:
        """The token before each node on its path (`before_root` for the root)."""
        return [before_root, *(self.tokens[p] for p in self.parents[1:])]

    def add(self, parent: int, token: int) -> tuple[int, bool]:
        """The child of `parent` with `token`, and whether it is new."""
        existing = self.children[parent].get(token)
        if existing is not None:
            return existing, False
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append({})
        self.children[parent][token] = node
        return node, True


class TokenRecycler:
    """The target's top candidates after each token, and after each pair of tokens, from the
    latest forward that saw them: after a pair first (code repeats its bigrams: `self.` is
    followed by what followed it last time, not by what followed any `.`), then after the
    token alone."""

    def __init__(self, width: int = RECYCLED_WIDTH, pairs: int = RECYCLED_PAIRS) -> None:
        self.width = width
        self.pairs = pairs
        self._after: dict[int, list[int]] = {}
        self._after_pair: dict[tuple[int, int], list[int]] = {}

    def update(
        self, tokens: Sequence[int], previous: Sequence[int | None], logits: torch.Tensor
    ) -> None:
        """Row i of `logits` (n, V) came after `tokens[i]`, which came after `previous[i]`
        (None: nothing before it)."""
        top = logits.topk(min(self.width, logits.shape[-1]), dim=-1).indices.tolist()
        for token, before, candidates in zip(tokens, previous, top, strict=True):
            self._after[int(token)] = candidates
            if before is not None:
                pair = (int(before), int(token))
                self._after_pair.pop(pair, None)  # back to the newest end
                self._after_pair[pair] = candidates
                if len(self._after_pair) > self.pairs:
                    del self._after_pair[next(iter(self._after_pair))]

    def after(self, previous: int | None, token: int) -> list[int]:
        """Up to `width` candidates after `token` (preceded by `previous`), best first."""
        paired = self._after_pair.get((previous, token), []) if previous is not None else []
        alone = self._after.get(int(token), [])
        if not paired:
            return alone
        return list(dict.fromkeys([*paired, *alone]))[: self.width]


def build_tree(
    previous: int | None,
    pending: int,
    chain: Sequence[int],
    recycler: TokenRecycler,
    size: int,
    max_depth: int,
) -> DraftTree:
    """A tree of at most `size` nodes (the pending token, which came after `previous`,
    included) and `max_depth` levels below it: `chain` as its first branch, then recycled
    candidates breadth first."""
    tree = DraftTree.rooted_at(pending)
    node = 0
    for token in list(chain)[: min(max_depth, size - 1)]:
        node, _ = tree.add(node, token)
    queue = deque(range(len(tree)))
    while queue and len(tree) < size:
        node = queue.popleft()
        depth = tree.depths[node]
        if depth >= max_depth:
            continue
        width = BRANCHING[min(depth, len(BRANCHING) - 1)]
        before = previous if node == 0 else tree.tokens[tree.parents[node]]
        for token in recycler.after(before, tree.tokens[node])[:width]:
            child, new = tree.add(node, token)
            if new:
                queue.append(child)
            if len(tree) >= size:
                break
    return tree


def accept_tree(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """Greedy walk: (emitted tokens, the accepted path's nodes). logits (len(tree), V)."""
    choice = logits.argmax(dim=-1).tolist()
    node, path = 0, []
    while True:
        child = tree.children[node].get(choice[node])
        if child is None:
            return [tree.tokens[n] for n in path] + [choice[node]], path
        path.append(child)
        node = child

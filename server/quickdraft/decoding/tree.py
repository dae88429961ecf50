"""Many branches in one verify forward, from proposals that cost nothing.

Where a forward of 16 new tokens costs little more than one (the target's weights are read once
either way: AMX CPUs, GPUs), one chain of drafts wastes most of it. A tree spends it: the
engine's chain proposal (n-gram or draft model) is its first branch, and the rest is filled
from the target's own runner-up tokens (token recycling, Luo et al. 2024): every forward's top
candidates after each token it saw are kept per pair of tokens (the one before, the one seen)
and per token. The tree grows best first (as EAGLE-2 and Sequoia shape theirs): each candidate
is scored by the chance its whole path is accepted, the product along the path of how often a
candidate of its rank was the target's choice where it was checked (`BranchOdds`, measured
forward by forward), and the likeliest is added until the tree is full. So a tree goes deep
where the recycled guesses keep being right and wide where they are not.

One forward checks every node (`Runner.forward_tree`: each row attends to its own path only),
and greedy acceptance walks from the root, taking at each node the child whose token is the
target's argmax there. The walk emits exactly the tokens plain greedy decoding gives (each
row's logits are, on the row-wise int8 path bitwise, those of one-token steps along its path).
Sampling stays a chain (the rejection rule is for one proposal per position).

The cost model bounds the tree's size by the measured forward costs (`CostModel.tree_tokens`):
where a wide forward costs several steps (AVX2 CPUs, llama.cpp) the proposals stay a chain.
Within the bound each step's tree keeps the nodes that pay for the wider forward: its first n,
where the expected tokens per ms are highest (`worth_its_cost`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

RECYCLED_WIDTH = 8
"""Candidates kept per token: the target's top tokens after it, from its latest forward."""
RECYCLED_PAIRS = 1 << 16
"""Pairs of tokens whose candidates are kept, the least recently seen dropped first (a day of
typing would otherwise grow the table without end; single tokens are bounded by the
vocabulary)."""
RANK_PRIOR = (0.4, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)
"""Before anything is measured: the chance a recycled candidate of each rank (best first) is
the target's choice where it is checked. `BranchOdds` moves from these with every tree."""
RANK_PRIOR_WEIGHT = 4.0
"""Checks the prior counts as."""
CHAIN = -1
"""The rank of the root and of the nodes of the step's proposal (the chain)."""
NGRAM_BRANCH = -2
"""The rank of a node from another n-gram continuation than the chain's."""
NGRAM_BRANCH_PRIOR = 0.3
"""Before anything is measured: the chance such a node is the target's choice where checked."""


@dataclass
class DraftTree:
    """Tokens with a parent each; node 0 is the pending token (parent -1). Parents come before
    their children, and no node has two children with one token."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    ranks: list[int] = field(default_factory=lambda: [CHAIN])
    """Each node's rank among its parent's recycled candidates; CHAIN for the root and the
    proposal's nodes, NGRAM_BRANCH for another n-gram continuation's."""
    chances: list[float] = field(default_factory=lambda: [1.0])
    """Each node's estimated chance of being accepted (`build_tree`; the root's is 1)."""

    @classmethod
    def rooted_at(cls, pending: int) -> DraftTree:
        return cls([int(pending)])

    def __len__(self) -> int:
        return len(self.tokens)

    def source_of(self, node: int) -> str | None:
        """Where a node's token came from: "recycled" or "ngram-branch"; None for the root and
        the chain (the proposal's own source)."""
        rank = self.ranks[node]
        if rank == NGRAM_BRANCH:
            return "ngram-branch"
        return "recycled" if rank >= 0 else None

    def previous(self, before_root: int | None) -> list[int | None]:
        """The token before each node on its path (`before_root` for the root)."""
        return [before_root, *(self.tokens[p] for p in self.parents[1:])]

    def add(
        self, parent: int, token: int, rank: int = CHAIN, chance: float = 1.0
    ) -> tuple[int, bool]:
        """The child of `parent` with `token`, and whether it is new."""
        existing = self.children[parent].get(token)
        if existing is not None:
            return existing, False
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.ranks.append(rank)
        self.chances.append(chance)
        self.children.append({})
        self.children[parent][token] = node
        return node, True

    def first(self, n: int) -> DraftTree:
        """The tree of its first `n` nodes (parents come first, so they are a tree)."""
        if n >= len(self):
            return self
        return DraftTree(
            self.tokens[:n],
            self.parents[:n],
            self.depths[:n],
            [{t: c for t, c in kids.items() if c < n} for kids in self.children[:n]],
            self.ranks[:n],
            self.chances[:n],
        )


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

    def __len__(self) -> int:
        """Tokens whose candidates are kept."""
        return len(self._after)

    def forget(self) -> None:
        """Drop every candidate kept (a benchmark's cold start: what the target wrote for one
        strategy's run of a hole would be the next strategy's tree)."""
        self._after.clear()
        self._after_pair.clear()

    def after(self, previous: int | None, token: int) -> list[int]:
        """Up to `width` candidates after `token` (preceded by `previous`), best first."""
        paired = self._after_pair.get((previous, token), []) if previous is not None else []
        alone = self._after.get(int(token), [])
        if not paired:
            return alone
        return list(dict.fromkeys([*paired, *alone]))[: self.width]


class BranchOdds:
    """How often a recycled candidate of each rank was the target's choice where it was checked,
    that is where its parent was on the accepted path: the odds a tree is grown by."""

    def __init__(self, width: int = RECYCLED_WIDTH) -> None:
        self.hits = [0] * width
        self.checks = [0] * width
        self.branch_hits = 0
        self.branch_checks = 0
        """The same for nodes of other n-gram continuations (NGRAM_BRANCH), any depth."""

    def rate(self, rank: int) -> float:
        if rank == NGRAM_BRANCH:
            prior, hits, checks = NGRAM_BRANCH_PRIOR, self.branch_hits, self.branch_checks
        else:
            prior = RANK_PRIOR[min(rank, len(RANK_PRIOR) - 1)]
            hits, checks = self.hits[rank], self.checks[rank]
        return (hits + RANK_PRIOR_WEIGHT * prior) / (checks + RANK_PRIOR_WEIGHT)

    def update(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Count the recycled nodes whose parent the accepted `path` (nodes) reached."""
        reached = {0, *path}
        accepted = set(path)
        for node in range(1, len(tree)):
            rank = tree.ranks[node]
            if tree.parents[node] not in reached:
                continue
            if rank == NGRAM_BRANCH:
                self.branch_checks += 1
                self.branch_hits += node in accepted
            elif 0 <= rank < len(self.checks):
                self.checks[rank] += 1
                self.hits[rank] += node in accepted


def build_tree(
    previous: int | None,
    pending: int,
    chain: Sequence[int],
    recycler: TokenRecycler,
    size: int,
    max_depth: int,
    odds: BranchOdds | None = None,
    chain_rate: float = 0.5,
    branches: Sequence[Sequence[int]] = (),
    forward_ms: Callable[[int], float] | None = None,
) -> DraftTree:
    """A tree of at most `size` nodes (the pending token, which came after `previous`,
    included) and `max_depth` levels below it, the likeliest first among: the proposal `chain`
    (each of its tokens accepted with `chain_rate`), the other n-gram continuations `branches`
    (from the root) and the recycled candidates after every node. With `forward_ms` (what a
    forward of n new tokens costs) it is cut to its first n nodes where they are expected to
    yield the most tokens per ms (`worth_its_cost`)."""
    odds = odds or BranchOdds(recycler.width)
    tree = DraftTree.rooted_at(pending)
    chance = tree.chances  # per node: the estimated chance the walk reaches and accepts it
    # (-chance, serial, parent, token, rank, the rest of the chain or n-gram branch)
    frontier: list[tuple[float, int, int, int, int, tuple[int, ...]]] = []
    serial = itertools.count()  # ties go to the earlier offer

    def offer(parent: int, token: int, rank: int, rest: tuple[int, ...] = ()) -> None:
        if tree.depths[parent] >= max_depth:
            return
        existing = tree.children[parent].get(token)
        if existing is not None:  # a branch through a node already there goes on from it
            if rank == CHAIN:
                tree.ranks[existing] = CHAIN  # the proposal's, for its acceptance
            if rest:
                offer(existing, rest[0], rank, rest[1:])
            return
        score = chance[parent] * (chain_rate if rank == CHAIN else odds.rate(rank))
        heapq.heappush(frontier, (-score, next(serial), parent, token, rank, rest))

    def offer_recycled(parent: int) -> None:
        before = previous if parent == 0 else tree.tokens[tree.parents[parent]]
        for rank, token in enumerate(recycler.after(before, tree.tokens[parent])):
            offer(parent, token, min(rank, len(odds.checks) - 1))

    for rank, branch in [(CHAIN, chain), *((NGRAM_BRANCH, b) for b in branches)]:
        if branch:
            offer(0, int(branch[0]), rank, tuple(int(t) for t in branch[1:]))
    offer_recycled(0)
    while frontier and len(tree) < size:
        negative, _, parent, token, rank, rest = heapq.heappop(frontier)
        if token in tree.children[parent]:  # added since it was offered
            offer(parent, token, rank, rest)
            continue
        node, _ = tree.add(parent, token, rank, -negative)
        offer_recycled(node)
        if rest:
            offer(node, rest[0], rank, rest[1:])
    return tree if forward_ms is None else tree.first(worth_its_cost(tree.chances, forward_ms))


def worth_its_cost(chances: Sequence[float], forward_ms: Callable[[int], float]) -> int:
    """How many of a best-first tree's nodes to verify: the n whose forward is expected to
    yield the most tokens per ms. A forward of its first n nodes emits one token more than it
    accepts, and accepts node i with `chances[i]` (the root's, 1, is that one token), so it
    yields sum(chances[:n]) in forward_ms(n). Since the nodes come likeliest first, each one
    added is worth less than the one before; the measured cost of a wider forward decides where
    they stop paying (one calibration on 2 AMX cores: 119 ms for a forward of 4 new tokens, 151
    for 8, 174 for 16)."""
    best, best_rate, expected = 1, 0.0, 0.0
    for n, chance in enumerate(chances, start=1):
        expected += chance
        rate = expected / forward_ms(n)
        if rate > best_rate:
            best, best_rate = n, rate
    return best


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

"""Tree verification (decoding/tree.py): each row of a tree forward is bitwise the one-token
step along its path, the kept path leaves the cache a chain would, the engine's tree steps emit
plain greedy decoding's tokens in fewer forwards, and the cost model keeps chains where wide
forwards are not nearly free."""

from __future__ import annotations

import pytest
import torch

from quickdraft.config import DecodingConfig, load_config
from quickdraft.decoding import CostModel, Engine, GenerationRequest
from quickdraft.decoding.runner import ModelRunner
from quickdraft.decoding.tree import (
    CHAIN,
    NGRAM_BRANCH,
    BranchOdds,
    DraftTree,
    TokenRecycler,
    accept_tree,
    build_tree,
    worth_its_cost,
)
from quickdraft.errors import ConfigError
from quickdraft.models.quantize import quantize_model
from quickdraft.testing import build_tiny_int8_model, build_tiny_model, build_tiny_tokenizer

CODE = (
    "def area(width, height):\n    product = width * height\n    return abs(product)\n\n\n"
    "def perimeter(width, height):\n    total = width + height\n    return 2 * total\n\n\n"
    "class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n"
    "        self.height = height\n"
)
TOKENS = [5, 6, 7, 8, 9, 11, 12]
PARENTS = [-1, 0, 0, 1, 1, 3, 2]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def int8_target():
    return build_tiny_int8_model(len(build_tiny_tokenizer()))


def path_to(node: int) -> list[int]:
    path = []
    while node > 0:
        path.append(node)
        node = PARENTS[node]
    return [0, *path[::-1]]


def test_each_tree_row_is_bitwise_the_step_at_the_end_of_its_path(int8_target):
    prompt = list(range(10, 200))
    runner = ModelRunner(int8_target)
    assert runner.supports_tree
    runner.extend(prompt)
    logits = runner.forward_tree(TOKENS, PARENTS)
    assert runner.tokens == prompt + TOKENS
    steps = ModelRunner(int8_target)
    for node in range(len(TOKENS)):
        steps.extend(prompt)
        for on_path in path_to(node):
            last = steps.forward([TOKENS[on_path]])
        assert torch.equal(last[0], logits[node]), node
        steps.keep(len(prompt))


def test_the_kept_path_leaves_the_cache_a_chain_of_steps_would(int8_target):
    prompt = list(range(30, 150))
    runner = ModelRunner(int8_target)
    runner.extend(prompt)
    runner.forward_tree(TOKENS, PARENTS)
    runner.keep_tree_path([1, 3, 5])
    assert runner.tokens == prompt + [5, 6, 8, 11]
    chain = ModelRunner(int8_target)
    chain.extend(prompt)
    for token in (5, 6, 8, 11):
        chain.forward([token])
    assert torch.equal(runner.forward([42, 43]), chain.forward([42, 43]))
    # A path that is already in place (the first branch) moves nothing.
    runner.keep(len(prompt))
    runner.forward_tree(TOKENS, PARENTS)
    runner.keep_tree_path([1])
    assert runner.tokens == prompt + [5, 6]


def test_trees_need_row_wise_attention_and_parents_first(tokenizer, int8_target):
    plain = ModelRunner(build_tiny_model(len(tokenizer), seed=0))
    assert not plain.supports_tree
    with pytest.raises(RuntimeError, match="row-wise"):
        plain.forward_tree([1, 2], [-1, 0])
    runner = ModelRunner(int8_target)
    runner.extend([3, 4, 5])
    with pytest.raises(ValueError, match="parents come first"):
        runner.forward_tree([1, 2, 3], [-1, 2, 0])
    with pytest.raises(ValueError, match="parents come first"):
        runner.forward_tree([1, 2], [0, 0])
    with pytest.raises(ValueError, match="2 tokens with 3 parents"):
        runner.forward_tree([1, 2], [-1, 0, 0])
    assert runner.tokens == [3, 4, 5]  # nothing was run


def _recycler_after_7_20_21() -> TokenRecycler:
    recycler = TokenRecycler(width=4)
    logits = torch.zeros(3, 50)
    for row, token in enumerate((7, 20, 21)):
        # After 7 the target liked 20, 21, 22, 23; after 20: 30, 31; after 21: 40.
        for rank, candidate in enumerate({7: (20, 21, 22, 23), 20: (30, 31), 21: (40,)}[token]):
            logits[row, candidate] = 10.0 - rank
    recycler.update([7, 20, 21], [None, 7, 20], logits)
    return recycler


def test_the_tree_holds_the_chain_then_the_likeliest_recycled_paths():
    recycler = _recycler_after_7_20_21()
    assert recycler.after(None, 7)[:4] == [20, 21, 22, 23]
    tree = build_tree(None, 7, [20, 30, 99], recycler, size=8, max_depth=3, chain_rate=0.5)
    # The chain's nodes score 0.5, 0.25, 0.125; with the prior odds by rank (0.4, 0.15, 0.08,
    # 0.05): 21 (0.15), 22 (0.08), 31 after the chain's 20 (0.5 * 0.15) and 40 after 21
    # (0.15 * 0.4) beat 23 (0.05). 20 and 30, the chain's and the recycled rank 0, are one node.
    chain = [n for n in range(1, len(tree)) if tree.ranks[n] == CHAIN]
    assert [tree.tokens[n] for n in chain] == [20, 30, 99]
    assert [tree.parents[n] for n in chain] == [0, chain[0], chain[1]]
    assert tree.tokens[:3] == [7, 20, 30] and len(tree) == 8 and max(tree.depths) <= 3
    added = {(tree.tokens[tree.parents[n]], tree.tokens[n]) for n in range(1, 8)} - {
        (7, 20),
        (20, 30),
        (30, 99),
    }
    assert added == {(7, 21), (7, 22), (20, 31), (21, 40)}
    # A chain less likely than the recycled guesses loses its deep nodes to them: 20 and 30
    # are the recycled ones (the chain's too), 99 (0.4 * 0.4 * 0.1) loses to 21 and 22.
    unlikely = build_tree(None, 7, [20, 30, 99], recycler, size=5, max_depth=3, chain_rate=0.1)
    assert [unlikely.tokens[n] for n in range(1, 5) if unlikely.ranks[n] == CHAIN] == [20, 30]
    assert sorted(unlikely.tokens) == [7, 20, 21, 22, 30]
    assert len(build_tree(None, 7, [20, 30, 99], recycler, size=8, max_depth=1)) == 5
    assert build_tree(None, 7, [20, 30], recycler, size=2, max_depth=5).tokens == [7, 20]


def test_measured_odds_move_the_tree_where_guesses_were_right():
    recycler = _recycler_after_7_20_21()
    odds = BranchOdds(width=4)
    # Rank 0 was checked ten times and never right; rank 3 right every time it was checked.
    odds.checks[0], odds.checks[3], odds.hits[3] = 10, 10, 10
    assert odds.rate(3) > odds.rate(1) > odds.rate(0)
    tree = build_tree(None, 7, [], recycler, size=3, max_depth=2, odds=odds)
    assert sorted(tree.tokens[1:]) == [21, 23]  # 20 (rank 0) lost its place to 23 (rank 3)
    # Updating counts only the nodes whose parent the accepted path reached.
    grown = build_tree(None, 7, [], recycler, size=6, max_depth=2)
    child_21 = grown.children[0][21]
    before = (list(odds.checks), list(odds.hits))
    odds.update(grown, [child_21])
    checked = [grown.ranks[n] for n in range(1, len(grown)) if grown.parents[n] in (0, child_21)]
    assert sum(odds.checks) - sum(before[0]) == len(checked)
    assert odds.hits[1] == before[1][1] + 1  # 21 was rank 1 after 7


def test_other_ngram_continuations_are_branches_of_their_own():
    recycler = _recycler_after_7_20_21()
    odds = BranchOdds(width=4)
    tree = build_tree(
        None,
        7,
        [20],
        recycler,
        size=6,
        max_depth=3,
        odds=odds,
        chain_rate=0.5,
        branches=[[22, 50, 51]],
    )
    # The branch 22 50 51 (0.3 a token before any measurement) goes deep: 0.3, 0.09, 0.027
    # beat recycled 21 (0.15) only where they score more.
    branch = [n for n in range(len(tree)) if tree.source_of(n) == "ngram-branch"]
    assert [tree.tokens[n] for n in branch] == [22, 50]
    assert tree.parents[branch[1]] == branch[0] and tree.parents[branch[0]] == 0
    assert tree.source_of(1) is None and tree.tokens[1] == 20  # the chain's node
    # Accepted along the branch: it is counted, and its odds rise.
    odds.update(tree, branch)
    assert odds.branch_checks == 2 and odds.branch_hits == 2
    assert odds.rate(NGRAM_BRANCH) > 0.3


def test_candidates_after_a_pair_come_before_those_after_the_token_alone():
    recycler = TokenRecycler(width=3)
    logits = torch.zeros(2, 50)
    logits[0, [10, 11, 12]] = torch.tensor([3.0, 2.0, 1.0])  # after (5, 9): 10, 11, 12
    logits[1, [13, 14, 15]] = torch.tensor([3.0, 2.0, 1.0])  # after (6, 9): 13, 14, 15
    recycler.update([9, 9], [5, 6], logits)
    assert recycler.after(5, 9) == [10, 11, 12]  # the pair's own, though 9's latest was 13..
    assert recycler.after(6, 9) == [13, 14, 15]
    assert recycler.after(8, 9) == [13, 14, 15]  # an unseen pair: the token's latest
    assert recycler.after(8, 4) == []
    # The tree asks with each node's own predecessor: the root's is given, the others' are
    # their parents' tokens.
    tree = build_tree(5, 9, [], recycler, size=4, max_depth=1)
    assert tree.tokens == [9, 10, 11, 12]
    assert tree.previous(5) == [5, 9, 9, 9]


def test_the_pair_table_is_bounded_and_keeps_the_latest_seen():
    recycler = TokenRecycler(width=1, pairs=2)
    logits = torch.zeros(1, 50)
    for before, token in ((1, 2), (3, 4), (1, 2), (9, 4)):
        logits.zero_()
        logits[0, before + token] = 1.0
        recycler.update([token], [before], logits)
    # (3, 4) was the least recently seen when (9, 4) came: dropped, so after it comes what
    # followed 4 last (13), not what followed (3, 4) (7); (1, 2), seen again, was kept.
    assert recycler.after(3, 4) == [13]
    assert recycler.after(1, 2) == [3] and recycler.after(9, 4) == [13]


def test_accepting_walks_the_target_argmax_through_the_tree():
    tree = DraftTree.rooted_at(7)
    a, _ = tree.add(0, 20)
    b, _ = tree.add(0, 21)
    c, _ = tree.add(b, 40)
    assert tree.add(0, 21) == (b, False)
    logits = torch.zeros(len(tree), 50)
    logits[0, 21] = logits[b, 40] = logits[c, 3] = logits[a, 9] = 1.0
    assert accept_tree(tree, logits) == ([21, 40, 3], [b, c])
    logits[0, 21], logits[0, 5] = 0.0, 2.0
    assert accept_tree(tree, logits) == ([5], [])


def engine(target, tree: str | int, draft=None) -> Engine:
    return Engine(target, draft, stop_token_ids=[], config=DecodingConfig(tree=tree))


def test_tree_steps_emit_ar_tokens_in_fewer_forwards(tokenizer, int8_target):
    ids = tokenizer.encode(CODE * 2)
    prompts = [ids[:120], ids[15:160], ids[40:140]]
    draft = quantize_model(
        build_tiny_model(
            len(tokenizer), seed=1, layers=1, dtype=torch.float32, hidden=256, heads=8, kv_heads=2
        )
    )
    chains, trees = engine(int8_target, "off", draft), engine(int8_target, 16, draft)
    forwards = {"off": 0, 16: 0}
    recycled = 0
    for prompt in prompts:
        expected = chains.generate(GenerationRequest(list(prompt), 40, strategy="ar")).tokens
        for strategy in ("ngram", "hybrid"):
            chain = chains.generate(GenerationRequest(list(prompt), 40, strategy=strategy))
            tree = trees.generate(GenerationRequest(list(prompt), 40, strategy=strategy))
            assert chain.tokens == expected and tree.tokens == expected, strategy
            forwards["off"] += chain.stats.target_forwards
            forwards[16] += tree.stats.target_forwards
            recycled += tree.stats.accepted_by_source["recycled"]
            assert chain.stats.drafted_by_source["recycled"] == 0
        # `ar` is the reference: it never grows trees.
        plain = trees.generate(GenerationRequest(list(prompt), 40, strategy="ar"))
        assert plain.tokens == expected and plain.stats.drafted_by_source["recycled"] == 0
    assert recycled > 0 and forwards[16] < forwards["off"]


def test_sampling_and_copy_sources_stay_chains(tokenizer, int8_target):
    trees = engine(int8_target, 16)
    prompt = tokenizer.encode(CODE)[:100]
    sampled = trees.generate(
        GenerationRequest(list(prompt), 20, strategy="ngram", temperature=0.8, seed=3)
    )
    assert sampled.stats.drafted_by_source["recycled"] == 0
    copy = tokenizer.encode(CODE)[100:160]
    copied = trees.generate(GenerationRequest(list(prompt), 30, strategy="ngram", copy_source=copy))
    assert copied.stats.drafted_by_source["copy"] > 0


def test_a_tree_keeps_the_nodes_its_odds_and_the_forward_costs_pay_for():
    chances = [1.0, 0.5, 0.25, 0.1, 0.05]
    # Each node adds 5 ms to a 100 ms forward: the fourth (0.1 tokens) still pays, the fifth
    # (0.05 tokens for 5 ms, against 1.85 tokens for 115 ms) does not.
    assert worth_its_cost(chances, lambda n: 100.0 + 5 * (n - 1)) == 4
    assert worth_its_cost(chances, lambda n: 100.0) == 5  # free: all of them
    assert worth_its_cost(chances, lambda n: 100.0 * 1.6 ** (n - 1)) == 1  # dear: a step
    # build_tree cuts the best-first tree there; the cut keeps a tree (no child past it).
    recycler = _recycler_after_7_20_21()
    full = build_tree(None, 7, [20, 30, 99], recycler, size=8, max_depth=3, chain_rate=0.5)
    cut = build_tree(
        None, 7, [20, 30, 99], recycler, size=8, max_depth=3, chain_rate=0.5,
        forward_ms=lambda n: 100.0 if n <= 3 else 1000.0,
    )  # fmt: skip
    assert len(cut) == 3 and cut.tokens == full.tokens[:3] and cut.chances == full.chances[:3]
    assert all(child < 3 for kids in cut.children for child in kids.values())
    logits = torch.zeros(3, 200)
    logits[0, 20] = logits[1, 30] = logits[2, 99] = 1.0
    assert accept_tree(cut, logits) == ([20, 30, 99], [1, 2])


def test_auto_trees_are_cut_where_wider_forwards_stop_paying(tokenizer, int8_target):
    """`auto` on a machine where a forward of 4 costs a step and one of 8 or 16 half again:
    trees may hold 16 (within TREE_MAX_STEPS) but keep only the nodes that pay, so they verify
    fewer nodes than trees of a fixed 16, and still emit plain decoding's tokens."""
    costs = CostModel({1: 100.0, 2: 100.0, 4: 100.0, 8: 150.0, 16: 150.0, 32: 400.0}, measured=True)
    assert costs.tree_tokens() == 16
    prompt = tokenizer.encode(CODE * 2)[:120]
    nodes = {}
    for setting in ("auto", 16):
        trees = engine(int8_target, setting)
        trees.cost_model = costs
        sizes = []
        forward_tree = trees.target.forward_tree
        trees.target.forward_tree = lambda t, p, s=sizes, f=forward_tree, **kw: (
            s.append(len(t)) or f(t, p, **kw)
        )
        expected = trees.generate(GenerationRequest(list(prompt), 40, strategy="ar")).tokens
        result = trees.generate(GenerationRequest(list(prompt), 40, strategy="ngram"))
        assert result.tokens == expected, setting
        assert sizes and max(sizes) <= 16, setting
        nodes[setting] = sum(sizes)
    assert nodes["auto"] < nodes[16]


def test_cost_model_sizes_the_tree_from_measured_costs():
    amx = CostModel({1: 94.1, 2: 96.9, 4: 101.8, 8: 106.8, 16: 121.0, 32: 163.6}, measured=True)
    assert amx.tree_tokens() == 16  # 32 tokens cost 1.74 steps: over 1.5
    gpu = CostModel({1: 10.0, 2: 10.0, 4: 10.1, 8: 10.2, 16: 10.5, 32: 11.5}, measured=True)
    assert gpu.tree_tokens() == 32
    avx2 = CostModel({1: 80.0, 2: 120.0, 4: 190.0, 8: 330.0, 16: 690.0, 32: 1300.0}, measured=True)
    assert avx2.tree_tokens() == 0
    assert CostModel.estimate(has_draft=False).tree_tokens() == 0  # nothing measured
    # `auto` on an unmeasured machine: chains, like before.
    tokenizer = build_tiny_tokenizer()
    target = quantize_model(build_tiny_model(len(tokenizer), seed=0, dtype=torch.float32))
    chains = engine(target, "auto")
    prompt = tokenizer.encode(CODE)[:60]
    result = chains.generate(GenerationRequest(prompt, 10, strategy="ngram"))
    assert result.stats.drafted_by_source["recycled"] == 0
    # No tree can grow, so no forward's runner-up tokens are kept for one (no top-k per step).
    assert all(chains.recycled.after(None, token) == [] for token in [*prompt, *result.tokens])


def test_tree_setting_is_validated():
    assert load_config({"decoding": {"tree": "off"}}).decoding.tree == "off"
    assert load_config({"decoding": {"tree": 8}}).decoding.tree == 8
    for wrong in ("sometimes", 1, 65, True):
        with pytest.raises(ConfigError, match="tree"):
            load_config({"decoding": {"tree": wrong}})

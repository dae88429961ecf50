"""The n-gram index: longest match first, most recent source wins, incremental == rebuild."""

from __future__ import annotations

import random

from quickdraft.decoding import NgramIndex


def snapshot(index: NgramIndex, probes) -> list:
    return [index.lookup(p, 6) for p in probes]


def test_longest_suffix_match_wins():
    index = NgramIndex(min_n=1, max_n=4)
    index.set_source("a", [1, 2, 3, 9, 9])  # "2 3" continues with 9
    index.set_source("b", [7, 2, 3, 5, 5])  # "7 2 3" continues with 5 (longer match)
    match = index.lookup([7, 2, 3], 2)
    assert match.tokens == [5, 5] and match.match_length == 3 and match.source == "b"
    match = index.lookup([0, 2, 3], 2)
    # Both sources hold "2 3"; b was indexed last, so it is the most recent.
    assert match.match_length == 2 and match.source == "b"


def test_most_recent_source_and_position_win_ties():
    index = NgramIndex(min_n=2, max_n=3)
    index.set_source("old", [4, 5, 1])
    index.set_source("new", [4, 5, 2, 4, 5, 3])
    # Within "new", the later occurrence of "4 5" (followed by 3) wins.
    assert index.lookup([4, 5], 1).tokens == [3]
    index.set_source("old", [4, 5, 1, 0])  # updating "old" makes it the most recent
    assert index.lookup([4, 5], 1).tokens == [1]
    index.remove_source("old")
    assert index.lookup([4, 5], 1).tokens == [3]


def test_minimum_match_length_and_no_match():
    index = NgramIndex(min_n=3, max_n=5)
    index.set_source("a", [1, 2, 3, 4])
    assert index.lookup([2, 3], 2) is None  # only 2 tokens match, below min_n
    assert index.lookup([1, 2, 3], 2).tokens == [4]
    assert index.lookup([9, 9, 9], 2) is None
    assert index.lookup([1, 2, 3], 0) is None


def test_the_suffix_itself_is_not_proposed():
    index = NgramIndex(min_n=2, max_n=4)
    index.set_source("live", [1, 2, 3])
    assert index.lookup([1, 2, 3], 3) is None  # "2 3" has no continuation yet
    index.extend_source("live", [8, 2, 3])
    assert index.lookup([1, 2, 3, 8, 2, 3], 2).tokens == [8, 2]


class BruteForceIndex:
    """The reference: scan every source; the most recently indexed occurrence wins."""

    def __init__(self, min_n, max_n):
        self.min_n, self.max_n = min_n, max_n
        self.docs: dict[str, tuple[list[int], list[int]]] = {}
        self.clock = 0

    def _stamps(self, count):
        stamps = list(range(self.clock, self.clock + count))
        self.clock += count
        return stamps

    def set_source(self, name, tokens):
        if name in self.docs and self.docs[name][0] == list(tokens):
            return
        self.docs[name] = (list(tokens), self._stamps(len(tokens)))

    def extend_source(self, name, more):
        tokens, stamps = self.docs[name]
        self.docs[name] = (tokens + list(more), stamps + self._stamps(len(more)))

    def remove_source(self, name):
        self.docs.pop(name, None)

    def lookup(self, context, k):
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            latest = []  # per source, its most recently indexed occurrence
            for name, (tokens, stamps) in self.docs.items():
                hits = [i for i in range(n, len(tokens)) if tokens[i - n : i] == list(context[-n:])]
                if hits:
                    i = max(hits, key=lambda i: stamps[i])
                    latest.append((stamps[i], tokens[i : i + k], name))
            if latest:
                latest.sort(key=lambda hit: hit[0], reverse=True)
                full = [hit for hit in latest if len(hit[1]) >= k]
                # Newest full-length proposal, else the longest (newest among equals).
                stamp, tokens, name = (
                    full[0] if full else max(latest, key=lambda h: (len(h[1]), h[0]))
                )
                return tokens, n, name
        return None


def test_a_full_length_proposal_beats_a_newer_short_one():
    index = NgramIndex(min_n=2, max_n=3)
    index.set_source("doc", [4, 5, 6, 7, 8, 9])
    index.set_source("live", [1, 4, 5, 6])  # newest, but "4 5" is followed by one token only
    assert index.lookup([4, 5], 3).tokens == [6, 7, 8]
    assert index.lookup([4, 5], 1).source == "live"
    index.set_source("doc", [4, 5])  # no continuation left elsewhere: the short one is used
    assert index.lookup([4, 5], 3).tokens == [6]


def test_incremental_updates_equal_a_full_rebuild():
    rng = random.Random(0)
    incremental = NgramIndex(min_n=2, max_n=5)
    reference = BruteForceIndex(2, 5)
    for step in range(150):
        name = f"doc{rng.randrange(6)}"
        action = rng.random()
        if action < 0.15:
            incremental.remove_source(name)
            reference.remove_source(name)
        elif action < 0.5 and name in reference.docs:
            more = [rng.randrange(8) for _ in range(rng.randint(1, 6))]
            incremental.extend_source(name, more)
            reference.extend_source(name, more)
        else:
            tokens = [rng.randrange(8) for _ in range(rng.randint(0, 40))]
            incremental.set_source(name, tokens)
            reference.set_source(name, tokens)
        if step % 10 == 0:
            completion = [rng.randrange(8) for _ in range(6)]
            incremental.add_completion(completion)
            reference.set_source(f"completion:{step // 10 + 1}", completion)
        probes = [[rng.randrange(8) for _ in range(rng.randint(2, 7))] for _ in range(20)]
        for probe in probes:
            got = incremental.lookup(probe, 4)
            want = reference.lookup(probe, 4)
            assert (got.tokens, got.match_length, got.source) == want if got else want is None
    # Removing every source leaves an empty table: nothing leaks.
    for source in incremental.sources:
        incremental.remove_source(source)
    assert incremental._table == {}


def test_completions_are_bounded():
    index = NgramIndex(min_n=2, max_n=3, max_completions=3)
    for i in range(10):
        index.add_completion([100 + i, 1, 2, 3])
    assert len([s for s in index.sources if s.startswith("completion:")]) == 3
    assert index.lookup([109, 1], 1).tokens == [2]
    assert index.lookup([100, 1], 1) is None  # the oldest completions were forgotten


def test_continuations_differ_in_their_first_token_longest_match_first():
    index = NgramIndex(min_n=1, max_n=4)
    index.set_source("a", [1, 2, 3, 9, 8])  # "2 3" then 9
    index.set_source("b", [7, 2, 3, 5, 5, 3, 6])  # "7 2 3" then 5; "3" alone then 6 last
    found = index.continuations([7, 2, 3], 2, limit=5)
    assert [m.tokens for m in found] == [[5, 5], [9, 8], [6]]
    assert [m.match_length for m in found] == [3, 2, 1]
    assert found[0].tokens == index.lookup([7, 2, 3], 2).tokens  # the first is lookup's
    assert len(index.continuations([7, 2, 3], 2, limit=2)) == 2
    assert index.continuations([4, 4], 2, limit=3) == []

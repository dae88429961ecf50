"""Prompt-lookup drafting: propose what followed the same tokens elsewhere.

Code repeats itself: the continuation often already stands in the prompt, in another open file
(a stub, a test, the function above) or in a completion accepted a minute ago. The index maps
every n-gram (min_n <= n <= max_n) of every source to the position that followed it, so a lookup
is a handful of hash probes whatever the number of open documents:

    table[hash(tokens[i-n:i])] = {source: i, ...}   # i: where the continuation starts

Within a source the latest occurrence overwrites earlier ones; across sources, a dict's order is
its insertion order and every (re)indexed source is re-inserted at the end, so the last entry is
the most recently updated source. A hash collision can only produce a wrong proposal, which
verification rejects; it can never change the output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

LIVE = "live"
"""The source holding the current request's prompt up to the cursor and the tokens generated
so far: the text the completion continues."""
LIVE_AFTER = "live:after"
"""The rest of the current request's prompt (a FIM prompt's suffix section)."""


@dataclass(frozen=True)
class NgramMatch:
    tokens: list[int]
    """Proposed continuation (at least one token)."""
    match_length: int
    """How many trailing context tokens matched (n)."""
    source: str


class NgramIndex:
    def __init__(self, min_n: int = 2, max_n: int = 8, max_completions: int = 16) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._table: dict[int, dict[str, int]] = {}
        self._tokens: dict[str, list[int]] = {}
        self._indexed: dict[str, int] = {}  # source -> continuation positions indexed so far
        self._completions: deque[str] = deque()
        self._completion_serial = 0
        self._max_completions = max_completions

    # --- sources -------------------------------------------------------------------------

    @property
    def sources(self) -> list[str]:
        return list(self._tokens)

    def set_source(self, source: str, tokens: Sequence[int]) -> None:
        """Add `source`, or replace its tokens. Only this source is re-indexed."""
        tokens = list(tokens)
        if self._tokens.get(source) == tokens:
            return
        self.remove_source(source)
        self._tokens[source] = tokens
        self._indexed[source] = 0
        self._index_new_positions(source)

    def extend_source(self, source: str, more: Sequence[int]) -> None:
        """Append tokens to a source, indexing only the new positions."""
        if source not in self._tokens:
            self.set_source(source, more)
            return
        self._tokens[source].extend(more)
        self._index_new_positions(source)

    def remove_source(self, source: str) -> None:
        tokens = self._tokens.pop(source, None)
        indexed = self._indexed.pop(source, 0)
        if tokens is None:
            return
        for i in range(indexed):
            for n in range(self.min_n, min(self.max_n, i) + 1):
                key = hash(tuple(tokens[i - n : i]))
                entry = self._table.get(key)
                if entry is not None and entry.pop(source, None) is not None and not entry:
                    del self._table[key]

    def add_completion(self, tokens: Sequence[int]) -> None:
        """Remember an accepted completion as a source; only the most recent few are kept."""
        if len(tokens) <= self.min_n:
            return
        self._completion_serial += 1
        source = f"completion:{self._completion_serial}"
        self.set_source(source, tokens)
        self._completions.append(source)
        while len(self._completions) > self._max_completions:
            self.remove_source(self._completions.popleft())

    def forget_completions(self) -> None:
        """Drop every remembered completion (a benchmark's cold start needs this)."""
        while self._completions:
            self.remove_source(self._completions.popleft())

    def _index_new_positions(self, source: str) -> None:
        tokens = self._tokens[source]
        table = self._table
        start = self._indexed[source]
        # Position i gets an entry only once tokens[i] exists: a key must have a continuation.
        for i in range(start, len(tokens)):
            for n in range(self.min_n, min(self.max_n, i) + 1):
                key = hash(tuple(tokens[i - n : i]))
                entry = table.get(key)
                if entry is None:
                    table[key] = {source: i}
                else:
                    entry.pop(source, None)  # re-insert: this source is now the most recent
                    entry[source] = i
        self._indexed[source] = len(tokens)

    # --- lookup --------------------------------------------------------------------------

    def lookup(self, context: Sequence[int], k: int, min_n: int | None = None) -> NgramMatch | None:
        """The continuation of the longest suffix of `context` found in any source.

        Longest match first; among sources holding that n-gram, the most recently updated one
        that can propose all k tokens wins (a match near the end of the live sequence may have
        only a token or two after it), else the one proposing the most.
        """
        if k < 1:
            return None
        best: NgramMatch | None = None
        for n, source, position in self._hits(context, max(self.min_n, min_n or self.min_n)):
            if best is not None and n < best.match_length:
                return best  # the longest match's sources are all seen
            continuation = self._tokens[source][position : position + k]
            if len(continuation) >= k:
                return NgramMatch(continuation, n, source)
            if best is None or len(continuation) > len(best.tokens):
                best = NgramMatch(continuation, n, source)
        return best

    def _hits(self, context: Sequence[int], lowest: int) -> Iterator[tuple[int, str, int]]:
        """(n, source, position) for every source holding the last n tokens of `context` just
        before `position`: longest n first, the most recently updated source first within
        one n; hash collisions left out."""
        for n in range(min(self.max_n, len(context)), lowest - 1, -1):
            entry = self._table.get(hash(tuple(context[len(context) - n :])))
            if not entry:
                continue
            suffix = list(context[len(context) - n :])
            for source, position in reversed(entry.items()):
                if self._tokens[source][position - n : position] == suffix:
                    yield n, source, position

    def continuations(self, context: Sequence[int], k: int, limit: int) -> list[NgramMatch]:
        """Up to `limit` continuations (at most k tokens each) of suffixes of `context`, each
        with another first token: longest match first, newest source first within a length, so
        the first is what `lookup` proposes wherever a source can propose all k. A tree checks
        the others as branches of their own (decoding/tree.py)."""
        found: list[NgramMatch] = []
        firsts: set[int] = set()
        if k < 1 or limit < 1:
            return found
        for n, source, position in self._hits(context, self.min_n):
            continuation = self._tokens[source][position : position + k]
            if not continuation or continuation[0] in firsts:
                continue
            firsts.add(continuation[0])
            found.append(NgramMatch(continuation, n, source))
            if len(found) >= limit:
                break
        return found

"""Copy drafting: where the output stands in a text it mostly copies, and what comes next there.

A next edit rewrites a region of the file, and most of the rewrite is the region as it stands:
the region itself is the draft. While the output agrees with the source, the source's next
tokens are proposed, as many as asked. When the output departs (an edit: a token replaced, a
line inserted or deleted), the aligner looks for where the output rejoins the source: the
longest n-gram of the last output tokens (max_n down to min_n) that occurs in the source, at
the occurrence nearest after the point of departure (an edit usually replaces a few tokens and
the rest continues), else the nearest before it. Until one occurs it proposes nothing.

    source   a b c d e f g h          output  a b c X Y e f ...
    aligned  0 1 2 3                  departs at 3 (d), lost for X Y e,
                                      "Y e"? no; "e f" ends at 6 >= 3: aligned at 6 (g)

The source's n-grams are indexed once (n-gram -> the positions right after each occurrence,
ascending), so a step costs a few dict probes and a bisection. A wrong realignment can only
cost a rejected draft: verification decides what is emitted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence

from quickdraft.decoding.costmodel import AcceptanceTracker

COPY_MIN_N = 2
COPY_MAX_N = 8


class CopyAligner:
    """Tracks the output's position in `source`; `advance` with every emitted token."""

    def __init__(
        self, source: Sequence[int], min_n: int = COPY_MIN_N, max_n: int = COPY_MAX_N
    ) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.source = [int(t) for t in source]
        self.min_n = min_n
        self.max_n = max_n
        self.position: int | None = 0
        """The index of the source token the output is expected to produce next (the length of
        the source once it is all copied); None while the output stands nowhere in it."""
        self._departed = 0
        """Where the output last left the source: realignment prefers matches after it."""
        self._recent: deque[int] = deque(maxlen=max_n)
        self.acceptance = AcceptanceTracker()
        """This request's copy acceptance, from the prior up. How well one rewrite follows its
        source says nothing about the next one; a shared tracker that fell below what drafting
        needs would never draft again to learn otherwise (a real run stopped copying after
        its first request)."""
        self._ends: dict[tuple[int, ...], list[int]] = {}
        """n-gram -> the positions right after its occurrences, ascending."""
        for end in range(min_n, len(self.source) + 1):
            for n in range(min_n, min(max_n, end) + 1):
                self._ends.setdefault(tuple(self.source[end - n : end]), []).append(end)

    @property
    def aligned(self) -> bool:
        return self.position is not None

    def propose(self, k: int) -> list[int]:
        """The source's next `k` tokens (fewer near its end); none while not aligned."""
        if self.position is None or k < 1:
            return []
        return self.source[self.position : self.position + k]

    def advance(self, tokens: Sequence[int]) -> None:
        """Follow the output by `tokens`, its newly emitted tokens."""
        for token in tokens:
            self._recent.append(int(token))
            position = self.position
            if position is not None:
                if position < len(self.source) and self.source[position] == token:
                    self.position = position + 1
                    continue
                self._departed = position
            self.position = self._rejoin()

    def _rejoin(self) -> int | None:
        """Where the output's last tokens continue in the source: the longest n-gram that
        occurs, nearest at or after the point of departure, else nearest before it."""
        recent = tuple(self._recent)
        for n in range(min(self.max_n, len(recent)), self.min_n - 1, -1):
            ends = self._ends.get(recent[len(recent) - n :])
            if ends:
                i = bisect_left(ends, self._departed)
                return ends[i] if i < len(ends) else ends[-1]
        return None

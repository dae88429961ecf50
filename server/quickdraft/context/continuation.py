"""What followed the text before the cursor elsewhere: a first draft, found by characters.

Token-level prompt lookup stumbles right at the cursor: the text before it often ends inside
what would be one token in a finished file (`from ` then `"../x"` is tokenized ` "../` in the
file that has it, but the model, starting after the space, writes `"../`). So before the first
token the continuation is looked up in the documents' *text*: the longest stretch of text
that ends the way the text before the cursor ends, and what follows it there, tokenized on its
own as the model would write it. The engine proposes it while its output agrees.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

SEED_CHARS = 6
"""Occurrences are found by the last SEED_CHARS characters, then extended backwards."""
MIN_MATCH_CHARS = 8
"""A shorter match says too little about what comes next."""
MAX_MATCH_CHARS = 256
MAX_CONTINUATION_CHARS = 400
MAX_OCCURRENCES = 400
"""Per document: a common seed (indentation, `) {`) is not worth scanning everywhere."""


@dataclass(frozen=True)
class Continuation:
    text: str
    """What followed the match."""
    match_chars: int
    """How many characters before the cursor matched."""
    source: str
    """The document it came from."""


def find_continuation(
    before_cursor: str,
    documents: Iterable[tuple[str, str, int | None]],
) -> Continuation | None:
    """The longest match for the end of `before_cursor` in `documents` and what follows it.

    `documents`: (name, text, cursor) where `cursor` is the offset of the request's own cursor
    in that text (the match ending there is the text before the cursor itself, not a copy), or
    None. The first document wins ties, so pass the current one first.
    """
    if len(before_cursor) < SEED_CHARS:
        return None
    tail = before_cursor[-MAX_MATCH_CHARS:]
    reversed_tail = tail[::-1]
    seed = tail[-SEED_CHARS:]
    best: Continuation | None = None
    best_length = MIN_MATCH_CHARS - 1
    for name, text, cursor in documents:
        start, seen = 0, 0
        while seen < MAX_OCCURRENCES:
            found = text.find(seed, start)
            if found < 0:
                break
            seen += 1
            start = found + 1
            end = found + SEED_CHARS
            if end == cursor or end >= len(text):
                continue
            window = text[max(0, end - len(tail)) : end][::-1]
            length = len(os.path.commonprefix([window, reversed_tail]))
            if length > best_length:
                best_length = length
                best = Continuation(text[end : end + MAX_CONTINUATION_CHARS], length, name)
    return best

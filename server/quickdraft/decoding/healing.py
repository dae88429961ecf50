"""Token healing: the first generated tokens must spell text that is known already.

A prompt that ends inside a word (`ar` of `args`) ends on a token the model would never have
produced there: after `ar` it cannot write `gs`, because in its training data `args` was one
token. So the prompt is backed off to the last token boundary before the cursor, and generation
is constrained until it has reproduced the characters removed (`required`, as bytes): while
`remaining` bytes are owed, a token is allowed only if its bytes start with them (`args` after
`ar` was removed) or are a start of them (`a`, then `rgs...`). Special tokens are never allowed
while anything is owed.

The same constraint applies to every strategy and to both the target and the draft model, at
every position of a verify forward (the owed bytes follow the drafted path), so greedy output
stays the target's own constrained greedy output token for token, and sampling samples from the
target's constrained (renormalized) distribution.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

import torch


class TokenBytes:
    """Every token id's bytes, indexed for "which tokens are consistent with these bytes"."""

    def __init__(self, token_bytes: Sequence[bytes | None], vocab_size: int | None = None):
        """`token_bytes[i]`: what token i spells, or None for a special token (never allowed
        under a constraint). `vocab_size`: the logits' width (ids past the table: disallowed)."""
        self.token_bytes = list(token_bytes)
        self.vocab_size = vocab_size or len(self.token_bytes)
        pairs = sorted((b, i) for i, b in enumerate(self.token_bytes) if b)
        self._sorted = [b for b, _ in pairs]
        self._sorted_ids = [i for _, i in pairs]
        self._exact: dict[bytes, list[int]] = {}
        for b, i in pairs:
            self._exact.setdefault(b, []).append(i)
        self._masks: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def blank(self, token: int) -> bool:
        """Whether `token` spells whitespace only (not a special token)."""
        spelled = self.token_bytes[token] if 0 <= token < len(self.token_bytes) else None
        return spelled is not None and not spelled.strip()

    def allowed_ids(self, remaining: bytes) -> list[int]:
        """Tokens whose bytes start with `remaining`, or are a non-empty start of it."""
        ids: list[int] = []
        # Byte strings starting with `remaining` sort in [remaining, its successor).
        low = bisect.bisect_left(self._sorted, remaining)
        after = _successor(remaining)
        high = len(self._sorted) if after is None else bisect.bisect_left(self._sorted, after)
        ids.extend(self._sorted_ids[low:high])
        for end in range(1, len(remaining)):
            ids.extend(self._exact.get(remaining[:end], ()))
        return ids

    def mask(self, remaining: bytes) -> torch.Tensor:
        """A bool mask over the vocabulary (True: allowed) for `remaining` owed bytes."""
        cached = self._masks.get(remaining)
        if cached is not None:
            self._masks.move_to_end(remaining)
            return cached
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        ids = [i for i in self.allowed_ids(remaining) if i < self.vocab_size]
        if ids:
            mask[torch.tensor(ids)] = True
        self._masks[remaining] = mask
        if len(self._masks) > 64:
            self._masks.popitem(last=False)
        return mask

    def advance(self, remaining: bytes, token: int) -> bytes:
        """The bytes still owed after `token` (which must be allowed)."""
        spelled = self.token_bytes[token] if token < len(self.token_bytes) else None
        if not spelled:
            return remaining
        if spelled.startswith(remaining):
            return b""
        if remaining.startswith(spelled):
            return remaining[len(spelled) :]
        return remaining  # not allowed: verification rejects it before it counts


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with `prefix` (None: no
    such string, the prefix being all 0xff)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def constrain(
    logits: torch.Tensor, table: TokenBytes, remaining: bytes, drafted: Sequence[int]
) -> torch.Tensor:
    """Mask the rows of a verify forward's logits (k+1, V): row i is judged with the bytes
    still owed after the first i drafted tokens. Rows where nothing is owed are left alone."""
    if not remaining:
        return logits
    out = logits.clone()
    owed = remaining
    for row in range(logits.shape[0]):
        if not owed:
            break
        mask = table.mask(owed).to(out.device)
        width = min(out.shape[-1], mask.shape[0])
        out[row, :width].masked_fill_(~mask[:width], float("-inf"))
        if out.shape[-1] > width:
            out[row, width:] = float("-inf")
        if row < len(drafted):
            owed = table.advance(owed, drafted[row])
    return out

"""The typed-ahead cache: answers from work done before a request, on the event loop.

A suggestion shown is kept, so that while the user types what it says the rest of it is the
answer at once (no model time); a prefetch (lsp/work_ahead.py) keeps here what follows
accepting a suggestion. `CompletionService` looks answers up before it asks the worker.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Suggestion:
    prefix: str
    suffix: str | None
    text: str
    source: str
    confidence: float | None = None


@dataclass(frozen=True)
class TypedAhead:
    """An answer from work done before the request: what to insert ("" when a prefetch found
    the model has nothing to add there), and where it came from ("typed-ahead": the rest of the
    suggestion being typed; "prefetch": computed ahead for the text that accepting a suggestion
    leads to)."""

    text: str
    source: str
    confidence: float | None = None
    """The model's confidence in the whole suggestion it is (part of); for "unsure" (an
    answer stopped under the confidence floor: nothing to show unless asked), in the tokens
    it wrote."""


class TypedAheadCache:
    """Suggestions per document, served again while the user types what one says.

    `remember(uri, prefix, text, suffix)` after a completion (and, with source "prefetch", for
    the text a suggestion's acceptance would give; with "unsure", what an answer stopped
    under the confidence floor had written, or nothing); `lookup(uri, new_prefix, suffix)` returns
    the rest of the suggestion whose prefix the new prefix extends with the start of its text
    (the longest such prefix wins: a prefetched answer beats the rest of an older suggestion),
    and forgets the entries the document has moved away from. The suffix must be unchanged.

    It lives on the language server's event loop (no lock).
    """

    def __init__(self, max_documents: int = 64, per_document: int = 4):
        self.max_documents = max_documents
        self.per_document = per_document
        self._entries: OrderedDict[str, list[_Suggestion]] = OrderedDict()

    def remember(
        self,
        uri: str,
        prefix: str,
        text: str,
        suffix: str | None = None,
        source: str = "typed-ahead",
        confidence: float | None = None,
    ) -> None:
        entries = [e for e in self._entries.get(uri, []) if e.prefix != prefix]
        if text or source in ("prefetch", "unsure"):  # nothing to show here, known ahead
            entries.append(_Suggestion(prefix, suffix, text, source, confidence))
        self._entries[uri] = entries[-self.per_document :]
        self._entries.move_to_end(uri)
        while len(self._entries) > self.max_documents:
            self._entries.popitem(last=False)

    def lookup(self, uri: str, new_prefix: str, suffix: str | None = None) -> TypedAhead | None:
        entries = self._entries.get(uri)
        if not entries:
            return None
        kept: list[_Suggestion] = []
        best: tuple[int, TypedAhead] | None = None
        for entry in entries:
            same_suffix = entry.suffix is None or suffix is None or suffix == entry.suffix
            if same_suffix and entry.prefix.startswith(new_prefix) and entry.prefix != new_prefix:
                kept.append(entry)  # ahead of the cursor (prefetched): may fit later
                continue
            typed = new_prefix[len(entry.prefix) :]
            if not (same_suffix and new_prefix.startswith(entry.prefix)):
                continue
            if not entry.text and not typed:  # the model has nothing to add (or show) here
                kept.append(entry)
                if best is None or len(entry.prefix) > best[0]:
                    best = (len(entry.prefix), TypedAhead("", entry.source, entry.confidence))
                continue
            if not entry.text.startswith(typed) or len(typed) >= len(entry.text):
                continue
            remaining = entry.text[len(typed) :]
            if not remaining.strip():
                continue
            kept.append(entry)
            if best is None or len(entry.prefix) > best[0]:
                # Typing a held-back answer's text keeps it what it is: unsure.
                source = entry.source if not typed or entry.source == "unsure" else "typed-ahead"
                best = (len(entry.prefix), TypedAhead(remaining, source, entry.confidence))
        self._entries[uri] = kept
        return best[1] if best is not None else None

    def invalidate(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def clear(self) -> None:
        self._entries.clear()

"""Snippets of other open documents for the prompt, ranked by similarity to the code at the cursor.

Each open document (never the current one) is cut into overlapping windows of about
`snippet_lines` lines. A window's score is the Jaccard similarity between its identifier set and
that of the lines just above the cursor (keywords and one-letter names left out). The best
windows win, skipping ones that overlap a window already taken from the same document, that are
near-copies of one already taken (similar identifiers, or half their lines already taken), or
whose text already sits in the current document; at most `max_snippets`, within a token budget.

The chosen snippets come back in a stable order (document order, then line), not by score:
the prompt then changes only when the chosen *set* changes, which keeps the prompt's token
prefix (and the engine's KV cache) the same across keystrokes.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from quickdraft.text import LINE_BREAK, too_large

_IDENTIFIER = re.compile(r"[^\W\d]\w*")

# Keywords and very common names of the supported languages: they say nothing about topic.
_STOPWORDS = frozenset(
    re.split(
        r"\s+",
        """
and as assert async await break case catch class const continue def default del do elif
else enum except export extends false final finally fn for from func function go if impl
import in instanceof interface is lambda let match mod mut new nil none not null or package
pass private protected pub public raise return self static struct super switch this throw
true try type typeof use var void while with yield int char bool float double long string
str auto unsigned signed sizeof include define namespace template typename std
""".strip(),
    )
)

NEAR_DUPLICATE = 0.8
"""Two windows whose identifier sets overlap at least this much (Jaccard) count as copies."""


@dataclass(frozen=True)
class Snippet:
    """A window of another document that goes into the prompt."""

    path: str
    text: str
    start_line: int
    """0-based first line of the window in its document."""
    end_line: int
    """0-based line after the window's last line."""
    score: float
    language_id: str | None = None


@dataclass(frozen=True)
class OpenDocument:
    """The fields of an open document that context building reads."""

    path: str
    text: str
    language_id: str | None = None


def uri_to_path(uri_or_path: str) -> str:
    """A filesystem-style path for a `file://` URI (percent-decoded); other strings unchanged."""
    if uri_or_path.startswith("file:"):
        parsed = urlparse(uri_or_path)
        path = unquote(parsed.path)
        if re.match(r"^/[A-Za-z]:", path):  # file:///C:/x -> C:/x
            path = path[1:]
        return path
    return uri_or_path


def as_open_document(document: Any) -> OpenDocument:
    """Read an open document given as an object or a dict with `path` or `uri`, `text` and
    `language_id` (or `languageId`)."""
    if isinstance(document, OpenDocument):
        return document
    if isinstance(document, dict):
        get = document.get
    else:

        def get(name: str, default: Any = None) -> Any:
            return getattr(document, name, default)

    path = get("path") or get("uri") or ""
    language_id = get("language_id") or get("languageId")
    return OpenDocument(
        path=uri_to_path(str(path)), text=str(get("text") or ""), language_id=language_id
    )


def identifier_tokens(text: str) -> frozenset[str]:
    """The identifiers in `text`, without keywords and one-letter names."""
    return frozenset(
        word
        for word in _IDENTIFIER.findall(text)
        if len(word) > 1 and word.lower() not in _STOPWORDS
    )


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


# (text, window lines) -> [(start, end, window text, identifiers)]; documents rarely change
# between two requests, so their windows are cut once.
_WINDOW_CACHE: OrderedDict[tuple[str, int], list[tuple[int, int, str, frozenset[str]]]] = (
    OrderedDict()
)
_WINDOW_CACHE_SIZE = 64


def _windows(text: str, lines_per_window: int) -> list[tuple[int, int, str, frozenset[str]]]:
    key = (text, lines_per_window)
    cached = _WINDOW_CACHE.get(key)
    if cached is not None:
        _WINDOW_CACHE.move_to_end(key)
        return cached
    lines = LINE_BREAK.split(text)
    stride = max(1, lines_per_window // 2)
    windows = []
    start = 0
    while start < len(lines):
        end = min(start + lines_per_window, len(lines))
        first, last = start, end
        while first < last and not lines[first].strip():
            first += 1
        while last > first and not lines[last - 1].strip():
            last -= 1
        if first < last:
            chunk = "\n".join(lines[first:last])
            tokens = identifier_tokens(chunk)
            if tokens:
                windows.append((first, last, chunk, tokens))
        if end == len(lines):
            break
        start += stride
    _WINDOW_CACHE[key] = windows
    if len(_WINDOW_CACHE) > _WINDOW_CACHE_SIZE:
        _WINDOW_CACHE.popitem(last=False)
    return windows


def _significant_lines(chunk: str) -> set[str]:
    """The window's lines that say something (stripped, at least 4 characters)."""
    return {stripped for line in chunk.split("\n") if len(stripped := line.strip()) >= 4}


def select_snippets(
    query: str,
    documents: Iterable[Any],
    *,
    current_path: str | None = None,
    current_text: str | None = None,
    max_snippets: int = 4,
    snippet_lines: int = 24,
    token_budget: int | None = None,
    cost: Callable[[Snippet], int] | None = None,
    max_document_bytes: int = 2_000_000,
    min_score: float = 0.05,
) -> list[Snippet]:
    """Choose up to `max_snippets` windows of `documents` most similar to `query`.

    `current_path`/`current_text` identify the document being completed: it is never used, and
    windows whose text already occurs in `current_text` are skipped. `cost(snippet)` is what a
    snippet takes from `token_budget` (both None: no budget). Returns snippets in document
    order, then line order.
    """
    if max_snippets <= 0 or (token_budget is not None and token_budget <= 0):
        return []
    wanted = identifier_tokens(query)
    if not wanted:
        return []
    current = uri_to_path(current_path) if current_path else None

    candidates: list[tuple[float, int, int, int, str, frozenset[str], OpenDocument]] = []
    for order, raw in enumerate(documents):
        document = as_open_document(raw)
        if current is not None and document.path == current:
            continue
        if current_text is not None and document.text == current_text:
            continue
        if not document.text or too_large(document.text, max_document_bytes):
            continue
        for start, end, chunk, tokens in _windows(document.text, snippet_lines):
            score = jaccard(wanted, tokens)
            if score >= min_score:
                candidates.append((score, order, start, end, chunk, tokens, document))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))

    chosen: list[tuple[int, Snippet, frozenset[str]]] = []
    taken_lines: set[str] = set()
    used = 0
    for score, order, start, end, chunk, tokens, document in candidates:
        if len(chosen) >= max_snippets:
            break
        if any(o == order and start < s.end_line and s.start_line < end for o, s, _ in chosen):
            continue  # overlaps a window already taken from the same document
        if any(jaccard(tokens, t) >= NEAR_DUPLICATE for _, _, t in chosen):
            continue
        lines = _significant_lines(chunk)
        if lines and len(lines & taken_lines) * 2 >= len(lines):
            continue  # half of it is already in the prompt (a copy in another file)
        if current_text is not None and chunk.strip() in current_text:
            continue
        snippet = Snippet(document.path, chunk, start, end, round(score, 6), document.language_id)
        if token_budget is not None and cost is not None:
            price = cost(snippet)
            if used + price > token_budget:
                continue
            used += price
        chosen.append((order, snippet, tokens))
        taken_lines |= lines
    chosen.sort(key=lambda c: (c[0], c[1].start_line))
    return [snippet for _, snippet, _ in chosen]

"""Build the prompt for one completion request: current file around the cursor, plus snippets.

Budget (`ContextConfig`): the whole prompt stays within `max_prompt_tokens`. Snippets of other
documents get up to `snippet_share` of it; the current file gets the rest, split `suffix_share`
for the text after the cursor and the remainder for the text before it (a part that needs less
than its share leaves the rest to the other).

Trimming removes whole lines: the prefix loses lines at the top, the suffix at the bottom. The
prefix's first line is picked to be *stable*: the engine reuses its KV cache for the longest
common token prefix of consecutive prompts, and a window that slid down by a line on every
keystroke would throw that away each time. So the earliest line that fits is rounded up to a
grid of G lines (G: a power of two worth about half the slack below), and from that grid line
on the prefix starts at the first top-level statement (tree-sitter; blank-line paragraphs in plain
text), else the first nested statement, else the grid line itself. The start then moves once
per G lines of progress instead of every line. At most `1 / SLACK_DIVISOR` of the prefix budget
is given up for that.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from quickdraft.config import ContextConfig
from quickdraft.context import syntax
from quickdraft.context.fim import FimTemplate
from quickdraft.context.snippets import Snippet, as_open_document, select_snippets, uri_to_path
from quickdraft.errors import PositionError

SLACK_DIVISOR = 4
"""Up to 1/SLACK_DIVISOR of the prefix budget may go unused to start at a stable boundary."""
REGION_LOOKBACK = 400
"""Boundaries come from parsing the region of interest, starting up to this many lines above."""

_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")


@dataclass
class Prompt:
    """What goes to the model, and the pieces it was made of."""

    text: str
    """The rendered prompt."""
    prefix: str
    """Current document text before the cursor that made it into the prompt."""
    suffix: str
    """Current document text after the cursor that made it into the prompt."""
    snippets: list[Snippet] = field(default_factory=list)
    prefix_start_line: int = 0
    """0-based document line the prefix starts at (0 = not trimmed at the top)."""
    suffix_end_line: int = 0
    """0-based document line after the suffix's last line (the line count = not trimmed)."""
    language: str | None = None
    """The grammar used for boundaries (None: plain text)."""
    prompt_tokens: int = 0
    """count_tokens(text)."""
    prefix_truncated: bool = False
    suffix_truncated: bool = False


def split_lines(text: str) -> tuple[list[str], list[str]]:
    """(line contents, line endings) with LSP's line breaks: \\r\\n, \\r and \\n."""
    if "\r" not in text:
        contents = text.split("\n")
        endings = ["\n"] * (len(contents) - 1) + [""]
        return contents, endings
    parts = _LINE_BREAK.split(text)
    return parts[0::2], parts[1::2] + [""]


def _display_path(path: str | None, documents: Sequence[Any]) -> tuple[str | None, dict[str, str]]:
    """Paths as shown in the prompt: relative to the common folder of all open documents."""
    paths = [as_open_document(d).path for d in documents]
    current = uri_to_path(path) if path else None
    every = [p for p in [current, *paths] if p]
    root = ""
    absolute = [p for p in every if p.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", p)]
    if absolute and len(absolute) == len(every):
        try:
            root = os.path.commonpath([os.path.dirname(p) for p in absolute])
        except ValueError:
            root = ""

    def show(p: str) -> str:
        if root and p.startswith(root):
            rest = p[len(root) :].lstrip("/\\")
            return rest or p
        return p

    return (show(current) if current else None), {p: show(p) for p in paths if p}


class _Counter:
    """count_tokens with a memo: the same lines come back request after request."""

    def __init__(self, count_tokens: Callable[[str], int]):
        self.count_tokens = count_tokens
        self.memo: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        value = self.memo.get(text)
        if value is None:
            value = self.memo[text] = self.count_tokens(text)
        return value


def _keep_tail(text: str, budget: int, count: _Counter) -> str:
    """The longest tail of `text` within `budget` tokens (binary search on the start)."""
    if budget <= 0:
        return ""
    low, high = 0, len(text)  # invariant: text[high:] fits
    while low < high:
        mid = (low + high) // 2
        if count.count_tokens(text[mid:]) <= budget:
            high = mid
        else:
            low = mid + 1
    return text[high:]


def _keep_head(text: str, budget: int, count: _Counter) -> str:
    """The longest head of `text` within `budget` tokens."""
    if budget <= 0:
        return ""
    low, high = 0, len(text)  # invariant: text[:low] fits
    while low < high:
        mid = (low + high + 1) // 2
        if count.count_tokens(text[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return text[:low]


class _Document:
    """The current document split in lines, with its boundaries computed on demand."""

    def __init__(self, text: str, grammar: str | None):
        self.text = text
        self.grammar = grammar
        self.contents, self.endings = split_lines(text)
        self.full = [c + e for c, e in zip(self.contents, self.endings, strict=True)]
        self._boundaries: dict[tuple[int, int, int], list[int]] = {}

    def statement_lines(self, first: int, last: int, depth: int) -> list[int]:
        """Lines in [first, last] where a statement of nesting depth <= depth starts."""
        key = (first, last, depth)
        if key in self._boundaries:
            return self._boundaries[key]
        if self.grammar is None:
            found = self._paragraph_starts(first, last) if depth == 1 else []
        else:
            # Parse only the region (from an unindented line above it, so the parse starts at a
            # top-level statement): whole-file parses cost too much on every keystroke.
            lo = self._region_start(first)
            region = "".join(self.full[lo : last + 1])
            found = [
                row + lo
                for row in syntax.statement_start_lines(region, self.grammar, depth)
                if first <= row + lo <= last
            ]
        self._boundaries[key] = found
        return found

    def _region_start(self, first: int) -> int:
        """The nearest line at or above `first` that starts at column 0 with code."""
        for row in range(first, max(first - REGION_LOOKBACK, 0) - 1, -1):
            line = self.contents[row]
            if line and not line[0].isspace() and line[0] not in ")]}":
                return row
        return max(first - REGION_LOOKBACK, 0)

    def _paragraph_starts(self, first: int, last: int) -> list[int]:
        """Plain text: unindented lines that follow a blank line."""
        out = []
        for row in range(max(first, 1), last + 1):
            line = self.contents[row]
            if line and not line[0].isspace() and not self.contents[row - 1].strip():
                out.append(row)
        return out


def _grid_lines(costs: dict[int, int], slack: int) -> int:
    """Grid spacing in lines: a power of two of about half the slack's worth of lines.

    Rounded to a power of two so that small changes in the average line cost (the current line
    grows as the user types) don't move the grid.
    """
    if not costs:
        return 1
    per_line = max(sum(costs.values()) / len(costs), 1.0)
    lines = max(int(slack / 2 / per_line), 1)
    return 1 << (lines.bit_length() - 1)


def _choose_prefix_start(
    doc: _Document, minimum: int, line: int, costs: dict[int, int], budget: int
) -> int:
    """A stable, syntactic first line >= `minimum` (the earliest line that fits).

    `minimum` is rounded up to a grid of G lines, so the start moves only once per G lines of
    progress; from there it moves on to the first top-level statement, else the first nested
    statement (method, statement of a top-level function), else stays on the grid line, as long
    as no more than the slack is given up.
    """
    if minimum <= 0:
        return 0
    slack = budget // SLACK_DIVISOR

    def waste(start: int) -> int:
        return sum(costs.get(row, 0) for row in range(minimum, start))

    size = _grid_lines(costs, slack)
    grid = -(-minimum // size) * size
    if grid > line or waste(grid) > slack:
        return minimum
    for depth in (1, 2):
        rows = doc.statement_lines(grid, line, depth)
        if rows and waste(rows[0]) <= slack:
            return rows[0]
    return grid


def _choose_suffix_end(
    doc: _Document, maximum: int, line: int, costs: dict[int, int], budget: int
) -> int:
    """Exclusive end line <= `maximum` (the furthest that fits), before a top-level statement."""
    if maximum >= len(doc.contents):
        return maximum
    slack = budget // SLACK_DIVISOR
    top = [row for row in doc.statement_lines(line + 1, maximum, 1) if row <= maximum]
    if top:
        end = top[-1]
        if sum(costs.get(row, 0) for row in range(end, maximum)) <= slack:
            return end
    return maximum


def _fit_prefix(
    doc: _Document, line: int, character: int, budget: int, count: _Counter
) -> tuple[str, int, bool, int]:
    """(prefix, first line, truncated, tokens used) for the text before the cursor."""
    current = doc.contents[line][:character]
    whole_chars = sum(map(len, doc.full[:line])) + len(current)
    if whole_chars <= budget * 16:
        whole = "".join(doc.full[:line]) + current
        used = count.count_tokens(whole)
        if used <= budget:
            return whole, 0, False, used
    used = count(current)
    if used > budget:
        tail = _keep_tail(current, budget, count)
        return tail, line, True, count.count_tokens(tail)
    costs: dict[int, int] = {}
    row = line - 1
    while row >= 0:
        cost = count(doc.full[row])
        if used + cost > budget:
            break
        costs[row] = cost
        used += cost
        row -= 1
    minimum = row + 1
    start = _choose_prefix_start(doc, minimum, line, costs, budget)
    used -= sum(costs.get(r, 0) for r in range(minimum, start))
    return "".join(doc.full[start:line]) + current, start, start > 0, used


def _fit_suffix(
    doc: _Document, line: int, character: int, budget: int, count: _Counter
) -> tuple[str, int, bool, int]:
    """(suffix, end line, truncated, tokens used) for the text after the cursor."""
    rest = doc.contents[line][character:] + doc.endings[line]
    total_lines = len(doc.contents)
    tail_chars = len(rest) + sum(map(len, doc.full[line + 1 :]))
    if tail_chars <= budget * 16:
        whole = rest + "".join(doc.full[line + 1 :])
        used = count.count_tokens(whole)
        if used <= budget:
            return whole, total_lines, False, used
    used = count(rest)
    if used > budget:
        head = _keep_head(rest, budget, count)
        return head, line + 1, True, count.count_tokens(head)
    costs: dict[int, int] = {}
    row = line + 1
    while row < total_lines:
        cost = count(doc.full[row])
        if used + cost > budget:
            break
        costs[row] = cost
        used += cost
        row += 1
    end = _choose_suffix_end(doc, row, line, costs, budget)
    used -= sum(costs.get(r, 0) for r in range(end, row))
    return rest + "".join(doc.full[line + 1 : end]), end, end < total_lines, used


def check_position(text: str, line: int, character: int) -> None:
    """Raise PositionError unless (line, character) lies inside `text`."""
    contents, _ = split_lines(text)
    _check(contents, line, character)


def _check(contents: list[str], line: int, character: int) -> None:
    if not isinstance(line, int) or not isinstance(character, int) or isinstance(line, bool):
        raise PositionError(
            f"position must be two integers, got line={line!r}, character={character!r}"
        )
    if line < 0 or line >= len(contents):
        raise PositionError(f"line {line} is outside the document (lines 0..{len(contents) - 1})")
    if character < 0 or character > len(contents[line]):
        raise PositionError(
            f"character {character} is outside line {line}, which has {len(contents[line])} characters"
        )


def build_prompt(
    text: str,
    line: int,
    character: int,
    language_id: str | None,
    open_documents: Sequence[Any],
    template: FimTemplate,
    count_tokens: Callable[[str], int],
    config: ContextConfig | None = None,
    path: str | None = None,
    repo_name: str | None = None,
) -> Prompt:
    """The prompt for a completion at (`line`, `character`) of `text` (0-based; character in
    code points). `open_documents`: objects or dicts with `path` or `uri`, `text`,
    `language_id`; the current document (same path, or same text) is never used as a snippet.

    Raises PositionError when the position is outside the document.
    """
    config = config or ContextConfig()
    grammar = syntax.resolve_language(language_id, path)
    doc = _Document(text, grammar)
    _check(doc.contents, line, character)
    count = _Counter(count_tokens)
    total = config.max_prompt_tokens
    documents = list(open_documents or ())
    shown_path, shown = _display_path(path, documents)

    def render(prefix: str, suffix: str, snippets: Sequence[Snippet]) -> str:
        return template.render(prefix, suffix, snippets, repo_name, shown_path, language_id)

    # -- snippets --------------------------------------------------------------------------
    snippets: list[Snippet] = []
    bare = count.count_tokens(render("", "", []))
    snippet_budget = int(total * config.snippet_share)
    if snippet_budget > 0 and config.max_snippets > 0 and documents:
        # The complete lines above the cursor: typing on the cursor's line then leaves the
        # snippets (the very start of the prompt) alone.
        query = "".join(doc.full[max(0, line - config.snippet_lines) : line])
        if not query.strip():
            query = doc.contents[line][:character]
        snippets = select_snippets(
            query,
            documents,
            current_path=uri_to_path(path) if path else None,
            current_text=text,
            max_snippets=config.max_snippets,
            snippet_lines=config.snippet_lines,
            token_budget=snippet_budget,
            cost=lambda s: count.count_tokens(
                template.render_snippet(shown.get(s.path, s.path), s.text, language_id)
            ),
            max_document_bytes=config.max_document_bytes,
        )
        snippets = [
            Snippet(
                shown.get(s.path, s.path), s.text, s.start_line, s.end_line, s.score, s.language_id
            )
            for s in snippets
        ]
        # The repository header costs a little too; drop the weakest until everything fits.
        while snippets and count.count_tokens(render("", "", snippets)) - bare > snippet_budget:
            snippets.remove(min(snippets, key=lambda s: s.score))
    overhead = count.count_tokens(render("", "", snippets))

    # -- current document ------------------------------------------------------------------
    file_budget = max(total - overhead, 0)
    suffix_budget = int(file_budget * config.suffix_share)
    suffix, end, suffix_cut, suffix_used = _fit_suffix(doc, line, character, suffix_budget, count)
    prefix_budget = file_budget - (suffix_used if not suffix_cut else suffix_budget)
    prefix, start, prefix_cut, prefix_used = _fit_prefix(doc, line, character, prefix_budget, count)
    if suffix_cut and not prefix_cut and prefix_used < prefix_budget:
        suffix, end, suffix_cut, suffix_used = _fit_suffix(
            doc, line, character, file_budget - prefix_used, count
        )

    rendered = render(prefix, suffix, snippets)
    tokens = count.count_tokens(rendered)
    # Token counts of pieces don't add up exactly (merges across piece boundaries); shave the
    # prefix until the whole prompt fits.
    for _ in range(4):
        if tokens <= total or not prefix:
            break
        prefix_budget = max(prefix_budget - (tokens - total) - 1, 0)
        prefix, start, prefix_cut, prefix_used = _fit_prefix(
            doc, line, character, prefix_budget, count
        )
        rendered = render(prefix, suffix, snippets)
        tokens = count.count_tokens(rendered)

    return Prompt(
        text=rendered,
        prefix=prefix,
        suffix=suffix,
        snippets=snippets,
        prefix_start_line=start,
        suffix_end_line=end,
        language=grammar,
        prompt_tokens=tokens,
        prefix_truncated=prefix_cut,
        suffix_truncated=suffix_cut,
    )

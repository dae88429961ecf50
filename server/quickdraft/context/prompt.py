"""Build the prompt for one completion request: current file around the cursor, plus snippets.

Three layouts (`context.layout`):

    classic   <prefix: text before the cursor> <suffix marker> <suffix> <middle marker>
    append    <prefix: text before the anchor line> <suffix marker> <suffix> <middle marker>
              <middle: text from the anchor line to the cursor>

    pinned    <top: the file's first lines> <prefix: a short window above the anchor>
              <suffix marker> <suffix> <middle marker> <middle>

In the append layout, typing on a line, Backspace over what was just typed and Enter only
change the end of the prompt (the middle), so the engine's KV cache holds everything before it
and a keystroke costs only its own tokens.

The pinned layout also keeps moves cheap. In the append layout the prefix is the window of
lines above the anchor, so moving 30 lines moves its start and the whole file part of the
prompt is computed again; opening a file computes it all. Pinned splits the file's part in two:
its top (the first lines, as many as fit what the moving part leaves: imports, definitions,
what the file is about) stays in place whatever the cursor does, and only a short window above
the anchor, the suffix and the middle (`context.near_share` of the budget) move with it. The
top is computed once per file (warm-up does it before the first request), a move computes only
the window. When the window reaches into the top, the two join into one run of lines from the
first; otherwise the lines between them are left out. The anchor moves in coarse steps: it is the line
number at or above the cursor's that is a multiple of `context.anchor_lines`, so it stays put
while the cursor stays in that window of lines, and moves when it leaves it or jumps elsewhere.
(How the token boundary at the cursor is handled is the Completer's business: token healing.)

Budget (`ContextConfig`): the whole prompt stays within `max_prompt_tokens` (`auto`: what this
machine prefills in AUTO_PROMPT_SECONDS, within AUTO_PROMPT_BOUNDS). Snippets of other
documents get up to `snippet_share` of it; the current file gets the rest, split `suffix_share`
for the text after the cursor and the remainder for the text before it (a part that needs less
than its share leaves the rest to the other). In the append layout the middle has a fixed
allowance (MIDDLE_SHARE) taken from the prefix's share, so the prefix does not shrink as the
middle grows while the user types.

The builder goes in steps: the snippets (the workspace head, or windows chosen for the cursor),
then the budget step (`_budget`: every part's share, once the snippets' cost is known), then
one function per layout (`_classic`, `_append`, `_pinned`) fits the document's text to its
shares, shaving the prefix while the whole prompt is over budget (`_within_total`). With the
workspace head, `_head_prompt` decides once whether the document's own chunk stays in it.

Trimming removes whole lines: the prefix loses lines at the top, the suffix at the bottom. The
prefix's first line is picked to be *stable*: the earliest line that fits is rounded up to a
grid of G lines (G: a power of two worth about half the slack below), and from that grid line
on the prefix starts at the first top-level statement (tree-sitter; blank-line paragraphs in plain
text), else the first nested statement, else the grid line itself. The start then moves once
per G lines of progress instead of every line. At most `1 / SLACK_DIVISOR` of the prefix budget
is given up for that.

The head of the prompt is stable too: snippets are chosen by the lines above the anchor (not
the cursor), so they change only when the anchor moves or another document changes, and are
ordered least recently changed document first, so an edit in one file invalidates only what
follows its snippet; paths are shown relative to the workspace root when one is known.

Only a window of the document around the cursor is read (enough characters for the budget):
a keystroke in a 2 MB file does no work proportional to the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import quickdraft.context.syntax as syntax
from quickdraft.config import FIXED_PROMPT_TOKENS, ContextConfig, QuickdraftConfig
from quickdraft.context.fim import FimTemplate, PromptPart
from quickdraft.context.snippets import Snippet, as_open_document, select_snippets, uri_to_path
from quickdraft.errors import PositionError
from quickdraft.text import LINE_BREAK, split_lines

SLACK_DIVISOR = 4
"""Up to 1/SLACK_DIVISOR of the prefix budget may go unused to start at a stable boundary."""
REGION_LOOKBACK = 400
"""Boundaries come from parsing the region of interest, starting up to this many lines above."""
MIDDLE_SHARE = 0.15
"""Append layout: the share of the file budget set aside for the middle (anchor to cursor)."""
MIDDLE_STEP = 64
"""A middle larger than its allowance takes tokens from the prefix in steps of this many, so
the prefix start moves rarely even then."""
CHARS_PER_TOKEN_BOUND = 16
"""No token is longer than this many characters in practice: a window of budget x this many
characters around the cursor holds everything the budget can take."""

AUTO_PROMPT_SECONDS = 32.0
"""`auto`: the budget is what the target prefills in this many seconds (a cold request's
prefill), by its measured speed, rounded down to AUTO_PROMPT_STEP: a machine that prefills
48 tokens/s or more keeps the full 1536 (the 65 tokens/s machine of issue 18 does), a
2-core AVX2 EPYC at 32 tokens/s gets 1024 ..."""
AUTO_PROMPT_BOUNDS = (1024, 1536)
"""... and kept within these. Measured on 30 held-out holes (docs/performance.md, 2026-12-01):
768, 1024 and 1536 tokens matched the hidden text about as often, so a slow machine gives up
little by a smaller prompt and gains a third of a cold request; but a visit to a file costs its
cursor window and its decode whatever the budget, and at 768 a visit took 36 % of a cold
request against 23 % at 1024, so 1024 is the floor. Nothing above 1536 was measured."""
AUTO_PROMPT_STEP = 128


def auto_prompt_tokens(prefill_tokens_per_s: float | None) -> int:
    """The budget `auto` means on a target that prefills `prefill_tokens_per_s` (None: not
    measured)."""
    if not prefill_tokens_per_s or prefill_tokens_per_s <= 0:
        return FIXED_PROMPT_TOKENS
    low, high = AUTO_PROMPT_BOUNDS
    tokens = int(prefill_tokens_per_s * AUTO_PROMPT_SECONDS) // AUTO_PROMPT_STEP * AUTO_PROMPT_STEP
    return max(low, min(high, tokens))


def prompt_tokens(config: ContextConfig) -> int:
    """The prompt budget in tokens: the setting, or an `auto` no backend has fitted to a
    machine (FIXED_PROMPT_TOKENS)."""
    budget = config.max_prompt_tokens
    return budget if isinstance(budget, int) else FIXED_PROMPT_TOKENS


def fit_prompt_budget(
    config: QuickdraftConfig, prefill_tokens_per_s: float | None
) -> QuickdraftConfig:
    """`config` with an `auto` budget made the number this machine's speed gives (a backend
    does this in `configure`, where it knows its speed); a number is kept as it is."""
    if config.context.max_prompt_tokens != "auto":
        return config
    budget = auto_prompt_tokens(prefill_tokens_per_s)
    return dataclasses.replace(
        config, context=dataclasses.replace(config.context, max_prompt_tokens=budget)
    )


@dataclass
class Prompt:
    """What goes to the model, and the pieces it was made of."""

    text: str
    """The rendered prompt."""
    prefix: str
    """Current document text before the cursor that made it into the prompt (in the append
    layout: the prefix section and the middle)."""
    suffix: str
    """Current document text after the cursor that made it into the prompt."""
    snippets: list[Snippet] = field(default_factory=list)
    prefix_start_line: int = 0
    """0-based document line the prefix starts at (0 = not trimmed at the top)."""
    suffix_end_line: int = 0
    """0-based document line after the suffix's last line."""
    language: str | None = None
    """The grammar used for boundaries (None: plain text)."""
    prompt_tokens: int = 0
    """The tokens of `parts`, counted part by part (markers and sections tokenize apart)."""
    prefix_truncated: bool = False
    suffix_truncated: bool = False
    layout: str = "classic"
    middle: str = ""
    """Append layout: the text from the anchor line to the cursor (after the middle marker)."""
    anchor_line: int | None = None
    """Append layout: the 0-based line the middle starts at."""
    top: str = ""
    """Pinned layout: the file's first lines, pinned ahead of the window above the anchor
    (the start of `prefix`)."""
    parts: list[PromptPart] = field(default_factory=list)
    """`text` as markers and text of each role, in order (joined, they give `text`)."""


class TokenCounter:
    """count_tokens with a memo that lasts: the same lines come back request after request.

    Give one to every `build_prompt` call of a Completer (it is cheap to keep: bounded LRU).
    """

    def __init__(self, count_tokens: Callable[[str], int], size: int = 20000):
        self.count_tokens = count_tokens
        self.size = size
        self.memo: OrderedDict[str, int] = OrderedDict()
        self.calls = 0
        """How many strings were actually tokenized (tests count work with it)."""

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        value = self.memo.get(text)
        if value is None:
            self.calls += 1
            value = self.count_tokens(text)
            self.memo[text] = value
            if len(self.memo) > self.size:
                self.memo.popitem(last=False)
        else:
            self.memo.move_to_end(text)
        return value

    def uncached(self, text: str) -> int:
        """Count without remembering (binary searches over many one-off substrings)."""
        self.calls += 1
        return self.count_tokens(text)


def _display_root(path: str | None, documents: Sequence[Any], root: str | None) -> str:
    """The folder paths are shown relative to: the workspace root when known, else the common
    folder of all open documents."""
    if root:
        return uri_to_path(root).rstrip("/\\")
    paths = [as_open_document(d).path for d in documents]
    current = uri_to_path(path) if path else None
    every = [p for p in [current, *paths] if p]
    absolute = [p for p in every if p.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", p)]
    if absolute and len(absolute) == len(every):
        try:
            return os.path.commonpath([os.path.dirname(p) for p in absolute])
        except ValueError:
            return ""
    return ""


def _show(path: str, root: str) -> str:
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", "\\"):
        return path[len(root) :].lstrip("/\\") or path
    return path


def _keep_tail(text: str, budget: int, count: TokenCounter) -> str:
    """The longest tail of `text` within `budget` tokens (binary search on the start)."""
    if budget <= 0:
        return ""
    low, high = 0, len(text)  # invariant: text[high:] fits
    while low < high:
        mid = (low + high) // 2
        if count.uncached(text[mid:]) <= budget:
            high = mid
        else:
            low = mid + 1
    return text[high:]


def _keep_head(text: str, budget: int, count: TokenCounter) -> str:
    """The longest head of `text` within `budget` tokens."""
    if budget <= 0:
        return ""
    low, high = 0, len(text)  # invariant: text[:low] fits
    while low < high:
        mid = (low + high + 1) // 2
        if count.uncached(text[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return text[:low]


class _Window:
    """The lines of the document around the cursor, cut from the text without splitting the
    whole document. Rows are window-relative: `first_line + row` is the document line."""

    def __init__(
        self,
        text: str,
        line: int,
        character: int,
        offset: int | None,
        grammar: str | None,
        chars: int,
    ):
        if offset is None:
            offset = offset_of(text, line, character)
        self.grammar = grammar
        start = max(0, offset - chars)
        if start > 0:  # begin at a line start
            found = LINE_BREAK.search(text, start)
            start = found.end() if found is not None and found.end() <= offset else start
            if start > offset - character:
                start = offset - character
        end = min(len(text), offset + chars)
        if end < len(text):  # end after a whole line
            found = LINE_BREAK.search(text, end)
            end = found.end() if found is not None else len(text)
        self.window = text[start:end]
        self.contents, self.endings = split_lines(self.window)
        cursor_row = len(LINE_BREAK.findall(text, start, offset - character))
        self.first_line = line - cursor_row
        self.cursor_row = cursor_row
        self.at_start = start == 0
        self.at_end = end == len(text)
        if end < len(text) and self.contents and self.contents[-1] == "" and self.endings[-1] == "":
            # The window ended right after a line break: that empty "line" is not the document's.
            self.contents.pop()
            self.endings.pop()
        self.full = [c + e for c, e in zip(self.contents, self.endings, strict=True)]
        self._boundaries: dict[tuple[int, int, int, int | None], list[int]] = {}

    def statement_lines(
        self, first: int, last: int, depth: int, *, parse_from: int | None = None
    ) -> list[int]:
        """Rows in [first, last] where a statement of nesting depth <= depth starts.
        `parse_from`: no row above it is parsed (the suffix's end must not depend on the
        half-typed cursor line: its parse errors would move the end at every keystroke)."""
        key = (first, last, depth, parse_from)
        if key in self._boundaries:
            return self._boundaries[key]
        if self.grammar is None:
            found = self._paragraph_starts(first, last) if depth == 1 else []
        else:
            # Parse only the region (from an unindented line above it, so the parse starts at a
            # top-level statement): whole-file parses cost too much on every keystroke.
            lo = self._region_start(first)
            if parse_from is not None:
                lo = max(lo, parse_from)
            region = "".join(self.full[lo : last + 1])
            found = [
                row + lo
                for row in syntax.statement_start_lines(region, self.grammar, depth)
                if first <= row + lo <= last
            ]
        self._boundaries[key] = found
        return found

    def _region_start(self, first: int) -> int:
        """The nearest row at or above `first` that starts at column 0 with code."""
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


def offset_of(text: str, line: int, character: int) -> int:
    """The cursor's offset from (line, character), checking them (reads the whole text: the
    language server passes the offset it already knows instead)."""
    contents, endings = split_lines(text)
    _check(contents, line, character)
    return sum(len(c) + len(e) for c, e in zip(contents[:line], endings[:line], strict=True)) + (
        character
    )


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
    doc: _Window, minimum: int, end: int, costs: dict[int, int], budget: int
) -> int:
    """A stable, syntactic first row >= `minimum` (the earliest row that fits), before `end`.

    The document line of `minimum` is rounded up to a grid of G lines, so the start moves only
    once per G lines of progress; from there it moves on to the first top-level statement, else
    the first nested statement, else stays on the grid line, as long as no more than the slack
    is given up.
    """
    if minimum <= 0 and doc.at_start:
        return 0
    slack = budget // SLACK_DIVISOR

    def waste(start: int) -> int:
        return sum(costs.get(row, 0) for row in range(minimum, start))

    size = _grid_lines(costs, slack)
    absolute = doc.first_line + minimum
    grid = -(-absolute // size) * size - doc.first_line
    if grid > end or waste(grid) > slack:
        return minimum
    for depth in (1, 2):
        rows = doc.statement_lines(grid, end, depth)
        if rows and waste(rows[0]) <= slack:
            return rows[0]
    return grid


def _choose_suffix_end(
    doc: _Window, maximum: int, row: int, costs: dict[int, int], budget: int
) -> int:
    """Exclusive end row <= `maximum` (the furthest that fits), before a top-level statement."""
    if maximum >= len(doc.contents):
        return maximum
    slack = budget // SLACK_DIVISOR
    # Parsed from below the cursor line only: what the user is typing must not move the end
    # (the append layout's prompt then only grows while they type).
    top = [r for r in doc.statement_lines(row + 1, maximum, 1, parse_from=row + 1) if r <= maximum]
    if top:
        end = top[-1]
        if sum(costs.get(r, 0) for r in range(end, maximum)) <= slack:
            return end
    return maximum


def _fit_prefix(
    doc: _Window, end: int, tail: str, budget: int, count: TokenCounter
) -> tuple[str, int, bool, int]:
    """(text, first row, truncated, tokens used) for the whole rows before row `end` followed
    by `tail` (the cursor line's start, classic layout; nothing in the append layout)."""
    whole_chars = sum(map(len, doc.full[:end])) + len(tail)
    if doc.at_start and whole_chars <= budget * CHARS_PER_TOKEN_BOUND:
        whole = "".join(doc.full[:end]) + tail
        used = count(whole)
        if used <= budget:
            return whole, 0, False, used
    used = count(tail)
    if used > budget:
        kept = _keep_tail(tail, budget, count)
        return kept, end, True, count(kept)
    costs: dict[int, int] = {}
    row = end - 1
    while row >= 0:
        cost = count(doc.full[row])
        if used + cost > budget:
            break
        costs[row] = cost
        used += cost
        row -= 1
    minimum = row + 1
    start = _choose_prefix_start(doc, minimum, end, costs, budget)
    used -= sum(costs.get(r, 0) for r in range(minimum, start))
    truncated = start > 0 or not doc.at_start
    return "".join(doc.full[start:end]) + tail, start, truncated, used


def _fit_top(text: str, budget: int, count: TokenCounter, first_line: int = 0) -> list[str]:
    """The document's whole lines (line breaks included) from `first_line` on, within `budget`
    tokens, read from there only: as long as those lines stay the same, so does the answer."""
    if budget <= 0:
        return []
    start = 0
    for _ in range(first_line):
        found = LINE_BREAK.search(text, start)
        if found is None:
            return []
        start = found.end()
    contents, endings = split_lines(text[start : start + budget * CHARS_PER_TOKEN_BOUND])
    lines: list[str] = []
    used = 0
    for content, ending in zip(contents, endings, strict=True):
        if not ending:  # cut mid-line, or the document's last line: not a whole line
            break
        cost = count(content + ending)
        if used + cost > budget:
            break
        used += cost
        lines.append(content + ending)
    return lines


class _Suffix(NamedTuple):
    """The text after the cursor, as `_fit_suffix` fit it."""

    text: str
    end: int
    """The window row after its last line."""
    truncated: bool
    tokens: int
    """The tokens its lines were counted at."""


def _fit_suffix(
    doc: _Window, row: int, character: int, budget: int, count: TokenCounter
) -> _Suffix:
    """The text after the cursor within `budget` tokens."""
    rest = doc.contents[row][character:] + doc.endings[row]
    total_rows = len(doc.contents)
    tail_chars = len(rest) + sum(map(len, doc.full[row + 1 :]))
    if doc.at_end and tail_chars <= budget * CHARS_PER_TOKEN_BOUND:
        whole = rest + "".join(doc.full[row + 1 :])
        used = count(whole)
        if used <= budget:
            return _Suffix(whole, total_rows, False, used)
    used = count(rest)
    if used > budget:
        head = _keep_head(rest, budget, count)
        return _Suffix(head, row + 1, True, count(head))
    costs: dict[int, int] = {}
    r = row + 1
    while r < total_rows:
        cost = count(doc.full[r])
        if used + cost > budget:
            break
        costs[r] = cost
        used += cost
        r += 1
    end = _choose_suffix_end(doc, r, row, costs, budget)
    used -= sum(costs.get(x, 0) for x in range(end, r))
    truncated = end < total_rows or not doc.at_end
    return _Suffix(rest + "".join(doc.full[row + 1 : end]), end, truncated, used)


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


def _snippet_query(
    doc: _Window, row: int, character: int, query_end: int, lines: int, append: bool
) -> str:
    """The text snippets of other files are chosen by: the `lines` rows above `query_end` (the
    anchor in the append layout, the cursor's row in the classic one). Near the top of a file
    there may be none. The append layout then reads the rows below the cursor's, and last the
    rows from the anchor to the cursor's: never the cursor's own row, so that typing on it
    leaves the snippets, the head of the prompt, be. The classic layout reads the cursor's row
    (its prompt changes with every keystroke anyway)."""

    def has_words(text: str) -> bool:
        return any(c.isalnum() for c in text)

    query = "".join(doc.full[max(0, query_end - lines) : query_end])
    if has_words(query):
        return query
    if not append:
        return doc.contents[row][:character]
    below = "".join(doc.full[row + 1 : row + 1 + lines])
    if has_words(below):
        return below
    return "".join(doc.full[query_end:row])


def anchor_line(line: int, anchor_lines: int) -> int:
    """The append layout's anchor for a cursor on `line`: the line at or above it whose number
    is a multiple of `anchor_lines`."""
    return line - line % max(anchor_lines, 1)


@dataclass(frozen=True)
class _Fitted:
    """The document's text as one layout fit it, and the prompt it renders to."""

    top: str
    """Pinned: the file's first lines, ahead of `section` ("" in the other layouts)."""
    section: str
    """The text before the cursor (classic) or the lines above the anchor (append, pinned)."""
    start: int
    """The window row `section` starts at."""
    truncated: bool
    """Lines above `section` (and the top) are left out."""
    suffix: _Suffix
    parts: list[PromptPart]
    tokens: int
    """The tokens of `parts`, counted part by part."""


@dataclass(frozen=True)
class _Request:
    """One `build_prompt` call, read once: the window of the document around the cursor, the
    settings, and how the prompt's parts render. Every step of the builder reads it; fitting
    the file again without its own chunk in the head (`_head_prompt`) starts from it too."""

    text: str
    doc: _Window
    row: int
    """The cursor's row in `doc`."""
    character: int
    anchor_row: int
    """The anchor's row in `doc` (the window's first row when the anchor is above it)."""
    config: ContextConfig
    total: int
    """The whole prompt's budget in tokens."""
    count: TokenCounter
    template: FimTemplate
    repo_name: str | None
    root_dir: str
    """The folder paths are shown relative to (`_display_root`)."""
    shown_path: str | None
    """The document's path as the prompt shows it."""
    language_id: str | None

    @property
    def layout(self) -> str:
        """`context.layout`: "append", "pinned", or else "classic"."""
        return self.config.layout if self.config.layout in ("append", "pinned") else "classic"

    @property
    def snippet_budget(self) -> int:
        """The tokens the snippets or the workspace head may take, the repository header
        included."""
        return int(self.total * self.config.snippet_share)

    def parts(
        self, snippets: Sequence[Snippet], prefix: str, suffix: str, middle: str = "", top: str = ""
    ) -> list[PromptPart]:
        """The prompt's parts with `snippets` and these sections of the document."""
        return self.template.render_parts(
            prefix, suffix, snippets, self.repo_name, self.shown_path, self.language_id, middle, top
        )

    def without_file(self, snippets: Sequence[Snippet]) -> str:
        """The prompt with `snippets` and none of the document's text: the head and the
        markers."""
        return "".join(part.text for part in self.parts(snippets, "", ""))

    def snippets_cost(self, snippets: Sequence[Snippet]) -> int:
        """The tokens `snippets` add to the prompt (their markers and the repository header
        included): what the snippet budget bounds."""
        return self.count(self.without_file(snippets)) - self.count(self.without_file([]))

    def fitted(
        self,
        snippets: Sequence[Snippet],
        top: str,
        section: str,
        start: int,
        truncated: bool,
        suffix: _Suffix,
        middle: str = "",
    ) -> _Fitted:
        """The document's text as a layout fit it, rendered after `snippets` and counted."""
        parts = self.parts(snippets, section, suffix.text, middle, top)
        tokens = sum(self.count(part.text) for part in parts)
        return _Fitted(top, section, start, truncated, suffix, parts, tokens)


@dataclass(frozen=True)
class _Budget:
    """The budget step: the prompt's tokens shared out once the snippets' cost is known, so
    every part of the document's text has its share before any of it is fit."""

    total: int
    """The whole prompt."""
    file: int
    """The document's text: what the snippets and the markers leave of `total`."""
    near: int
    """The part that moves with the cursor: all of `file`, a share of `total` in the pinned
    layout (`context.near_share`)."""
    top: int
    """Pinned: the most the file's top may take (what `near` leaves of `file`)."""
    suffix: int
    """The text after the cursor's share of `near` (`context.suffix_share`)."""


def _budget(config: ContextConfig, total: int, overhead: int) -> _Budget:
    """How `total` tokens are shared out when the snippets and markers cost `overhead`."""
    file_budget = max(total - overhead, 0)
    pinned = config.layout == "pinned"
    near = min(file_budget, int(total * config.near_share)) if pinned else file_budget
    suffix = int(near * config.suffix_share)
    return _Budget(total, file_budget, near, max(file_budget - near, 0), suffix)


@dataclass(frozen=True)
class _Middle:
    """Append and pinned layouts: the text from the anchor line to the cursor."""

    text: str
    tokens: int

    def reserve(self, budget: _Budget) -> int:
        """The tokens the middle is counted at: its allowance (MIDDLE_SHARE of the file
        budget, at most half the moving part), plus what it needs beyond that in MIDDLE_STEP
        steps."""
        allowance = min(int(budget.file * MIDDLE_SHARE), budget.near // 2)
        excess = max(0, self.tokens - allowance)
        return allowance + -(-excess // MIDDLE_STEP) * MIDDLE_STEP


@dataclass(frozen=True)
class _Room:
    """What a layout may give the text before the cursor; less after each fit whose prompt
    does not fit the whole budget (`_within_total`)."""

    prefix: int
    """The prefix (append, pinned: the lines above the anchor)."""
    top: int = 0
    """Pinned: the most the file's top may take."""

    def shaved(self, fitted: _Fitted, total: int) -> _Room:
        """The room for a fit that takes off what `fitted` is over `total`, and a token more:
        from the prefix, and from the top too when no prefix is left to take it from."""
        over = fitted.tokens - total + 1
        top = self.top if fitted.section else max(self.top - over, 0)
        return _Room(max(self.prefix - over, 0), top)


def _within_total(
    fitted: _Fitted, refit: Callable[[_Room], _Fitted], room: _Room, total: int
) -> _Fitted:
    """`fitted` (made with `room`), or the layout's `refit` with less room until the whole
    prompt is within `total` tokens: token counts of lines don't add up exactly to a
    section's (merges across line boundaries)."""
    for _ in range(4):
        if fitted.tokens <= total or not (fitted.section or fitted.top):
            break
        room = room.shaved(fitted, total)
        fitted = refit(room)
    return fitted


def _classic(
    request: _Request, snippets: Sequence[Snippet], budget: _Budget, suffix: _Suffix
) -> _Fitted:
    """The classic layout: the text before the cursor, up to the cursor, gets what the suffix
    leaves of the file budget (a cut suffix leaves its share); when it needs less, a cut
    suffix gets the rest."""
    doc, row, count = request.doc, request.row, request.count
    room = _Room(budget.file - (suffix.tokens if not suffix.truncated else budget.suffix))
    tail = doc.contents[row][: request.character]
    prefix, start, truncated, used = _fit_prefix(doc, row, tail, room.prefix, count)
    if suffix.truncated and not truncated and used < room.prefix:
        suffix = _fit_suffix(doc, row, request.character, budget.file - used, count)
    fitted = request.fitted(snippets, "", prefix, start, truncated, suffix)
    refit = partial(_classic_prefix, request, snippets, suffix)
    return _within_total(fitted, refit, room, budget.total)


def _classic_prefix(
    request: _Request, snippets: Sequence[Snippet], suffix: _Suffix, room: _Room
) -> _Fitted:
    """The classic layout with the text before the cursor fit to `room` again, the suffix
    kept."""
    doc, row = request.doc, request.row
    tail = doc.contents[row][: request.character]
    prefix, start, truncated, _ = _fit_prefix(doc, row, tail, room.prefix, request.count)
    return request.fitted(snippets, "", prefix, start, truncated, suffix)


def _above_anchor(request: _Request, budget: int) -> tuple[str, int, bool, int]:
    """(text, first row, truncated, tokens used) for the lines above the anchor within
    `budget` (append and pinned layouts)."""
    doc, anchor_row = request.doc, request.anchor_row
    section, first, truncated, used = _fit_prefix(
        doc, anchor_row, "", max(budget, 0), request.count
    )
    if not doc.at_start and section == "" and anchor_row == 0:
        truncated = True
    return section, first, truncated, used


def _append(
    request: _Request,
    snippets: Sequence[Snippet],
    budget: _Budget,
    suffix: _Suffix,
    middle: _Middle,
) -> _Fitted:
    """The append layout: the lines above the anchor get what the suffix and the middle's
    reserve leave of the file budget; the middle goes after the middle marker."""
    room = _Room(budget.near - suffix.tokens - middle.reserve(budget))
    refit = partial(_append_prefix, request, snippets, suffix, middle.text)
    return _within_total(refit(room), refit, room, budget.total)


def _append_prefix(
    request: _Request, snippets: Sequence[Snippet], suffix: _Suffix, middle: str, room: _Room
) -> _Fitted:
    """The append layout with the lines above the anchor fit to `room`."""
    section, start, truncated, _ = _above_anchor(request, room.prefix)
    return request.fitted(snippets, "", section, start, truncated, suffix, middle)


def _pinned(
    request: _Request,
    snippets: Sequence[Snippet],
    budget: _Budget,
    suffix: _Suffix,
    middle: _Middle,
    top_from: int,
) -> _Fitted:
    """The pinned layout: as the append layout within the moving part's budget, with the
    file's top (its lines from `top_from`) ahead of the lines above the anchor."""
    moving = suffix.tokens + middle.reserve(budget)
    room = _Room(budget.near - moving, budget.top)
    refit = partial(
        _pinned_prefix, request, snippets, suffix, middle.text, budget.file - moving, top_from
    )
    return _within_total(refit(room), refit, room, budget.total)


def _pinned_prefix(
    request: _Request,
    snippets: Sequence[Snippet],
    suffix: _Suffix,
    middle: str,
    unmoved: int,
    top_from: int,
    room: _Room,
) -> _Fitted:
    """The pinned layout with its top and the lines above the anchor fit to `room`.
    `unmoved`: what the suffix and the middle's reserve leave of the file budget; the top gets
    what the lines above the anchor leave of that (the reserve grows in steps, so a long
    middle shrinks the top only when it passes one, not at every keystroke)."""
    doc = request.doc
    section, start, truncated, used = _above_anchor(request, room.prefix)
    lines = _fit_top(request.text, min(room.top, unmoved - used), request.count, top_from)
    top_stop = top_from + len(lines)
    top_end = min(top_stop, doc.first_line + request.anchor_row)
    if top_end <= top_from:
        return request.fitted(snippets, "", section, start, truncated, suffix, middle)
    if doc.first_line + start <= top_stop:
        # The window reaches into the top: one run of lines from the first, split where the
        # top ends (so the top's tokens are the same whatever the cursor's line).
        start = top_end - doc.first_line
        top = "".join(lines[: top_end - top_from])
        section, truncated = "".join(doc.full[start : request.anchor_row]), False
    else:
        top, truncated = "".join(lines), True
    return request.fitted(snippets, top, section, start, truncated, suffix, middle)


def _file_prompt(request: _Request, snippets: list[Snippet], top_from: int) -> Prompt:
    """The prompt with `snippets` ahead of the document's text: the budget step, then the
    layout's function. `top_from`: the line the pinned layout's top starts at."""
    doc, row, count = request.doc, request.row, request.count
    budget = _budget(request.config, request.total, count(request.without_file(snippets)))
    suffix = _fit_suffix(doc, row, request.character, budget.suffix, count)
    layout = request.layout
    middle = _Middle("", 0)
    if layout != "classic":
        text = "".join(doc.full[request.anchor_row : row]) + doc.contents[row][: request.character]
        middle = _Middle(text, count.uncached(text))
        if middle.tokens > (budget.file - suffix.tokens) // 2:
            # One huge line (minified code, data) or a long stretch since the anchor: no
            # room for a prefix. The classic layout cuts the text before the cursor to fit.
            layout, middle = "classic", _Middle("", 0)
    if layout == "classic":
        fitted = _classic(request, snippets, budget, suffix)
    elif layout == "append":
        fitted = _append(request, snippets, budget, suffix, middle)
    else:
        fitted = _pinned(request, snippets, budget, suffix, middle, top_from)
    return Prompt(
        text="".join(part.text for part in fitted.parts),
        prefix=fitted.top + fitted.section + middle.text,
        suffix=fitted.suffix.text,
        snippets=snippets,
        prefix_start_line=top_from if fitted.top else doc.first_line + fitted.start,
        suffix_end_line=doc.first_line + fitted.suffix.end,
        language=doc.grammar,
        prompt_tokens=fitted.tokens,
        prefix_truncated=fitted.truncated,
        suffix_truncated=fitted.suffix.truncated,
        layout=layout,
        middle=middle.text,
        anchor_line=doc.first_line + request.anchor_row if layout != "classic" else None,
        parts=fitted.parts,
        top=fitted.top,
    )


def _fit_head(request: _Request, head: Sequence[Snippet]) -> list[Snippet]:
    """The workspace head's chunks that fit the snippet budget (the markers and header
    included), in order: the first chunk that does not fit ends the head, so the head only
    ever loses its tail."""
    chosen: list[Snippet] = []
    for chunk in head:
        shown = Snippet(
            _show(chunk.path, request.root_dir),
            chunk.text,
            chunk.start_line,
            chunk.end_line,
            chunk.score,
            chunk.language_id,
        )
        if request.snippets_cost([*chosen, shown]) > request.snippet_budget:
            break
        chosen.append(shown)
    return chosen


def _head_prompt(request: _Request, head: Sequence[Snippet], own_chunk: Snippet | None) -> Prompt:
    """The prompt that starts with the workspace head. The document's own chunk (its first
    lines) stays in the head, which is then the same for every document, and the document's
    text starts after it (the pinned layout's top starts at the chunk's end). When the
    document's text would show the chunk's lines anyway (a cursor among them, a short file),
    the chunk is left out of the head instead: the model reads no line twice. Decided here,
    once: a chunk the head's budget leaves out changes nothing, and one it shows stays unless
    the document's text, fit after it, starts above its end; then the document is fit once
    more, the head cut to its budget without it."""
    shown = _fit_head(request, head)
    if own_chunk is None or own_chunk.text not in {chunk.text for chunk in shown}:
        return _file_prompt(request, shown, top_from=0)
    prompt = _file_prompt(request, shown, top_from=own_chunk.end_line)
    if prompt.prefix_start_line >= own_chunk.end_line:
        return prompt
    others = [chunk for chunk in head if chunk is not own_chunk]
    return _file_prompt(request, _fit_head(request, others), top_from=0)


def _cursor_snippets(
    request: _Request, documents: Sequence[Any], path: str | None
) -> list[Snippet]:
    """`context.head: cursor`: the windows of other documents most like the lines above the
    anchor (append layouts) or the cursor's line (classic), so typing on the line, or Enter
    inside the anchor's window, leaves them (the start of the prompt) be; within the snippet
    budget, the weakest dropped first."""
    config, root_dir = request.config, request.root_dir
    budget = request.snippet_budget
    if budget <= 0 or config.max_snippets <= 0 or not documents:
        return []
    append = request.layout != "classic"
    query_end = request.anchor_row if append else request.row
    query = _snippet_query(
        request.doc, request.row, request.character, query_end, config.snippet_lines, append
    )
    selected = select_snippets(
        query,
        documents,
        current_path=uri_to_path(path) if path else None,
        current_text=request.text,
        max_snippets=config.max_snippets,
        snippet_lines=config.snippet_lines,
        token_budget=budget,
        cost=lambda s: request.count(
            request.template.render_snippet(_show(s.path, root_dir), s.text, request.language_id)
        ),
        max_document_bytes=config.max_document_bytes,
    )
    snippets = [
        Snippet(_show(s.path, root_dir), s.text, s.start_line, s.end_line, s.score, s.language_id)
        for s in selected
    ]
    # The repository header costs a little too; drop the weakest until everything fits.
    while snippets and request.snippets_cost(snippets) > budget:
        snippets.remove(min(snippets, key=lambda s: s.score))
    return snippets


def build_prompt(
    text: str,
    line: int,
    character: int,
    language_id: str | None,
    open_documents: Sequence[Any],
    template: FimTemplate,
    count_tokens: Callable[[str], int] | TokenCounter,
    config: ContextConfig | None = None,
    path: str | None = None,
    repo_name: str | None = None,
    *,
    offset: int | None = None,
    root: str | None = None,
    head: Sequence[Snippet] | None = None,
    own_chunk: Snippet | None = None,
) -> Prompt:
    """The prompt for a completion at (`line`, `character`) of `text` (0-based; character in
    code points). `open_documents`: objects or dicts with `path` or `uri`, `text`,
    `language_id`, least recently changed first (that is their order in the prompt); the current
    document (same path, or same text) is never used as a snippet. `offset`: the cursor's index
    into `text` when the caller knows it (then the position is not re-checked and only a window
    of the text is read). `root`: the workspace folder paths are shown relative to. `head`: the
    workspace head (context.workspace), used instead of snippets chosen for this cursor: the
    same chunks for every document, cut to the snippet budget from the end. `own_chunk`: this
    document's chunk in `head`, if it has one (`_head_prompt` decides where its lines go).

    Raises PositionError when the position is outside the document.
    """
    config = config or ContextConfig()
    count = count_tokens if isinstance(count_tokens, TokenCounter) else TokenCounter(count_tokens)
    grammar = syntax.resolve_language(language_id, path)
    total = prompt_tokens(config)
    doc = _Window(text, line, character, offset, grammar, total * CHARS_PER_TOKEN_BOUND)
    row = doc.cursor_row
    if not 0 <= character <= len(doc.contents[row]):
        raise PositionError(
            f"character {character} is outside line {line}, which has "
            f"{len(doc.contents[row])} characters"
        )
    documents = list(open_documents or ())
    root_dir = _display_root(path, documents, root)
    request = _Request(
        text=text,
        doc=doc,
        row=row,
        character=character,
        anchor_row=max(row - (line - anchor_line(line, config.anchor_lines)), 0),
        config=config,
        total=total,
        count=count,
        template=template,
        repo_name=repo_name,
        root_dir=root_dir,
        shown_path=_show(uri_to_path(path), root_dir) if path else None,
        language_id=language_id,
    )
    if head is not None:
        return _head_prompt(request, head, own_chunk)
    return _file_prompt(request, _cursor_snippets(request, documents, path), top_from=0)

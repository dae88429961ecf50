"""What the completion should be: one line or a block, when to stop generating, final trimming.

* `CursorContext.parse(prefix, suffix, language_id)` reads the cursor's surroundings once (its
  line, the brackets open before it, the lexer's state there, what the suffix closes, the
  lines around it); every step below takes that one value.
* `decide_mode` looks at the cursor: text after it on the same line, or text before it that
  doesn't open anything, asks for the rest of the line; an opened block (`:`/`{`/an opening
  bracket at the end of the line), an empty body, or a blank line at the end of a block asks
  for a block.
* `StopRule` runs inside generation after every token, on the decoded text so far, and says
  when the answer is complete, so no token is generated past it. It works line by line and
  remembers what it has already read, so each call only looks at the unfinished last line.
* `finalize` cuts the generated text where the rule would have stopped, then removes what the
  document already has (a tail that repeats the text after the cursor), and trailing blanks.
* `TypedAheadCache` serves the rest of the last suggestion while the user types into it.

Strings and comments are recognised by a small lexer (quotes, escapes, line and block comments
per language) so brackets inside them don't count. Unknown languages get bracket and
indentation rules with no string or comment syntax.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from quickdraft.context import syntax

Mode = Literal["line", "block"]
MultilineSetting = Literal["auto", "always", "never"]

OPENERS = "([{"
CLOSERS = ")]}"
PARTNER = {"(": ")", "[": "]", "{": "}"}
_CLOSER_RUN = set(")]};,:")
_TRIVIAL = set(")]};,: \t")

PREFIX_WINDOW_CHARS = 20_000
"""How much of the prefix is scanned for open brackets (from a line start)."""
SUFFIX_WINDOW_CHARS = 20_000
"""How much of the suffix is scanned for the brackets it closes."""


# --- lexer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    line_comments: tuple[str, ...] = ()
    block_comment: tuple[str, str] | None = None
    quotes: str = ""
    multiline_quotes: str = ""
    triple_quotes: bool = False
    indentation: bool = False
    block_opener: str = "{"

    def pattern(self) -> re.Pattern[str]:
        parts = [r"\\[\s\S]"]
        if self.triple_quotes:
            parts += ['"""', "'''"]
        if self.block_comment:
            parts += [re.escape(self.block_comment[0]), re.escape(self.block_comment[1])]
        parts += [re.escape(marker) for marker in self.line_comments]
        if self.quotes:
            parts.append("[" + re.escape(self.quotes) + "]")
        parts.append(r"[()\[\]{}\n]")
        return re.compile("|".join(parts))


_C_LIKE = _Spec(("//",), ("/*", "*/"), "\"'", "")
_SPECS: dict[str | None, _Spec] = {
    "python": _Spec(
        ("#",), None, "\"'", "", triple_quotes=True, indentation=True, block_opener=":"
    ),
    "javascript": _Spec(("//",), ("/*", "*/"), "\"'`", "`"),
    "typescript": _Spec(("//",), ("/*", "*/"), "\"'`", "`"),
    "tsx": _Spec(("//",), ("/*", "*/"), "\"'`", "`"),
    "rust": _Spec(("//",), ("/*", "*/"), '"', '"'),  # '\'' is mostly lifetimes in Rust
    "go": _Spec(("//",), ("/*", "*/"), "\"'`", "`"),
    "java": _C_LIKE,
    "c": _C_LIKE,
    "cpp": _C_LIKE,
    None: _Spec(),
}
_PATTERNS: dict[_Spec, re.Pattern[str]] = {}

CODE, STRING, BLOCK_COMMENT, LINE_COMMENT = range(4)


def _spec_for(language_id: str | None) -> tuple[str | None, _Spec]:
    grammar = syntax.resolve_language(language_id)
    return grammar, _SPECS.get(grammar, _SPECS[None])


@dataclass
class _LexState:
    mode: int = CODE
    quote: str = ""
    local_string: bool = False
    """The open string started inside the completion (not in the prefix)."""

    def copy(self) -> _LexState:
        return _LexState(self.mode, self.quote, self.local_string)


def _lex(spec: _Spec, text: str, state: _LexState, on_bracket, local: bool = False) -> None:
    """Advance `state` over `text`, calling on_bracket(position, char) for code brackets.

    on_bracket may return True to stop early (the state is then left at that bracket).
    """
    pattern = _PATTERNS.get(spec)
    if pattern is None:
        pattern = _PATTERNS[spec] = spec.pattern()
    block = spec.block_comment
    for match in pattern.finditer(text):
        token = match.group()
        mode = state.mode
        if token == "\n":
            if mode == LINE_COMMENT or (
                mode == STRING
                and len(state.quote) == 1
                and state.quote not in spec.multiline_quotes
            ):
                state.mode = CODE
            continue
        if mode == CODE:
            if token in "()[]{}":
                if on_bracket(match.start(), token):
                    return
            elif token in spec.line_comments:
                state.mode = LINE_COMMENT
            elif block and token == block[0]:
                state.mode = BLOCK_COMMENT
            elif token[0] in spec.quotes and not token.startswith("\\"):
                state.mode, state.quote, state.local_string = STRING, token, local
        elif mode == STRING:
            if token == state.quote:
                state.mode = CODE
        elif mode == BLOCK_COMMENT and block and token == block[1]:
            state.mode = CODE


def _pop(stack: list[str], closer: str) -> bool:
    """Pop the opener `closer` closes (recovering from a mismatch); False if none is open."""
    for depth in range(len(stack) - 1, -1, -1):
        if PARTNER[stack[depth]] == closer:
            del stack[depth:]
            return True
    return False


def _scan_prefix(spec: _Spec, prefix: str) -> tuple[list[str], _LexState]:
    """Brackets still open at the end of the prefix (innermost last), and the lexer state."""
    window = prefix
    if len(prefix) > PREFIX_WINDOW_CHARS:
        # Start at an unindented line: more likely outside any string or comment than an
        # arbitrary line, since the lexer can't know what it starts in.
        window = prefix[-PREFIX_WINDOW_CHARS:]
        start = window.find("\n") + 1
        found = re.search(r"\n(?=[^\s\"'`#/*])", window)
        if found:
            start = found.end()
        window = window[start:]
    stack: list[str] = []

    def bracket(_: int, char: str) -> bool:
        if char in OPENERS:
            stack.append(char)
        else:
            _pop(stack, char)
        return False

    state = _LexState()
    _lex(spec, window, state, bracket)
    return stack, state


def _suffix_closers(spec: _Spec, suffix: str, state: _LexState) -> list[str]:
    """Closers in the suffix that close brackets opened before it, in order."""
    window = suffix[:SUFFIX_WINDOW_CHARS]
    stack: list[str] = []
    unmatched: list[str] = []

    def bracket(_: int, char: str) -> bool:
        if char in OPENERS:
            stack.append(char)
        elif not _pop(stack, char):
            unmatched.append(char)
        return False

    _lex(spec, window, state.copy(), bracket)
    return unmatched


def _closable(open_brackets: list[str], suffix_closers: list[str]) -> int:
    """How many of the open brackets the suffix leaves for the completion to close.

    The suffix's closers are matched to the open brackets from the innermost outwards
    (skipping ones of another type). What is left is the completion's to close, innermost
    first: with `print(foo(|)` the suffix closes one of the two, so the completion may close
    one (`x)` gives `print(foo(x))`), and a second `)` would be one too many.
    """
    closed = 0
    i = 0
    for char in suffix_closers:
        while i < len(open_brackets) and PARTNER[open_brackets[-1 - i]] != char:
            i += 1
        if i < len(open_brackets):
            closed += 1
            i += 1
    return len(open_brackets) - closed


# --- small text helpers ---------------------------------------------------------------------


def _width(whitespace: str) -> int:
    return len(whitespace.expandtabs(4))


def _indent(line: str) -> int:
    return _width(line[: len(line) - len(line.lstrip())])


def _split_cursor_line(prefix: str, suffix: str) -> tuple[str, str]:
    """(text before the cursor on its line, text after it on its line)."""
    start = max(prefix.rfind("\n"), prefix.rfind("\r")) + 1
    end = len(suffix)
    for char in "\r\n":
        found = suffix.find(char)
        if found != -1:
            end = min(end, found)
    return prefix[start:], suffix[:end]


def _next_lines(suffix: str, count: int) -> list[str]:
    """The first `count` non-blank lines of the suffix after the cursor's line."""
    out = []
    for line in suffix[:SUFFIX_WINDOW_CHARS].splitlines()[1:]:
        if line.strip():
            out.append(line)
            if len(out) == count:
                break
    return out


def _previous_line(prefix: str) -> str | None:
    """The last non-blank line of the prefix before the cursor's line."""
    lines = prefix[-PREFIX_WINDOW_CHARS:].splitlines()
    for line in reversed(lines[:-1] if lines and not prefix.endswith(("\n", "\r")) else lines):
        if line.strip():
            return line
    return None


PARSE_LINES_BEFORE = 80
PARSE_LINES_AFTER = 40
"""tree-sitter questions about the cursor parse only this many lines around it."""


def _parse_windows(prefix: str, suffix: str) -> tuple[str, str]:
    """The last lines of the prefix and the first lines of the suffix, for a cheap parse."""
    start = len(prefix)
    for _ in range(PARSE_LINES_BEFORE):
        start = prefix.rfind("\n", 0, start)
        if start <= 0:
            start = 0
            break
    if start:
        start += 1
    end = -1
    for _ in range(PARSE_LINES_AFTER):
        end = suffix.find("\n", end + 1)
        if end == -1:
            end = len(suffix)
            break
    return prefix[start:], suffix[:end]


def _is_identifier_char(char: str) -> bool:
    return char.isalnum() or char == "_"


# --- the cursor's context ---------------------------------------------------------------------


@dataclass(frozen=True)
class CursorContext:
    """What the rules need to know of the text around the cursor, read once per request."""

    prefix: str
    suffix: str
    language_id: str | None
    grammar: str | None
    spec: _Spec
    line_before: str
    """The cursor's line up to the cursor."""
    rest_of_line: str
    """The cursor's line after the cursor."""
    open_brackets: tuple[str, ...]
    """Brackets open at the cursor, innermost last."""
    start_state: _LexState
    """The lexer's state at the cursor (in code, a string or a comment)."""
    closable: int
    """How many of the open brackets the suffix leaves for the completion to close."""
    next_line: str | None
    """The first non-blank line of the suffix after the cursor's line."""

    @classmethod
    def parse(cls, prefix: str, suffix: str, language_id: str | None) -> CursorContext:
        grammar, spec = _spec_for(language_id)
        line_before, rest_of_line = _split_cursor_line(prefix, suffix)
        open_brackets, state = _scan_prefix(spec, prefix)
        closable = _closable(open_brackets, _suffix_closers(spec, suffix, state))
        following = _next_lines(suffix, 1)
        return cls(
            prefix,
            suffix,
            language_id,
            grammar,
            spec,
            line_before,
            rest_of_line,
            tuple(open_brackets),
            state,
            closable,
            following[0] if following else None,
        )


# --- mode -----------------------------------------------------------------------------------


def decide_mode(context: CursorContext, multiline: MultilineSetting = "auto") -> Mode:
    """ "line" (finish the current line) or "block" (write several lines) for this cursor."""
    if multiline == "always":
        return "block"
    if multiline == "never":
        return "line"
    grammar, spec = context.grammar, context.spec
    before, rest = context.line_before, context.rest_of_line
    open_brackets, state = context.open_brackets, context.start_state
    prefix, suffix = context.prefix, context.suffix
    if state.mode != CODE:
        return "line"  # inside a string or comment: finish it
    head = before.strip()
    tail = rest.strip()
    if tail:
        # Text after the cursor: finish the line, unless the cursor sits between the braces
        # of a block (`function f() {|}`).
        if head.endswith("{") and not spec.indentation and set(tail) <= _TRIVIAL:
            return "block"
        return "line"
    if head:
        last = head[-1]
        if last in OPENERS:
            return "block"
        if spec.indentation and last == ":" and not open_brackets:
            return "block"
        return "line"
    # A blank line: a block if its block is empty, or if it is the end of its block.
    previous = _previous_line(prefix)
    if previous is not None and previous.rstrip().endswith(spec.block_opener):
        return "block"  # right after a header
    if grammar is not None:
        before_window, after_window = _parse_windows(prefix, suffix)
        if syntax.in_empty_block(before_window + after_window, len(before_window), grammar):
            return "block"
    next_line = context.next_line
    if next_line is None:
        return "block"  # end of the document
    cursor_indent = _width(before) if before else (_indent(previous) if previous else 0)
    if _indent(next_line) < cursor_indent or next_line.lstrip()[:1] in CLOSERS:
        return "block"  # the last line of a block
    return "line"


# --- stop rule ------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the rule knows after the complete lines it has read."""

    lex: _LexState
    local: list[str]
    """Brackets the completion opened and hasn't closed."""
    closed_outer: int = 0
    """Brackets from before the cursor that the completion closed."""
    base: int | None = None
    """Lines of the block must be indented at least this much."""
    content: bool = False
    """Some non-blank text has been generated."""
    blank_run: int = 0
    line_index: int = 0
    position: int = 0
    """Characters of the completion read (always a line start)."""

    def copy(self) -> _Progress:
        return _Progress(
            self.lex.copy(),
            list(self.local),
            self.closed_outer,
            self.base,
            self.content,
            self.blank_run,
            self.line_index,
            self.position,
        )


class StopRule:
    """`rule(text_so_far) -> bool`: True once the completion is complete (stop generating).

    line mode: stop at the end of the first line that has content (at once if the cursor's line
    already has text and the model starts a new line).
    both modes: stop when a line repeats the next line of the suffix.
    block mode: stop when a line dedents below the block (in any language), or after the
    closing bracket of the enclosing block when the suffix doesn't already close it; at top
    level, when a new statement starts after a blank line.
    both: stop before a closing bracket that would close something the suffix already closes.

    `cut(text)` says where the completion ends (an index into `text`) or None if it isn't
    complete yet; `cut(text, final=True)` treats the end of `text` as the end of generation.
    """

    def __init__(self, context: CursorContext, mode: Mode):
        self.context = context
        self.mode = mode
        self.grammar, self.spec = context.grammar, context.spec
        self.line_before, self.rest_of_line = context.line_before, context.rest_of_line
        self.open_brackets, self.start_state = list(context.open_brackets), context.start_state
        self.closable = context.closable
        following = context.next_line
        self.repeat_target: tuple[int, str] | None = None
        if following is not None and not set(following.strip()) <= _TRIVIAL:
            self.repeat_target = (_indent(following), following.strip())
        self.header_indent: int | None = None
        if self.line_before.strip():
            self.header_indent = _indent(self.line_before)
        self._seen = ""
        self._progress = self._initial()

    def _initial(self) -> _Progress:
        base = self.header_indent + 1 if self.header_indent is not None else None
        return _Progress(self.start_state.copy(), [], base=base)

    def __call__(self, text: str) -> bool:
        return self.cut(text) is not None

    # -- the scan ---------------------------------------------------------------------------

    def cut(self, text: str, final: bool = False) -> int | None:
        unusable = first_unusable(text)
        if unusable is not None:
            # Nothing after a control character or a model marker belongs in the document.
            text, final = text[:unusable], True
        progress = self._progress
        if not text.startswith(self._seen):
            progress = self._initial()
            self._seen = ""
        progress = progress.copy()
        while True:
            start = progress.position
            newline = text.find("\n", start)
            complete = newline != -1
            line = text[start:newline] if complete else text[start:]
            result = self._line(line, start, complete or final, progress)
            if result is not None:
                return result
            if not complete:
                return len(text) if final else None
            progress.position = newline + 1
            progress.line_index += 1
            # Remember complete lines, so the next call starts from here.
            self._seen = text[: progress.position]
            self._progress = progress.copy()

    def _line(self, line: str, offset: int, complete: bool, p: _Progress) -> int | None:
        """Read one line of the completion; return a cut position to stop, None to go on."""
        body = line.rstrip("\r")
        first = p.line_index == 0
        header = first and bool(self.line_before.strip())  # line 0 continues a non-blank line
        effective = self.line_before + body if first else body
        has_text = bool(body.strip())
        before_line = offset - 1 if offset > 0 else 0  # cut before this line's "\n"

        if has_text and not header and p.lex.mode == CODE and not p.local:
            indent = _indent(effective)
            if complete and self.repeat_target == (indent, effective.strip()):
                return before_line  # the suffix's next line: the document already has it
            if self.mode == "block":
                if p.base is None:
                    p.base = indent
                elif indent < p.base:
                    if body.lstrip()[:1] not in CLOSERS:
                        return before_line  # dedented out of the block
                    # a closing bracket: the bracket rule below decides whether it belongs
                elif p.base == 0 and indent == 0 and p.blank_run and p.content:
                    return before_line  # top level: a new statement after a blank line

        # Brackets, skipping strings and comments.
        cut_at: list[int] = []
        outer_at: list[int] = []

        def bracket(position: int, char: str) -> bool:
            if char in OPENERS:
                p.local.append(char)
                return False
            if _pop(p.local, char):
                return False
            k = p.closed_outer + 1
            if k <= self.closable and PARTNER[self.open_brackets[-k]] == char:
                p.closed_outer = k
                outer_at.append(position)
                return False
            cut_at.append(offset + position)  # would close what the suffix already closes
            return True

        _lex(self.spec, line + "\n" if complete else line, p.lex, bracket, local=True)
        if cut_at:
            return cut_at[0]
        lead = len(body) - len(body.lstrip())
        if self.mode == "block" and outer_at and outer_at[0] == lead and not p.local:
            # A line that starts by closing the block the completion was written in (the
            # suffix doesn't close it): stop after that run of closers (`}`, `});`, `):`).
            end = lead
            while end < len(body) and body[end] in _CLOSER_RUN:
                end += 1
            if end == len(body) and not complete:
                return None  # the run may go on
            return offset + end

        if has_text:
            if self.mode == "line" and complete:
                return offset + len(body)
            p.content = True
            p.blank_run = 0
        elif complete and not header:
            p.blank_run += 1
        elif complete and self.mode == "line":
            return 0  # the model moved to a new line: nothing to add to this one
        return None


# --- final text -----------------------------------------------------------------------------

_UNUSABLE = re.compile(
    # Control characters other than tab, newline and carriage return (which the line rules
    # handle), and DEL.
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
    # Model markers written as text, whatever the family: the Qwen/StarCoder kind
    # (`<|fim_middle|>`, `<|cursor|>`, `<fim_prefix>`), DeepSeek's fullwidth bars
    # (`<｜fim▁hole｜>`), CodeLlama's `<PRE>`/`<SUF>`/`<MID>`/`<EOT>`.
    r"|<\|[a-z_]+\|>|<(?:fim|file|repo)_[a-z]+>|<｜[^｜\n]{1,40}｜>|<(?:PRE|SUF|MID|EOT)>"
)


def first_unusable(text: str) -> int | None:
    """Where the first character a completion must never insert stands (a control character
    other than tab and line breaks, or a model marker written as plain text), or None."""
    found = _UNUSABLE.search(text)
    return found.start() if found else None


def _single_line(text: str, line_before: str) -> str:
    """Line mode: the first line with content, fitted to the cursor's line."""
    if "\n" not in text:
        return text.rstrip("\r")
    head = text.split("\n", 1)[0].rstrip("\r")
    if head.strip() or line_before.strip():
        return head if head.strip() else ""
    for line in text.split("\n")[1:]:
        line = line.rstrip("\r")
        if line.strip():
            # The cursor's line is blank; keep the part of the indentation it doesn't have yet.
            if line.startswith(line_before):
                return line[len(line_before) :]
            return line.lstrip()
    return ""


def _local_state_at(spec: _Spec, start: _LexState, text: str, position: int) -> tuple[int, bool]:
    """(brackets opened by the completion and still open, inside a string it opened) at
    `position` of the completion."""
    local: list[str] = []

    def bracket(_: int, char: str) -> bool:
        if char in OPENERS:
            local.append(char)
        else:
            _pop(local, char)
        return False

    state = start.copy()
    _lex(spec, text[:position], state, bracket, local=True)
    return len(local), state.mode == STRING and state.local_string


def _drop_suffix_overlap(text: str, rule: StopRule) -> str:
    """Remove a tail of `text` that the rest of the cursor's line already has (`)`, `";`)."""
    rest = rule.rest_of_line
    if not rest.strip() or not text:
        return text
    last_line = text[text.rfind("\n") + 1 :]
    for k in range(min(len(last_line), len(rest)), 0, -1):
        overlap = rest[:k]
        if not text.endswith(overlap) or not overlap.strip():
            continue
        if any(char in "()[]{}" for char in overlap):
            continue  # brackets are the bracket rule's business
        position = len(text) - k
        if (
            _is_identifier_char(overlap[0])
            and position > 0
            and _is_identifier_char(text[position - 1])
        ):
            continue  # would split a word
        if k < len(rest) and _is_identifier_char(overlap[-1]) and _is_identifier_char(rest[k]):
            continue
        depth, in_own_string = _local_state_at(rule.spec, rule.start_state, text, position)
        if depth or in_own_string:
            continue
        return text[:position]
    return text


def _strip_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip()


def _drop_broken_tail(text: str, prefix: str, suffix: str, grammar: str | None) -> str:
    """Block mode: if the completion adds syntax errors, drop up to 3 trailing lines when that
    removes them (typically a statement cut off by the token limit)."""
    if grammar is None or "\n" not in text:
        return text
    before, after = _parse_windows(prefix, suffix)
    baseline = syntax.error_count(before + after, grammar)
    errors = syntax.error_count(before + text + after, grammar)
    if baseline is None or errors is None or errors <= baseline:
        return text
    lines = text.split("\n")
    for drop in range(1, min(3, len(lines) - 1) + 1):
        candidate = "\n".join(lines[:-drop]).rstrip()
        if not candidate.strip():
            break
        found = syntax.error_count(before + candidate + after, grammar)
        if found is not None and found <= baseline:
            return candidate
    return text


def finalize(text: str, context: CursorContext, mode: Mode) -> str:
    """The text to insert: cut where the StopRule stops, without what the suffix already has,
    without trailing whitespace; a single line in line mode."""
    prefix, suffix = context.prefix, context.suffix
    rule = StopRule(context, mode)
    cut = rule.cut(text, final=True)
    if cut is not None:
        text = text[:cut]
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # the editor applies its own line ends
    if mode == "line":
        text = _single_line(text, rule.line_before).rstrip()
    else:
        text = _strip_lines(text)
        text = _drop_broken_tail(text, prefix, suffix, rule.grammar)
    text = _drop_suffix_overlap(text, rule).rstrip()
    if not text.strip():
        return ""
    return text


# --- typed-ahead cache ----------------------------------------------------------------------


@dataclass
class _Suggestion:
    prefix: str
    suffix: str | None
    text: str
    source: str


@dataclass(frozen=True)
class TypedAhead:
    """An answer from work done before the request: what to insert ("" when a prefetch found
    the model has nothing to add there), and where it came from ("typed-ahead": the rest of the
    suggestion being typed; "prefetch": computed ahead for the text that accepting a suggestion
    leads to)."""

    text: str
    source: str


class TypedAheadCache:
    """Suggestions per document, served again while the user types what one says.

    `remember(uri, prefix, text, suffix)` after a completion (and, with source "prefetch", for
    the text a suggestion's acceptance would give); `lookup(uri, new_prefix, suffix)` returns
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
    ) -> None:
        entries = [e for e in self._entries.get(uri, []) if e.prefix != prefix]
        if text or source == "prefetch":  # a prefetch may learn that nothing follows
            entries.append(_Suggestion(prefix, suffix, text, source))
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
            if not entry.text and not typed:  # prefetched: the model has nothing to add here
                kept.append(entry)
                if best is None or len(entry.prefix) > best[0]:
                    best = (len(entry.prefix), TypedAhead("", entry.source))
                continue
            if not entry.text.startswith(typed) or len(typed) >= len(entry.text):
                continue
            remaining = entry.text[len(typed) :]
            if not remaining.strip():
                continue
            kept.append(entry)
            if best is None or len(entry.prefix) > best[0]:
                source = entry.source if not typed else "typed-ahead"
                best = (len(entry.prefix), TypedAhead(remaining, source))
        self._entries[uri] = kept
        return best[1] if best is not None else None

    def invalidate(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def clear(self) -> None:
        self._entries.clear()

"""The text around the cursor, read once per request: `CursorContext.parse(prefix, suffix,
language_id)` gives its line, the brackets open before it, the lexer's state there, what the
suffix closes and the lines around it. It is read before the prompt is built into tokens, and
the post-processing rules (`postprocess`: the mode, the stop rule, the final trimming) all take
this one value.

Strings and comments are recognised by a small lexer (quotes, escapes, line and block comments
per language) so brackets inside them don't count. Unknown languages get bracket and
indentation rules with no string or comment syntax.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import quickdraft.context.syntax as syntax
from quickdraft.context.syntax import Lexicon

OPENERS = "([{"
PARTNER = {"(": ")", "[": "]", "{": "}"}

PREFIX_WINDOW_CHARS = 20_000
"""How much of the prefix is scanned for open brackets (from a line start)."""
SUFFIX_WINDOW_CHARS = 20_000
"""How much of the suffix is scanned for the brackets it closes."""


# --- lexer ----------------------------------------------------------------------------------


def _pattern(lexicon: Lexicon) -> re.Pattern[str]:
    """One regular expression for everything the lexer stops at in this language."""
    parts = [r"\\[\s\S]"]
    if lexicon.triple_quotes:
        parts += ['"""', "'''"]
    if lexicon.block_comment:
        parts += [re.escape(lexicon.block_comment[0]), re.escape(lexicon.block_comment[1])]
    parts += [re.escape(marker) for marker in lexicon.line_comments]
    if lexicon.quotes:
        parts.append("[" + re.escape(lexicon.quotes) + "]")
    parts.append(r"[()\[\]{}\n]")
    return re.compile("|".join(parts))


_PATTERNS: dict[Lexicon, re.Pattern[str]] = {}

CODE, STRING, BLOCK_COMMENT, LINE_COMMENT = range(4)


def _language_of(language_id: str | None) -> tuple[str | None, Lexicon]:
    """(tree-sitter grammar or None, how the language writes comments and strings)."""
    language = syntax.find_language(language_id)
    return (language.grammar, language.lexicon) if language else (None, syntax.PLAIN_TEXT)


@dataclass
class LexState:
    mode: int = CODE
    quote: str = ""
    local_string: bool = False
    """The open string started inside the completion (not in the prefix)."""

    def copy(self) -> LexState:
        return LexState(self.mode, self.quote, self.local_string)


def lex(spec: Lexicon, text: str, state: LexState, on_bracket, local: bool = False) -> None:
    """Advance `state` over `text`, calling on_bracket(position, char) for code brackets.

    on_bracket may return True to stop early (the state is then left at that bracket).
    """
    pattern = _PATTERNS.get(spec)
    if pattern is None:
        pattern = _PATTERNS[spec] = _pattern(spec)
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


def pop_opener(stack: list[str], closer: str) -> bool:
    """Pop the opener `closer` closes (recovering from a mismatch); False if none is open."""
    for depth in range(len(stack) - 1, -1, -1):
        if PARTNER[stack[depth]] == closer:
            del stack[depth:]
            return True
    return False


def _scan_prefix(spec: Lexicon, prefix: str) -> tuple[list[str], LexState]:
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
            pop_opener(stack, char)
        return False

    state = LexState()
    lex(spec, window, state, bracket)
    return stack, state


def _suffix_closers(spec: Lexicon, suffix: str, state: LexState) -> list[str]:
    """Closers in the suffix that close brackets opened before it, in order."""
    window = suffix[:SUFFIX_WINDOW_CHARS]
    stack: list[str] = []
    unmatched: list[str] = []

    def bracket(_: int, char: str) -> bool:
        if char in OPENERS:
            stack.append(char)
        elif not pop_opener(stack, char):
            unmatched.append(char)
        return False

    lex(spec, window, state.copy(), bracket)
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


def width(whitespace: str) -> int:
    return len(whitespace.expandtabs(4))


def indent_width(line: str) -> int:
    return width(line[: len(line) - len(line.lstrip())])


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


def previous_line(prefix: str) -> str | None:
    """The last non-blank line of the prefix before the cursor's line."""
    lines = prefix[-PREFIX_WINDOW_CHARS:].splitlines()
    for line in reversed(lines[:-1] if lines and not prefix.endswith(("\n", "\r")) else lines):
        if line.strip():
            return line
    return None


PARSE_LINES_BEFORE = 80
PARSE_LINES_AFTER = 40
"""tree-sitter questions about the cursor parse only this many lines around it."""


def parse_windows(prefix: str, suffix: str) -> tuple[str, str]:
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


def is_identifier_char(char: str) -> bool:
    return char.isalnum() or char == "_"


# --- the cursor's context ---------------------------------------------------------------------


@dataclass(frozen=True)
class CursorContext:
    """What the rules need to know of the text around the cursor, read once per request."""

    prefix: str
    suffix: str
    language_id: str | None
    grammar: str | None
    spec: Lexicon
    line_before: str
    """The cursor's line up to the cursor."""
    rest_of_line: str
    """The cursor's line after the cursor."""
    open_brackets: tuple[str, ...]
    """Brackets open at the cursor, innermost last."""
    start_state: LexState
    """The lexer's state at the cursor (in code, a string or a comment)."""
    closable: int
    """How many of the open brackets the suffix leaves for the completion to close."""
    next_line: str | None
    """The first non-blank line of the suffix after the cursor's line."""

    @classmethod
    def parse(cls, prefix: str, suffix: str, language_id: str | None) -> CursorContext:
        grammar, spec = _language_of(language_id)
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

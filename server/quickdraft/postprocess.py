"""What the completion should be: one line or a block, when to stop generating, final trimming.

Every step takes the cursor's context, read once (`context.cursor.CursorContext`: its line,
the brackets open before it, the lexer's state there, what the suffix closes, the lines around
it).
* `decide_mode` looks at the cursor: text after it on the same line, or text before it that
  doesn't open anything, asks for the rest of the line; an opened block (`:`/`{`/an opening
  bracket at the end of the line), an empty body, or a blank line at the end of a block asks
  for a block.
* `StopRule` runs inside generation after every token, on the decoded text so far, and says
  when the answer is complete, so no token is generated past it. It works line by line and
  remembers what it has already read, so each call only looks at the unfinished last line.
* `finalize` cuts the generated text where the rule would have stopped, then removes what the
  document already has (a tail that repeats the text after the cursor), and trailing blanks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import quickdraft.context.syntax as syntax
from quickdraft.context.cursor import (
    CODE,
    OPENERS,
    PARTNER,
    STRING,
    CursorContext,
    LexState,
    indent_width,
    is_identifier_char,
    lex,
    parse_windows,
    pop_opener,
    previous_line,
    width,
)
from quickdraft.context.syntax import Lexicon

Mode = Literal["line", "block"]
MultilineSetting = Literal["auto", "always", "never"]

CLOSERS = ")]}"
CLOSER_RUN = set(")]};,:")
TRIVIAL = set(")]};,: \t")


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
        if head.endswith("{") and not spec.indentation and set(tail) <= TRIVIAL:
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
    previous = previous_line(prefix)
    if previous is not None and previous.rstrip().endswith(spec.block_opener):
        return "block"  # right after a header
    if grammar is not None:
        before_window, after_window = parse_windows(prefix, suffix)
        if syntax.in_empty_block(before_window + after_window, len(before_window), grammar):
            return "block"
    next_line = context.next_line
    if next_line is None:
        return "block"  # end of the document
    cursor_indent = width(before) if before else (indent_width(previous) if previous else 0)
    if indent_width(next_line) < cursor_indent or next_line.lstrip()[:1] in CLOSERS:
        return "block"  # the last line of a block
    return "line"


# --- stop rule ------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the rule knows after the complete lines it has read."""

    lex: LexState
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
    both modes: stop when a line repeats the next line of the suffix (the document has it
    already); when the cursor's own line, completed, is that next line, nothing is suggested.
    `repeated` then says the model was re-typing existing code.
    block mode: stop when a line dedents below the block (in any language), or after the
    closing bracket of the enclosing block when the suffix doesn't already close it; at top
    level, when a new statement starts after a blank line.
    both: stop before a closing bracket that would close something the suffix already closes.

    `cut(text)` says where the completion ends (an index into `text`) or None if it isn't
    complete yet; `cut(text, final=True)` treats the end of `text` as the end of generation.
    """

    def __init__(self, context: CursorContext, mode: Mode, *, check_repeats: bool = True):
        self.context = context
        self.mode = mode
        self.grammar, self.spec = context.grammar, context.spec
        self.line_before, self.rest_of_line = context.line_before, context.rest_of_line
        self.open_brackets, self.start_state = list(context.open_brackets), context.start_state
        self.closable = context.closable
        following = context.next_line
        self.repeat_target: tuple[int, str] | None = None
        self.repeated = False
        """Whether the rule cut a line that repeats the suffix's next line."""
        if check_repeats and following is not None and not set(following.strip()) <= TRIVIAL:
            self.repeat_target = (indent_width(following), following.strip())
        self.header_indent: int | None = None
        if self.line_before.strip():
            self.header_indent = indent_width(self.line_before)
        self._seen = ""
        self._progress = self._initial()

    def _initial(self) -> _Progress:
        base = self.header_indent + 1 if self.header_indent is not None else None
        return _Progress(self.start_state.copy(), [], base=base)

    def __call__(self, text: str) -> bool:
        return self.cut(text) is not None

    def _completes_to_next_line(self, effective: str) -> bool:
        """Whether the cursor's line with this completion of it (`effective`, and the rest of
        the line after the cursor) reads as the suffix's next line: typing `s` above
        `staging = Path(` must not suggest `taging = Path(`."""
        if self.repeat_target is None or self.start_state.mode != CODE:
            return False
        indent = indent_width(effective)
        whole = (effective + self.rest_of_line).strip()
        return (indent, effective.strip()) == self.repeat_target or (
            indent,
            whole,
        ) == self.repeat_target

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

        if header and complete and has_text and self._completes_to_next_line(effective):
            self.repeated = True
            return 0  # the cursor's line, completed, is the next line: the document has it
        if has_text and not header and p.lex.mode == CODE and not p.local:
            indent = indent_width(effective)
            if complete and self.repeat_target == (indent, effective.strip()):
                self.repeated = True
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
            if pop_opener(p.local, char):
                return False
            k = p.closed_outer + 1
            if k <= self.closable and PARTNER[self.open_brackets[-k]] == char:
                p.closed_outer = k
                outer_at.append(position)
                return False
            cut_at.append(offset + position)  # would close what the suffix already closes
            return True

        lex(self.spec, line + "\n" if complete else line, p.lex, bracket, local=True)
        if cut_at:
            return cut_at[0]
        lead = len(body) - len(body.lstrip())
        if self.mode == "block" and outer_at and outer_at[0] == lead and not p.local:
            # A line that starts by closing the block the completion was written in (the
            # suffix doesn't close it): stop after that run of closers (`}`, `});`, `):`).
            end = lead
            while end < len(body) and body[end] in CLOSER_RUN:
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


def _local_state_at(spec: Lexicon, start: LexState, text: str, position: int) -> tuple[int, bool]:
    """(brackets opened by the completion and still open, inside a string it opened) at
    `position` of the completion."""
    local: list[str] = []

    def bracket(_: int, char: str) -> bool:
        if char in OPENERS:
            local.append(char)
        else:
            pop_opener(local, char)
        return False

    state = start.copy()
    lex(spec, text[:position], state, bracket, local=True)
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
            is_identifier_char(overlap[0])
            and position > 0
            and is_identifier_char(text[position - 1])
        ):
            continue  # would split a word
        if k < len(rest) and is_identifier_char(overlap[-1]) and is_identifier_char(rest[k]):
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
    before, after = parse_windows(prefix, suffix)
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


@dataclass(frozen=True)
class Finished:
    """A completion's text as shown, and whether it repeated code the document already has."""

    text: str
    repeated: bool = False
    """The model's output re-typed the existing line(s) after the cursor (cut by the rule)."""
    changed: bool = False
    """The repeat rule changed what is shown (without it, the repeat would have been shown)."""


def finish(text: str, context: CursorContext, mode: Mode) -> Finished:
    """`finalize`, and what the repeat rule did to this text (for stats and the bench)."""
    rule = StopRule(context, mode)
    shown = _finalize(text, context, mode, rule)
    if not rule.repeated:
        return Finished(shown)
    unchecked = _finalize(text, context, mode, StopRule(context, mode, check_repeats=False))
    return Finished(shown, repeated=True, changed=unchecked != shown)


def finalize(text: str, context: CursorContext, mode: Mode) -> str:
    """The text to insert: cut where the StopRule stops, without what the suffix already has,
    without trailing whitespace; a single line in line mode."""
    return _finalize(text, context, mode, StopRule(context, mode))


def _finalize(text: str, context: CursorContext, mode: Mode, rule: StopRule) -> str:
    prefix, suffix = context.prefix, context.suffix
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

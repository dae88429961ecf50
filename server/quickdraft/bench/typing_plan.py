"""What the editor does while the user types a hole's hidden text: the keystrokes (one
character each, Enter with the indentation an editor inserts, and the fix when the file's own
differs), the part of the hidden text that is typed, whether a suggestion agrees with what is
typed next, and where the bench asks in another open file. Pure functions of text."""

from __future__ import annotations

from dataclasses import dataclass

OPENERS = (":", "{", "[", "(")
"""A line ending in one of these makes Enter indent one level more."""


@dataclass(frozen=True)
class Keystroke:
    kind: str
    """`char`, `enter` (a line break and the indentation the editor adds) or `indent` (the
    indentation put right in one go, as Tab or Backspace do)."""
    delete: int
    """Characters before the cursor it replaces."""
    insert: str
    done: int
    """Characters of the hidden text in the document once it is typed."""
    comparable: bool
    """The text before the cursor is then the file's own, so a suggestion can be judged."""


def leading_whitespace(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def guess_indent_unit(text: str) -> str:
    """What the editor inserts for one level of indentation in `text` (tab, or 2-8 spaces)."""
    tabs = spaces = 0
    steps: dict[int, int] = {}
    previous = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        indent = leading_whitespace(line)
        if indent.startswith("\t"):
            tabs += 1
            continue
        if indent:
            spaces += 1
        width = len(indent)
        if 2 <= width - previous <= 8:
            steps[width - previous] = steps.get(width - previous, 0) + 1
        previous = width
    if tabs > spaces:
        return "\t"
    if not steps:
        return "    "
    return " " * max(steps, key=lambda step: (steps[step], -step))


def auto_indent(line: str, unit: str) -> str:
    """The indentation an editor puts on the new line when Enter is pressed at the end of
    `line`: the line's own, one level more after an opening bracket or a colon."""
    base = leading_whitespace(line)
    return base + unit if line.rstrip().endswith(OPENERS) else base


def plan_keystrokes(truth: str, line_before: str, unit: str) -> list[Keystroke]:
    """The keystrokes that type `truth` after `line_before` (the cursor line up to the cursor),
    then press Enter once more."""
    keys: list[Keystroke] = []
    current = line_before
    position = 0
    for number, line in enumerate(truth.split("\n")):
        column = 0
        if number:
            auto, actual = auto_indent(current, unit), leading_whitespace(line)
            fits = actual.startswith(auto)
            keys.append(
                Keystroke("enter", 0, "\n" + auto, position + len(auto) if fits else position, fits)
            )
            if auto != actual:
                keys.append(Keystroke("indent", len(auto), actual, position + len(actual), True))
            column = len(actual)
            current = ""
        for char in line[column:]:
            column += 1
            keys.append(Keystroke("char", 0, char, position + column, True))
        current += line
        position += len(line) + 1
    keys.append(Keystroke("enter", 0, "\n" + auto_indent(current, unit), len(truth), False))
    return keys


def typing_truth(truth: str, max_lines: int) -> str:
    """The part of a hole's hidden text that is typed: its first `max_lines` lines."""
    return "\n".join(truth.split("\n")[:max_lines]).rstrip()


def suggestion_matches(suggestion: str, remaining: str) -> bool:
    """The suggestion agrees with what is typed next: it is the start of the remaining hidden
    text, or the rest of the hidden text's line is the start of the suggestion."""
    body = suggestion.rstrip()
    if not body.strip():
        return False
    rest_of_line = remaining.split("\n", 1)[0].rstrip()
    return remaining.startswith(body) or bool(rest_of_line) and body.startswith(rest_of_line)


def other_file_spot(text: str) -> int:
    """Where the bench asks in another open file: the end of its middle non-blank line."""
    lines = text.split("\n")
    filled = [n for n, line in enumerate(lines) if line.strip()]
    if not filled:
        return 0
    number = filled[len(filled) // 2]
    return sum(len(line) + 1 for line in lines[:number]) + len(lines[number].rstrip("\r"))

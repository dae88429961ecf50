"""Next edits for a statement moved: a line hoisted above its copies, a variable inlined.

- `hoist`: the hunk inserted a statement (a call, an assignment, an import) that already stands,
  word for word, further down the same function (or module): it was moved up, to run once
  before the branches that each did it, so the copies below are removed, nearest first.
- `inline`: the hunk deleted one assignment `name = value`, and `name` is bound nowhere else in
  its function: its uses below now read an unbound name, so each becomes `value` (in
  parentheses unless it is a name, an attribute, a subscript, a call or a literal). Only a value
  that is safe to read twice: a call is inlined only where one use is left.

Both go on after Tab: a hunk that removed one copy of a line an earlier hunk inserted goes on
with the other copies, and one that replaced the name by the value an earlier hunk deleted goes
on with the other uses. Pure functions; offsets are code points.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from quickdraft.context.edit_history import Hunk
from quickdraft.context.edit_rules import (
    CONFIDENCE,
    FUNCTION_TYPES,
    REPEAT_MAX_SITES,
    Candidate,
    LatestEdit,
    TextEdit,
    Tree,
    binds,
    changed_lines,
    indent_of,
    inserted_lines,
    rebinds,
    references,
    walk,
)
from quickdraft.context.edit_words import in_prose

HOISTED_TYPES = frozenset({"expression_statement", "import_statement", "import_from_statement"})
"""Statements whose copies a hoisted line replaces: a call or an assignment, an import."""
HOIST_MIN_CHARS = 8
"""Shorter statements (`i += 1`, `pass`-like calls) recur for reasons of their own."""
ATOM_TYPES = frozenset(
    {
        "identifier",
        "attribute",
        "subscript",
        "call",
        "string",
        "integer",
        "float",
        "true",
        "false",
        "none",
        "parenthesized_expression",
        "list",
        "dictionary",
        "tuple",
        "set",
    }
)
"""Values that need no parentheses where a name stood."""
EARLIER = 4
"""Earlier hunks looked at for the edit a Tab goes on with."""
LINES_MIN_CHARS = 24
"""A run of lines (`lines`) shorter than this, comments aside, recurs for reasons of its own."""
LINES_INSERTED_LESS = 0.1
"""Lines inserted between two others are a weaker guide than lines changed: the same two lines
may stand together elsewhere for another reason."""


def _deleted_lines(edit: LatestEdit) -> str | None:
    """The whole lines the hunk deleted, when deleting is all it did."""
    changed = changed_lines(edit)
    return None if changed.new or not changed.old else "".join(changed.old)


def _statement_lines(text: str) -> list[str]:
    """The lines of `text` that hold code, stripped (blank lines and comments aside)."""
    return [s for line in text.splitlines() if (s := line.strip()) and not s.startswith("#")]


def _scope(tree: Tree, offset: int) -> Any:
    """The innermost function holding `offset`, else the module."""
    node = tree.at(offset, offset)
    while node is not None:
        if node.type in FUNCTION_TYPES:
            return node
        node = node.parent
    return tree.root


def _statement_at(tree: Tree, start: int, end: int) -> Any | None:
    """The statement (of HOISTED_TYPES) that spans exactly `start`..`end`, or None."""
    node = tree.at(start, end)
    while node is not None and tree.span(node) == (start, end):
        if node.type in HOISTED_TYPES:
            return node
        node = node.parent
    return None


def _lines_at(text: str) -> list[tuple[int, int, str]]:
    """(start, end with its break, stripped text) of every line of `text`."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        out.append((start, end, text[start:end].strip()))
        start = end
    return out


# --- hoist ------------------------------------------------------------------------------------


def _copies_below(tree: Tree, statement: str, above: int) -> Iterator[tuple[int, int]]:
    """Whole-line spans of the other lines reading `statement` below offset `above`, in the
    function (or module) holding `above`, nested functions aside."""
    scope = _scope(tree, above)
    text = tree.text
    _, scope_end = tree.span(scope)
    nested = [
        tree.span(node)
        for node in walk(scope, skip=lambda n: n.type in FUNCTION_TYPES)
        if node is not scope and node.type in FUNCTION_TYPES
    ]
    for start, end, stripped in _lines_at(text):
        if start <= above or stripped != statement:
            continue
        if start > scope_end:
            break
        first = text.index(stripped, start)
        if not any(a <= first < b for a, b in nested) and _statement_at(
            tree, first, first + len(stripped)
        ):
            yield start, end


def hoist_candidates(edit: LatestEdit) -> list[Candidate]:
    """`hoist`: the copies below of each statement the hunk inserted (or, after a Tab deleted
    one copy, of the statement an earlier hunk inserted), each line removed whole."""
    if edit.grammar is None:
        return []
    tree = edit.after_tree
    if tree.root is None:
        return []
    spans: list[tuple[int, int, str]] = []
    inserted = inserted_lines(edit)
    if inserted is not None:
        for statement in _statement_lines(edit.after[inserted[0] : inserted[1]]):
            spans.extend((*span, statement) for span in _hoisted_copies(tree, statement, inserted))
    else:
        spans.extend(_copies_after_tab(edit, tree))
    return [
        Candidate("hoist", TextEdit(start, end, ""), CONFIDENCE["hoist"], f"{statement} moved up")
        for start, end, statement in dict.fromkeys(spans)
    ]


def _hoisted_copies(tree: Tree, statement: str, inserted: tuple[int, int]) -> list[tuple[int, int]]:
    if len(statement) < HOIST_MIN_CHARS:
        return []
    at = tree.text.find(statement, inserted[0], inserted[1])
    if at < 0 or _statement_at(tree, at, at + len(statement)) is None:
        return []
    return list(_copies_below(tree, statement, inserted[1] - 1))


def _copies_after_tab(edit: LatestEdit, tree: Tree) -> list[tuple[int, int, str]]:
    """A hunk that deleted one copy of a line an earlier hunk inserted: the other copies below
    the line that stands where it was inserted."""
    statements = _statement_lines(_deleted_lines(edit) or "")
    if len(statements) != 1:
        return []
    statement = statements[0]
    if not any(_inserted_statement(hunk, statement) for hunk in edit.earlier[-EARLIER:]):
        return []
    text = tree.text
    for line_start, line in _lines_before(text, edit.start):
        if line.strip() == statement:
            at = line_start + len(line) - len(line.lstrip())
            if _statement_at(tree, at, at + len(statement)) is None:
                return []
            return [
                (start, end, statement)
                for start, end in _copies_below(tree, statement, line_start + len(line))
            ]
    return []


def _inserted_statement(hunk: Hunk, statement: str) -> bool:
    return statement in _statement_lines(hunk.new) and statement not in _statement_lines(hunk.old)


def _lines_before(text: str, offset: int) -> Iterator[tuple[int, str]]:
    """(start, text) of the lines above the one holding `offset`, nearest first."""
    end = text.rfind("\n", 0, offset)
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        yield start, text[start:end]
        end = start - 1


# --- inline -----------------------------------------------------------------------------------


def _assignment(text: str, grammar: str, start: int) -> tuple[str, str, str] | None:
    """(name, value, the value's node type) of the one-line `name = value` that the line of
    `text` at `start` holds (no annotation, one name), else None."""
    tree = Tree(text, grammar)
    if tree.root is None:
        return None
    end = text.find("\n", start)
    line = text[start : len(text) if end < 0 else end]
    first = start + len(line) - len(line.lstrip())
    statement = _statement_at(tree, first, first + len(line.strip()))
    if statement is None or statement.type != "expression_statement":
        return None
    assignment = statement.named_children[0]
    if assignment.type != "assignment" or assignment.child_by_field_name("type") is not None:
        return None
    left, right = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
    if left is None or right is None or left.type != "identifier":
        return None
    return tree.node_text(left), tree.node_text(right), right.type


def _inlined(value: str, kind: str) -> str:
    return value if kind in ATOM_TYPES else f"({value})"


def inline_candidates(edit: LatestEdit) -> list[Candidate]:
    """The uses left of a variable whose one-line assignment the hunk deleted (with uses in the
    hunk's own lines inlined or not: Tab after Tab on adjacent lines is one hunk), or that an
    earlier hunk deleted when this one inlined one use."""
    if edit.grammar is None:
        return []
    old = edit.old.splitlines(keepends=True)
    for i, line in enumerate(old):
        found = _assignment(line.strip(), edit.grammar, 0) if line.strip() else None
        if found is not None and _inlined_all(found, "".join(old[:i] + old[i + 1 :]), edit.new):
            return _uses(edit, *found, edit.start)
    for hunk in edit.earlier[-EARLIER:]:
        statements = _statement_lines(hunk.old)
        if hunk.new.strip() or len(statements) != 1:
            continue
        found = _assignment(statements[0], edit.grammar, 0)
        if found is not None and _inlined_all(found, edit.old, edit.new):
            return _uses(edit, *found, 0)
    return []


def _inlined_all(assignment: tuple[str, str, str], old: str, new: str) -> bool:
    """Whether `new` is `old` with every use of the assignment's name read as its value (none
    at all: the assignment alone deleted)."""
    name, value, kind = assignment
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
    return pattern.sub(lambda _: _inlined(value, kind), old) == new


def _uses(edit: LatestEdit, name: str, value: str, kind: str, below: int) -> list[Candidate]:
    """The uses of `name` from offset `below` on (the hunk's own lines aside) in the function
    holding the edit, each replaced by `value`; none when the function still binds `name` (or
    is the module)."""
    tree = edit.after_tree
    if tree.root is None:
        return []
    scope = _scope(tree, edit.start)
    if scope is tree.root or binds(scope, name, tree):
        return []
    uses = [
        (start, end)
        for start, end in references(scope, name, tree, rebinds(name, tree))
        if start >= below and not edit.start <= start < edit.new_end
    ]
    if not uses or (kind == "call" and len(uses) > 1):
        return []
    text = _inlined(value, kind)
    note = f"{name} = {value} inlined"
    return [
        Candidate("inline", TextEdit(start, end, text), CONFIDENCE["inline"], note)
        for start, end in uses
    ]


# --- lines ------------------------------------------------------------------------------------


def _reindent(lines: list[str], old_indent: str, new_indent: str) -> str | None:
    """`lines` moved from `old_indent` to `new_indent` (None: a line starts left of it)."""
    out = []
    for line in lines:
        if not line.strip():
            out.append(line.lstrip(" \t"))
        elif line.startswith(old_indent):
            out.append(new_indent + line[len(old_indent) :])
        else:
            return None
    return "".join(out)


def lines_candidates(edit: LatestEdit) -> list[Candidate]:
    """`lines`: the hunk's lines replayed where the same lines stand, word for word (stripped):
    lines replaced -> the other runs of those lines, each given the new ones at its own
    indentation; lines inserted -> between the other pairs of the lines it went between. A run
    must hold LINES_MIN_CHARS of code at least, so it names one thing."""
    if not edit.new.endswith("\n"):
        return []
    changed = changed_lines(edit)
    head, old, new = changed.head, changed.old, changed.new
    if not new:
        return []
    lines = _lines_at(edit.after)
    first = head + next(
        (i for i, (start, _, _) in enumerate(lines) if start >= edit.start), len(lines)
    )
    last = first + len(new)  # the changed lines are lines[first:last] of `after`
    if old:
        pattern = [line.strip() for line in old]
        indent = indent_of(old[0])
        inserted = False
    else:
        if first == 0 or last >= len(lines):
            return []
        pattern = [lines[first - 1][2], lines[last][2]]
        indent = indent_of(edit.after[lines[first - 1][0] : lines[first - 1][1]])
        inserted = True
    code = sum(len(line) for line in pattern if not line.startswith("#"))
    if code < LINES_MIN_CHARS or not (pattern[0] and pattern[-1]):
        return []
    anchor = lines[first - 1 if inserted else first]
    at = edit.after.index(anchor[2], anchor[0])  # its first character
    tree = edit.after_tree if edit.grammar is not None else None
    if tree is None or in_prose(tree, at, at + 1):
        return []  # lines of a docstring or a comment: wording, not code repeated
    candidates = []
    for i in range(len(lines) - len(pattern) + 1):
        start, end = lines[i][0], lines[i + len(pattern) - 1][1]
        if start < edit.new_end and edit.start < end:
            continue  # the hunk itself
        if [line[2] for line in lines[i : i + len(pattern)]] != pattern:
            continue
        site_indent = indent_of(edit.after[start:end])
        if in_prose(tree, start + len(site_indent), start + len(site_indent) + 1):
            continue
        text = _reindent(new, indent, site_indent)
        if text is None:
            continue
        if inserted:
            at = lines[i][1]
            if edit.after[at : at + len(text)] == text:
                continue  # already there
            candidates.append(TextEdit(at, at, text))
        elif edit.after[start:end] != text:
            candidates.append(TextEdit(start, end, text))
        if len(candidates) > REPEAT_MAX_SITES:
            return []
    note = (
        f"{len(pattern)} lines"
        + (" around an insertion" if inserted else "")
        + f": {pattern[0][:40]}"
    )
    confidence = CONFIDENCE["lines"] - (LINES_INSERTED_LESS if inserted else 0.0)
    return [Candidate("lines", e, round(confidence, 3), note) for e in candidates]

"""Next edits for a test parametrized: `parametrize`.

pytest passes each name of `@pytest.mark.parametrize("a, b", [...])` to the test as the argument
of that name, and fails the test when the function takes no such parameter. So a hunk that
adds a parametrize decorator, or a name to one, goes on with the names the function lacks added
to its parameters, in one edit:

- where the file's other parametrized tests put theirs: after the other parameters (fixtures),
  as most tests do (poetry: 212 such tests against 88 the other way; click: 114 against 2), or
  before them where most of the file's tests do so;
- annotated where the function's other parameters are (or, taking none, where it has a return
  annotation), with the type every value of that name has (`bool` for `[False, True]`,
  `str | None`, `list[str]`), and bare where the values do not agree on one;
- on a line of its own where the parameters are one a line, else inline.

Pure functions over context/edit_rules.py's parse; offsets are code points.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from quickdraft.context.edit_rules import (
    CONFIDENCE,
    Candidate,
    LatestEdit,
    TextEdit,
    Tree,
    indent_of,
    parameter_has_default,
    parameter_name,
    parameter_names,
    walk,
)

NAME = re.compile(r"[A-Za-z_]\w*\Z")
SPECIAL_PARAMETERS = frozenset(
    {"list_splat_pattern", "dictionary_splat_pattern", "keyword_separator", "positional_separator"}
)
"""`*args`, `**kwargs`, `*` and `/`: a signature holding one is left alone."""
EMPTY_LIST = "list[]"
"""`[]`'s type until another value says what the list holds."""
LITERAL_TYPES = {
    "true": "bool",
    "false": "bool",
    "integer": "int",
    "float": "float",
    "none": "None",
}


def parametrize_candidates(edit: LatestEdit) -> list[Candidate]:
    """The parameters a parametrize decorator the hunk touched names and its test lacks."""
    if edit.grammar != "python" or "parametrize" not in edit.new:
        return []
    tree = edit.after_tree
    if tree.root is None:
        return []
    tests = _parametrized_tests(tree)
    first = _file_puts_them_first(tests, tree)
    candidates = []
    for function, decorators in tests:
        missing: dict[str, str | None] = {}
        order = [name for _, names, _ in decorators for name in names]
        taken = set(parameter_names(function, tree))
        for decorator, names, types in decorators:
            start, end = tree.span(decorator)
            if end <= edit.start or start >= edit.new_end:
                continue  # not the decorator the hunk touched
            for name, kind in zip(names, types, strict=True):
                if name not in taken:
                    missing.setdefault(name, kind)
        if missing:
            change = _insertion(tree, function, missing, order, first)
            if change is not None:
                note = f"{tree.node_text(function.child_by_field_name('name'))}: +" + ", ".join(
                    missing
                )
                candidates.append(Candidate("parametrize", change, CONFIDENCE["parametrize"], note))
    return candidates


Parametrize = tuple[Any, list[str], list[str | None]]
"""A parametrize call, the names it passes and the type each one's values share."""


def _parametrized_tests(tree: Tree) -> list[tuple[Any, list[Parametrize]]]:
    """Every decorated `def` of the file, with its parametrize decorators, top down."""
    tests = []
    for decorated in walk(tree.root):
        if decorated.type != "decorated_definition":
            continue
        function = decorated.child_by_field_name("definition")
        if function is not None and function.type == "function_definition":
            decorators = _parametrize_decorators(decorated, tree)
            tests.append((function, [(d, *_names_and_types(d, tree)) for d in decorators]))
    return tests


def _parametrize_decorators(decorated: Any, tree: Tree) -> list[Any]:
    """The `@...parametrize(...)` calls among `decorated`'s decorators."""
    found = []
    for decorator in decorated.children:
        if decorator.type != "decorator":
            continue
        call = next((c for c in decorator.named_children if c.type == "call"), None)
        if call is None:
            continue
        function = call.child_by_field_name("function")
        if function is not None and tree.node_text(function).split(".")[-1] == "parametrize":
            found.append(call)
    return found


def _arguments(call: Any, tree: Tree) -> tuple[Any | None, Any | None]:
    """A parametrize call's argnames and argvalues nodes (positional or by keyword)."""
    arguments = call.child_by_field_name("arguments")
    positional, keywords = [], {}
    for node in arguments.named_children if arguments is not None else ():
        if node.type == "keyword_argument":
            name = node.child_by_field_name("name")
            if name is not None:
                keywords[tree.node_text(name)] = node.child_by_field_name("value")
        elif node.type != "comment":
            positional.append(node)
    names = positional[0] if positional else keywords.get("argnames")
    values = positional[1] if len(positional) > 1 else keywords.get("argvalues")
    return names, values


def _names_and_types(call: Any, tree: Tree) -> tuple[list[str], list[str | None]]:
    """The names a parametrize call passes, and the type each one's values share (None where
    they do not agree on one this module can name)."""
    names_node, values_node = _arguments(call, tree)
    while names_node is not None and names_node.type == "parenthesized_expression":
        names_node = next(iter(names_node.named_children), None)  # `("tag")`
    names: list[str] = []
    if names_node is not None and names_node.type == "string":
        names = [n.strip() for n in _string_value(names_node, tree).split(",") if n.strip()]
    elif names_node is not None and names_node.type in ("list", "tuple"):
        names = [_string_value(n, tree) for n in names_node.named_children if n.type == "string"]
        if len(names) != len(names_node.named_children):
            return [], []
    if not names or not all(NAME.match(n) for n in names):
        return [], []
    return names, _value_types(values_node, tree, len(names))


def _string_value(node: Any, tree: Tree) -> str:
    """A plain string literal's text without its quotes ('' for anything fancier)."""
    text = tree.node_text(node)
    match = re.fullmatch(r"([rRuU]?)(['\"])(.*)\2", text, re.S)
    return match.group(3) if match else ""


def _value_types(values: Any, tree: Tree, count: int) -> list[str | None]:
    """Per name, the type all its values have, or None."""
    seen: list[set[str | None]] = [set() for _ in range(count)]
    if values is None or values.type not in ("list", "tuple"):
        return [None] * count
    for case in values.named_children:
        if case.type == "call" and tree.node_text(case).startswith(("pytest.param(", "param(")):
            arguments = case.child_by_field_name("arguments")
            row = [
                n
                for n in (arguments.named_children if arguments is not None else ())
                if n.type != "keyword_argument"
            ]
        elif count == 1:
            row = [case]
        elif case.type in ("tuple", "list"):
            row = list(case.named_children)
        else:
            return [None] * count
        if len(row) != count:
            return [None] * count
        for kinds, value in zip(seen, row, strict=True):
            kinds.add(_literal_type(value, tree))
    return [_one_type(kinds) for kinds in seen]


def _literal_type(node: Any, tree: Tree) -> str | None:
    if node.type in LITERAL_TYPES:
        return LITERAL_TYPES[node.type]
    if node.type == "string":
        return "bytes" if tree.node_text(node).lstrip("rR")[:1] in "bB" else "str"
    if node.type == "list":
        inner = {_literal_type(n, tree) for n in node.named_children}
        if not inner:
            return EMPTY_LIST
        if len(inner) == 1 and None not in inner and "None" not in inner:
            return f"list[{inner.pop()}]"
    return None


def _one_type(kinds: set[str | None]) -> str | None:
    if any(kind and kind.startswith("list[") for kind in kinds):
        kinds = kinds - {EMPTY_LIST}  # `[]` is a list of whatever the others hold
    if not kinds or None in kinds or EMPTY_LIST in kinds:
        return None
    if len(kinds) == 1:
        return next(iter(kinds))
    rest = kinds - {"None"}
    if len(rest) == 1 and "None" in kinds:
        return f"{rest.pop()} | None"
    return None


def _file_puts_them_first(tests: list[tuple[Any, list[Parametrize]]], tree: Tree) -> bool:
    """Whether most of the file's parametrized tests (`_parametrized_tests`) with other
    parameters too take the parametrized ones first (the default, with none to go by: last)."""
    where: Counter[str] = Counter()
    for function, decorators in tests:
        names = {name for _, decorator_names, _ in decorators for name in decorator_names}
        params = [p for p in parameter_names(function, tree) if p not in ("self", "cls")]
        ours = [i for i, p in enumerate(params) if p in names]
        others = [i for i, p in enumerate(params) if p not in names]
        if ours and others:
            if max(ours) < min(others):
                where["first"] += 1
            elif min(ours) > max(others):
                where["last"] += 1
    return where["first"] > where["last"]


def _insertion(
    tree: Tree, function: Any, missing: dict[str, str | None], order: list[str], first: bool
) -> TextEdit | None:
    """The edit that adds `missing` ({name: type or None}) to `function`'s parameters: beside
    the parameter of the decorator above or below theirs (`order`: every parametrized name,
    decorators top down, as the parameters mostly stand), else first or last (`first`)."""
    parameters = function.child_by_field_name("parameters")
    if parameters is None:
        return None
    nodes = [n for n in parameters.named_children if n.type != "comment"]
    if any(n.type in SPECIAL_PARAMETERS for n in nodes):
        return None
    leading = 1 if nodes and tree.node_text(nodes[0]) in ("self", "cls") else 0
    others = nodes[leading:]
    typed = (
        all(n.type in ("typed_parameter", "typed_default_parameter") for n in others)
        if others
        else function.child_by_field_name("return_type") is not None
    )
    added = [f"{name}: {kind}" if typed and kind else name for name, kind in missing.items()]
    anchor, before = _anchor(tree, others, list(missing), order, first)
    text = tree.text
    open_end = tree.span(parameters)[0] + 1
    if anchor is None:
        if nodes:  # after `self` alone
            at = tree.span(nodes[-1])[1]
            return TextEdit(at, at, ", " + ", ".join(added))
        return TextEdit(open_end, open_end, ", ".join(added))
    lines = [text.count("\n", 0, tree.span(n)[0]) for n in nodes]
    one_a_line = "\n" in text[open_end : tree.span(nodes[0])[0]] and len(set(lines)) == len(lines)
    start, end = tree.span(anchor)
    if one_a_line:
        indent = indent_of(text[text.rfind("\n", 0, start) + 1 : start])
        if before:
            return TextEdit(start, start, "".join(f"{a},\n{indent}" for a in added))
        rest = "".join(f"\n{indent}{a}," for a in added)
        after = text[end : tree.span(parameters)[1]]
        if after.lstrip().startswith(","):
            at = end + after.index(",") + 1
            return TextEdit(at, at, rest)
        return TextEdit(end, end, "," + rest[:-1])
    if before:
        return TextEdit(start, start, ", ".join(added) + ", ")
    return TextEdit(end, end, ", " + ", ".join(added))


def _anchor(
    tree: Tree, others: list[Any], missing: list[str], order: list[str], first: bool
) -> tuple[Any | None, bool]:
    """(the parameter to insert beside, whether before it); (None, False) where the function
    takes none but `self`."""
    if not others:
        return None, False
    by_name = {parameter_name(n, tree): n for n in others}
    position = order.index(missing[0]) if missing[0] in order else -1
    if position >= 0:
        for name in reversed(order[:position]):
            if name in by_name and name not in missing:
                return _before_defaults(by_name[name], others)
        for name in order[position + 1 :]:
            if name in by_name and name not in missing:
                return by_name[name], True
    if first:
        return others[0], True
    return _before_defaults(others[-1], others)


def _before_defaults(node: Any, others: list[Any]) -> tuple[Any, bool]:
    """After `node`, unless a parameter with a default comes first: then before that one (a
    parameter without a default cannot follow one with it)."""
    for other in others[: others.index(node) + 1]:
        if parameter_has_default(other):
            return other, True
    return node, False

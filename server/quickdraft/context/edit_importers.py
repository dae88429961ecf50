"""Next edits in the documents that import what the latest edit changed (issue #32: a rename's
uses "in open documents that import it", a signature's calls there).

The latest edit was made in one document (the *source*); the person now asks in another open
document (the *importer*). When the edit renamed a name the source's module defines at its top
level (a `def`, a `class`, a module variable) and the old name is bound there no more, the
importer's `from <source> import old` is renamed, and its `module.old` where it imports the
module. When the edit removed a parameter of a top-level `def` (or added one without a
default), the importer's calls of that function are made to fit it, as `signature` does in the
source itself. An importer whose imports do not resolve to the source's file is left alone.

One edit at a time, as in the source: once the importer's import is renamed, that hunk is the
importer's latest edit and the `import` rule (context/edit_rules.py) goes on with its uses.

Imports resolve by path: `from .mod import x` relative to the importer's folder, and
`from a.b import x` to a source whose path ends in `a/b.py` or `a/b/__init__.py`. Pure
functions over the two texts; offsets are code points into the importer's text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from quickdraft.context.edit_rules import (
    CONFIDENCE,
    IMPORT_TYPES,
    KEYWORD,
    VARIADIC,
    Candidate,
    LatestEdit,
    TextEdit,
    Tree,
    add_argument,
    calls,
    drop_argument,
    earlier_changes,
    enclosing_def,
    parameter_kind,
    parameter_names,
    rebinds,
    references,
    token_change,
    walk,
)
from quickdraft.context.snippets import uri_to_path

MODULE_SUFFIXES = (".py", ".pyi")
RECENT_HUNKS = 8
"""The source's hunks before its latest one that may hold the rename (then its uses there were
renamed, one hunk each)."""


def importer_candidates(edit: LatestEdit, uri: str, text: str) -> list[Candidate]:
    """The candidates in the document `uri` (its `text`) that the latest edit of another
    document (`edit`) calls for, in document order; [] when it calls for none there."""
    if edit.grammar != "python" or uri == edit.uri:
        return []
    source = module_parts(edit.uri)
    importer = module_parts(uri, package=True)
    # Cheap checks first (this runs after each change of a document while another was edited
    # last): the importer names the source's module (or imports relatively), and the edit
    # renamed a name or changed a top-level `def`'s parameters; only then is it parsed.
    if not source or importer is None or (source[-1] not in text and "from ." not in text):
        return []
    renames = _renames(edit)
    signature = None if renames else _signature_change(edit)
    if not renames and signature is None:
        return []
    tree = Tree(text, "python")
    if tree.root is None:
        return []
    imports = list(_imports_of(tree, source, importer))
    if renames:
        found = _renamed(edit, tree, imports, renames)
    else:
        found = _called(edit, tree, imports, signature)
    return sorted(found, key=lambda c: c.edit.start)


def imports_source(source_uri: str, uri: str, text: str) -> bool:
    """Whether the Python file `uri` (its `text`) imports the module of the file `source_uri`
    at its top level (the bench's cases are the pairs that do)."""
    source = module_parts(source_uri)
    importer = module_parts(uri, package=True)
    if not source or importer is None or uri == source_uri:
        return False
    tree = Tree(text, "python")
    return tree.root is not None and next(_imports_of(tree, source, importer), None) is not None


def module_parts(uri: str, *, package: bool = False) -> tuple[str, ...] | None:
    """The path of a Python file's module, as parts (`/ws/pkg/mod.py` -> (..., "pkg", "mod");
    a package's `__init__.py` is the package). `package`: the folder it stands in instead (where
    its relative imports start). None for what is no Python file."""
    path = PurePosixPath(uri_to_path(uri))
    if path.suffix not in MODULE_SUFFIXES:
        return None
    if package:
        return tuple(p for p in path.parent.parts if p != "/")
    parts = [p for p in path.parent.parts if p != "/"]
    if path.stem != "__init__":
        parts.append(path.stem)
    return tuple(parts)


def _resolves(
    module: str, source: tuple[str, ...], importer: tuple[str, ...], name: str | None = None
) -> bool:
    """Whether `from module import name` (or `import module`, name None) in the importer names
    the source's module: relative to the importer's folder, or absolute by its path's end."""
    dots = len(module) - len(module.lstrip("."))
    parts = tuple(p for p in module[dots:].split(".") if p)
    if name is not None:
        parts = (*parts, name)
    if dots:  # `from . import x`: the importer's own package
        base = importer[: len(importer) - (dots - 1)] if dots > 1 else importer
        return dots - 1 <= len(importer) and (*base, *parts) == source
    return 0 < len(parts) <= len(source) and source[-len(parts) :] == parts


def _imports_of(
    tree: Tree, source: tuple[str, ...], importer: tuple[str, ...]
) -> Iterator[tuple[str, Any, str]]:
    """The importer's top-level imports of the source, each as (kind, node, bound name):
    ("name", the imported name's identifier, the name it binds) for `from source import x
    [as y]`; ("module", the import's node, the name its attributes are read through) for
    `import source [as m]` and `from package import source [as m]`."""
    for statement in tree.root.children:
        if statement.type == "import_from_statement":
            module_node = statement.child_by_field_name("module_name")
            if module_node is None:
                continue
            module = tree.node_text(module_node)
            for child in statement.children_by_field_name("name"):
                name_node, alias = _name_and_alias(child)
                if name_node is None or name_node.type != "dotted_name":
                    continue
                imported = tree.node_text(name_node)
                bound = tree.node_text(alias) if alias is not None else imported
                if _resolves(module, source, importer):
                    yield "name", name_node, bound
                elif "." not in imported and _resolves(module, source, importer, imported):
                    yield "module", child, bound
        elif statement.type == "import_statement":
            for child in statement.children_by_field_name("name"):
                name_node, alias = _name_and_alias(child)
                if name_node is None or not _resolves(tree.node_text(name_node), source, ()):
                    continue
                yield "module", child, tree.node_text(alias if alias is not None else name_node)


def _name_and_alias(child: Any) -> tuple[Any, Any]:
    """(the imported name's node, its alias's node or None) of one name of an import."""
    if child.type == "aliased_import":
        return child.child_by_field_name("name"), child.child_by_field_name("alias")
    return child, None


def _top_level_names(tree: Tree) -> set[str]:
    """The names a module binds at its top level: its defs, classes, variables and imports."""
    names: set[str] = set()
    if tree.root is None:
        return names
    for statement in tree.root.children:
        node = statement
        if node.type == "decorated_definition":
            node = node.child_by_field_name("definition") or node
        if node.type in ("function_definition", "class_definition"):
            named = node.child_by_field_name("name")
            if named is not None:
                names.add(tree.node_text(named))
        elif node.type == "expression_statement":
            for inner in node.named_children:
                if inner.type == "assignment":
                    left = inner.child_by_field_name("left")
                    if left is not None and left.type == "identifier":
                        names.add(tree.node_text(left))
        elif node.type in ("import_statement", "import_from_statement"):
            for child in node.children_by_field_name("name"):
                name_node, alias = _name_and_alias(child)
                target = alias if alias is not None else name_node
                if target is not None:
                    names.add(tree.node_text(target).split(".")[0])
    return names


def _renames(edit: LatestEdit) -> dict[str, str]:
    """old -> new for each name the source's recent hunks replaced (the latest and the
    RECENT_HUNKS before it: the uses renamed after the `def` are hunks too) where the new name
    is one the module binds at its top level and the old one is bound there no more."""
    change = token_change(edit)
    pairs = [*(change.replaced if change is not None else ())]
    for _, earlier in earlier_changes(edit, RECENT_HUNKS):
        pairs.extend(earlier.replaced)
    if not pairs:
        return {}
    after = _top_level_names(edit.after_tree)
    return {old: new for old, new in pairs if new in after and old not in after}


def _renamed(
    edit: LatestEdit, tree: Tree, imports: list[tuple[str, Any, str]], renames: dict[str, str]
) -> list[Candidate]:
    """`rename`: the importer's import of a renamed name, and its `module.old`."""
    found = []
    for kind, node, bound in imports:
        names = [node] if kind == "name" else _attributes(tree, bound)
        for name in names:
            old = tree.node_text(name)
            if old in renames:
                found.append(_candidate("rename", tree.span(name), renames[old], old, edit))
    return found


@dataclass(frozen=True)
class SignatureChange:
    """A top-level `def` of the source that lost one parameter or gained one."""

    name: str
    new_def: Any
    old_params: list[str]
    new_params: list[str]
    removed: str | None
    added: str | None
    keyword_only: bool = False
    """The removed parameter could only be passed by keyword."""


def _signature_change(edit: LatestEdit) -> SignatureChange | None:
    new_def = enclosing_def(edit.after_tree, edit.start, edit.new_end)
    old_def = enclosing_def(edit.before_tree, edit.start, edit.old_end)
    if new_def is None or old_def is None:
        return None
    holder = new_def.parent
    if holder is not None and holder.type == "decorated_definition":
        holder = holder.parent
    if holder != edit.after_tree.root:
        return None  # a method or a nested function: its calls elsewhere cannot be told
    name_node = new_def.child_by_field_name("name")
    old_name_node = old_def.child_by_field_name("name")
    if name_node is None or old_name_node is None:
        return None
    name = edit.after_tree.node_text(name_node)
    if edit.before_tree.node_text(old_name_node) != name:
        return None
    old_params = parameter_names(old_def, edit.before_tree)
    new_params = parameter_names(new_def, edit.after_tree)
    removed = [p for p in old_params if p not in new_params]
    added = [p for p in new_params if p not in old_params]
    if len(removed) + len(added) != 1:
        return None
    kind = parameter_kind(old_def, removed[0], edit.before_tree) if removed else None
    if kind == VARIADIC:
        return None  # which arguments `*args` took cannot be told
    return SignatureChange(
        name,
        new_def,
        old_params,
        new_params,
        removed[0] if removed else None,
        added[0] if added else None,
        kind == KEYWORD,
    )


def _called(
    edit: LatestEdit, tree: Tree, imports: list[tuple[str, Any, str]], change: SignatureChange
) -> list[Candidate]:
    """`signature`: the importer's calls of the function made to fit it, as in the source."""
    found = []
    for call, arguments in _calls_of(tree, change.name, imports):
        if change.removed is not None:
            edited = drop_argument(
                tree, arguments, change.old_params, change.removed, False, change.keyword_only
            )
            what = "-" + change.removed
        else:
            edited = add_argument(
                tree, call, arguments, change.new_def, change.new_params, change.added, False
            )
            what = f"+{change.added}"
        if edited is not None:
            start, end, text = edited
            note = f"{change.name}: {what} ({_path(edit.uri)})"
            found.append(
                Candidate("signature", TextEdit(start, end, text), CONFIDENCE["signature"], note)
            )
    return found


def _calls_of(
    tree: Tree, name: str, imports: list[tuple[str, Any, str]]
) -> Iterator[tuple[Any, Any]]:
    """The importer's calls of the source's `name`: by the name it is imported as (never where a
    function makes that name its own), or through the module (`module.name(...)`)."""
    callee_names = {
        bound for kind, node, bound in imports if kind == "name" and tree.node_text(node) == name
    }
    modules = {bound for kind, _, bound in imports if kind == "module"}
    called = set()
    for callee in callee_names:
        called.update(references(tree.root, callee, tree, rebinds(callee, tree)))
    for module in modules:
        called.update(tree.span(a) for a in _attributes(tree, module) if tree.node_text(a) == name)
    if not called:
        return
    for node, function, arguments in calls(tree):
        target = (
            function.child_by_field_name("attribute") if function.type == "attribute" else function
        )
        if target is not None and tree.span(target) in called:
            yield node, arguments


def _attributes(tree: Tree, module: str) -> list[Any]:
    """The attribute identifiers read through `module` (`module.x` -> `x`), outside imports."""
    found = []
    for node in walk(tree.root, skip=lambda n: n.type in IMPORT_TYPES):
        if node.type == "attribute":
            owner = node.child_by_field_name("object")
            attribute = node.child_by_field_name("attribute")
            if owner is not None and attribute is not None and tree.node_text(owner) == module:
                found.append(attribute)
    return found


def _candidate(rule: str, span: tuple[int, int], new: str, old: str, edit: LatestEdit) -> Candidate:
    return Candidate(
        rule,
        TextEdit(span[0], span[1], new),
        CONFIDENCE[rule],
        f"{old} -> {new} ({_path(edit.uri)})",
    )


def _path(uri: str) -> str:
    return PurePosixPath(uri_to_path(uri)).name

"""Next edits from the edit itself: candidates derived from the latest hunk, no decoding.

A general small model asked to rewrite a window around the cursor rewrites it unchanged or
makes it worse (issue #32: 6 proposals on 40 mined cases, 0 helpful). What works without a
model trained for next edits is propagating the change the person just made (Blue-Pencil,
IntelliCode suggestions, in-place refactorings). Each rule reads the document before and after
the latest hunk and proposes edits elsewhere, tagged with its name:

- `rename`: one identifier replaced by another -> its remaining occurrences in the scope that
  binds it (tree-sitter: the function whose parameter or assignment it is, the class for
  `self.x` and for a method's own name, else the module), never an attribute of something
  else, a keyword argument's name, or a nested function that binds the name again. A hunk that
  replaced several names one for one is each of those renames.
- `import`: the same, for a name an import binds (`from m import a` -> `b`, `import m as a`);
  and an import added for a name another top-level import binds too -> that other binding
  removed (the name moved to where it is now imported from).
- `signature`: a parameter removed from a `def` -> the argument dropped at each call; one added
  without a default -> a same-named variable passed where the call's function has one, else an
  argument the model writes there (`fill_at`: the pipeline asks it, `edit_vetoes.vet`).
- `repeat`: the token-level change of the hunk (identifiers and literals it keeps, builtins
  aside, become holes), matched at the other places its old tokens still stand and replayed
  there; a line made several is replayed with each site's indentation.

This module also holds what every rule reads (the latest edit, its tokens, tree-sitter over
code points); the rules of context/edit_words.py and context/edit_statements.py build on it,
and context/edit_proposals.py asks them all. Candidates come nearest first (below the edit,
then above it); each is one edit, so an editor shows one, applies it, asks again and gets the
next. `vet` applies the vetoes (context/edit_vetoes.py) and keeps the first survivor at or
above `FLOOR`. Everything is pure: texts in, candidates out; offsets are code points.
"""

from __future__ import annotations

import bisect
import builtins
import difflib
import functools
import keyword
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from quickdraft.context import syntax
from quickdraft.context.edit_history import Hunk

FLOOR = 0.45
"""Candidates below this confidence are never shown (the `floor` veto). Frozen from the floor
sweep of `quickdraft bench --edits --edits-rules` on 371 cases of openai-agents-python,
smolagents, pytest and fastapi (commits since 2025, 96 per history, seed 0): at 0.45, 24
proposals, 71 % precision, 2 % harmful; 0.5 gives 17, 82 %, 1 %, but 3 fewer helpful ones; a
lower floor adds nothing. The lowest floor with precision at least 60 % and harm at most 5 %."""
CONFIDENCE = {
    "rename": 0.9,
    "import": 0.85,
    "signature": 0.8,
    "parametrize": 0.8,
    "repeat": 0.6,
    "word": 0.6,
    "text": 0.6,
    "hoist": 0.6,
    "inline": 0.6,
    "lines": 0.4,
}
"""Each rule's confidence for one example; `repeat` gains REPEAT_AGREEMENT when an earlier hunk
made the same change, and loses REPEAT_SHORT when its pattern is a single token. `lines` stands
under the floor: 8 helpful of 18 proposals, 9 harmful, on the tuned and held-out histories
together (it is kept for the bench's floor sweep, which still measures it)."""
REPEAT_AGREEMENT = 0.2
REPEAT_SHORT = 0.15
REPEAT_FAR = 0.15
"""...and loses this at a site outside the top-level definition (function, class) the edit is in:
one example of a change is a weaker guide in code the person is not working on."""
REPEAT_ANCHOR_CHARS = 6
REPEAT_MAX_SITES = 24
"""A repeat pattern found at more places than this is too common to be the change repeated."""
REPEAT_MAX_TOKENS = 40
"""The longest changed run of tokens replayed."""
REPEAT_CONTEXT = 3
"""Tokens of unchanged context the pattern may take on each side to have an anchor."""
HOLE_SPAN = 12
"""The most tokens one hole matches at another site."""
MAX_CANDIDATES = 64

BUILTINS = frozenset(dir(builtins))
"""Names a rename never touches: one replaced by a builtin (`Exception` -> `BaseException`) is
a switch to another thing, not a new name for the same one."""
SCOPE_TYPES = frozenset({"function_definition", "lambda", "class_definition", "module"})
FUNCTION_TYPES = frozenset({"function_definition", "lambda"})
IMPORT_TYPES = frozenset({"import_statement", "import_from_statement", "future_import_statement"})


@dataclass(frozen=True)
class TextEdit:
    """Replace `start`..`end` (code points) of the document the candidate is for."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Candidate:
    rule: str
    edit: TextEdit
    confidence: float
    note: str = ""
    """What the rule saw (`width -> w`), for the log."""
    fill_at: int | None = None
    """Where in `edit.text` a model writes what the rule cannot know (an added parameter's
    argument: `argument_hole`); None: the text is whole. Such a candidate is shown only once
    filled (`edit_vetoes.vet`'s filler)."""
    scored: bool = True
    """Whether the likelihood veto asks a model about it. Not for the argument of a parameter
    added without a default: the call is broken without one, and the inserted tokens cost
    the line nats however right they are (on the calls that commits since 2025 in five
    histories gave such an argument, the draft vetoed 22 same-named variables, 21 of them
    what the commit passed; the README's next-edit section has the table)."""


@dataclass(frozen=True)
class LatestEdit:
    """The latest hunk as two texts: `before` (the document without it) and `after` (as it is);
    the hunk's lines span `start`..`old_end` in `before` and `start`..`new_end` in `after`."""

    uri: str
    before: str
    after: str
    start: int
    old_end: int
    new_end: int
    old: str
    new: str
    language_id: str | None = None
    earlier: tuple[Hunk, ...] = ()

    @property
    def grammar(self) -> str | None:
        language = syntax.find_language(self.language_id, self.uri)
        return language.grammar if language is not None else None

    @functools.cached_property
    def after_tree(self) -> Tree:
        """The document as it is, parsed once for every rule that reads it."""
        return Tree(self.after, self.grammar)

    @functools.cached_property
    def before_tree(self) -> Tree:
        """The document without the hunk, parsed once."""
        return Tree(self.before, self.grammar)


def latest_edit(
    uri: str, text: str, hunks: Sequence[Hunk], language_id: str | None = None
) -> LatestEdit | None:
    """The latest of `hunks` (this document's, oldest first) against `text`, or None when there
    is none or `text` no longer holds its new lines where it says."""
    if not hunks:
        return None
    hunk = hunks[-1]
    end = hunk.start + len(hunk.new)
    if text[hunk.start : end] != hunk.new or hunk.old == hunk.new:
        return None
    before = text[: hunk.start] + hunk.old + text[end:]
    return LatestEdit(
        uri,
        before,
        text,
        hunk.start,
        hunk.start + len(hunk.old),
        end,
        hunk.old,
        hunk.new,
        language_id,
        tuple(hunks[:-1]),
    )


# --- tokens -----------------------------------------------------------------------------------

_STRING = (
    r"[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|\"(?:\\.|[^\"\\\n])*\"|"
    r"'(?:\\.|[^'\\\n])*')"
)
_TOKEN_PY = re.compile(rf"#[^\n]*|{_STRING}|[A-Za-z_]\w*|\d[\w.]*|\S")
_TOKEN_C = re.compile(
    r"//[^\n]*|/\*[\s\S]*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|`[^`]*`|"
    r"[A-Za-z_$][\w$]*|\d[\w.]*|\S"
)
_IDENT = re.compile(r"[A-Za-z_$][\w$]*\Z")


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int

    @property
    def kind(self) -> str:
        first = self.text[0]
        if first in "#" or self.text.startswith(("//", "/*")):
            return "comment"
        if _IDENT.match(self.text):
            return "keyword" if keyword.iskeyword(self.text) else "name"
        if first.isdigit():
            return "number"
        if first in "\"'`" or (self.text[-1] in "\"'" and len(self.text) > 1):
            return "string"
        return "punct"

    @property
    def is_value(self) -> bool:
        """A name or a literal: what may differ between the sites of one repeated change."""
        return self.kind in ("name", "number", "string")


def tokenize(text: str, language_id: str | None = None, base: int = 0) -> list[Token]:
    pattern = _TOKEN_PY if language_id in (None, "python") else _TOKEN_C
    return [Token(m.group(), base + m.start(), base + m.end()) for m in pattern.finditer(text)]


# --- tree-sitter over code points --------------------------------------------------------------


class Tree:
    """A parse of `text` with byte offsets turned into code points."""

    def __init__(self, text: str, grammar: str | None):
        self.text = text
        tree = syntax.parse(text, grammar)
        self.root = tree.root_node if tree is not None else None
        self._ascii = text.isascii()
        self._bytes: list[int] = []
        if not self._ascii:
            total = 0
            for ch in text:
                self._bytes.append(total)
                total += len(ch.encode("utf-8", "surrogatepass"))
            self._bytes.append(total)

    def char(self, byte: int) -> int:
        if self._ascii:
            return byte
        return bisect.bisect_left(self._bytes, byte)

    def span(self, node: Any) -> tuple[int, int]:
        return self.char(node.start_byte), self.char(node.end_byte)

    def node_text(self, node: Any) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def at(self, start: int, end: int) -> Any | None:
        if self.root is None:
            return None
        b0 = syntax.byte_offset(self.text, start)
        b1 = syntax.byte_offset(self.text, end)
        return self.root.descendant_for_byte_range(b0, b1)


def ancestors(node: Any) -> Iterator[Any]:
    while node is not None:
        yield node
        node = node.parent


def walk(node: Any, skip: Any = None) -> Iterator[Any]:
    """`node` and its descendants, not entering nodes for which `skip(node)` is true."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current is not node and skip is not None and skip(current):
            continue
        yield current
        stack.extend(reversed(current.children))


def parameter_names(function: Any, tree: Tree) -> list[str]:
    """The names a `def`'s (or lambda's) parameters bind, in order (`*args` as `args`)."""
    parameters = function.child_by_field_name("parameters")
    if parameters is None:
        return []
    names = []
    for child in parameters.named_children:
        names.append(parameter_name(child, tree))
    return [name for name in names if name]


def parameter_name(node: Any, tree: Tree) -> str | None:
    """The name a parameter node binds (`a`, `a: int`, `a=1`, `*args`), or None."""
    if node.type == "identifier":
        return tree.node_text(node)
    named = node.child_by_field_name("name")
    if named is not None and named.type == "identifier":
        return tree.node_text(named)
    for child in node.named_children:
        if child.type == "identifier":
            return tree.node_text(child)
    return None


VARIADIC = "variadic"
KEYWORD = "keyword"
POSITIONAL = "positional"


def parameter_kind(function: Any, name: str, tree: Tree) -> str | None:
    """How a call passes the parameter `name` of a `def`: POSITIONAL, KEYWORD (after a bare
    `*` or `*args`), VARIADIC (`*args`, `**kwargs` themselves); None: no such parameter."""
    parameters = function.child_by_field_name("parameters")
    keyword_only = False
    for child in parameters.named_children if parameters is not None else ():
        splat = child.type in ("list_splat_pattern", "dictionary_splat_pattern") or any(
            c.type in ("list_splat_pattern", "dictionary_splat_pattern")
            for c in child.named_children
        )
        if parameter_name(child, tree) == name:
            return VARIADIC if splat else KEYWORD if keyword_only else POSITIONAL
        if splat or child.type == "keyword_separator":
            keyword_only = True
    return None


def parameter_has_default(node: Any) -> bool:
    return node.type in ("default_parameter", "typed_default_parameter")


def binds(scope: Any, name: str, tree: Tree) -> bool:
    """Whether the function `scope` makes `name` local (a parameter, or assigned in its own
    body, nested functions aside)."""
    if name in parameter_names(scope, tree):
        return True
    body = scope.child_by_field_name("body")
    if body is None:
        return False
    for node in walk(body, skip=lambda n: n.type in SCOPE_TYPES):
        if node.type in ("assignment", "augmented_assignment", "for_statement", "with_item"):
            target = node.child_by_field_name("left") or node.child_by_field_name("value")
            if target is None:
                continue
            for inner in walk(target):
                if inner.type == "identifier" and tree.node_text(inner) == name:
                    return True
    return False


def _is_reference(node: Any) -> bool:
    """An identifier that names a variable (not `x.name`, not `f(name=...)`)."""
    parent = node.parent
    if parent is None:
        return True
    if parent.type == "attribute" and parent.child_by_field_name("attribute") == node:
        return False
    return not (parent.type == "keyword_argument" and parent.child_by_field_name("name") == node)


# --- rename and import ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenChange:
    """The hunk's change as tokens: old[i1:i2] became new[j1:j2] (the span from the first to the
    last differing token)."""

    old: list[Token]
    new: list[Token]
    i1: int
    i2: int
    j1: int
    j2: int
    replaced: tuple[tuple[str, str], ...]
    """(old, new) of every one-token-for-one-token replacement; empty when there are others."""
    same: tuple[int, int, int, int] | None = None
    """(i1, i2, j1, j2) of the last change when every change is the same one (hunks coalesce
    neighbouring edits: the same change made twice is one hunk)."""


def token_change(edit: LatestEdit) -> TokenChange | None:
    old = tokenize(edit.old, edit.language_id, edit.start)
    new = tokenize(edit.new, edit.language_id, edit.start)
    matcher = difflib.SequenceMatcher(
        None, [t.text for t in old], [t.text for t in new], autojunk=False
    )
    codes = [c for c in matcher.get_opcodes() if c[0] != "equal"]
    if not codes:
        return None  # only whitespace changed
    pairs = []
    for tag, a1, a2, b1, b2 in codes:
        if tag == "replace" and a2 - a1 == 1 and b2 - b1 == 1:
            pairs.append((old[a1].text, new[b1].text))
        else:
            pairs = []
            break
    shapes = {
        (tuple(t.text for t in old[a1:a2]), tuple(t.text for t in new[b1:b2]))
        for _, a1, a2, b1, b2 in codes
    }
    return TokenChange(
        old,
        new,
        codes[0][1],
        codes[-1][2],
        codes[0][3],
        codes[-1][4],
        tuple(dict.fromkeys(pairs)) if pairs else (),
        codes[-1][1:] if len(codes) > 1 and len(shapes) == 1 else None,
    )


def rename_candidates(edit: LatestEdit, change: TokenChange) -> list[Candidate] | None:
    """`rename`/`import` candidates when the hunk replaced one name by another; None when it is
    no rename (the `repeat` rule may take it); [] when it is one but nothing is left to do.

    A hunk that replaced several names one for one (a test renamed with the helper it imports,
    its docstring too) is each of its renames: their candidates together, or None when none
    of them leaves anything to do (another rule may take the hunk)."""
    if len(change.replaced) == 1:
        return _rename_candidates(edit, change, *change.replaced[0])
    found: list[Candidate] = []
    for old_name, new_name in change.replaced:
        found.extend(_rename_candidates(edit, change, old_name, new_name) or ())
    return found or None


def _rename_candidates(
    edit: LatestEdit, change: TokenChange, old_name: str, new_name: str
) -> list[Candidate] | None:
    if not (_IDENT.match(old_name) and _IDENT.match(new_name)):
        return None
    if keyword.iskeyword(old_name) or keyword.iskeyword(new_name):
        return None
    if old_name in BUILTINS or new_name in BUILTINS:
        return []
    grammar = edit.grammar
    if grammar != "python":
        return None
    tree = edit.after_tree
    if tree.root is None:
        return None
    site = next(t for t in change.new[change.j1 : change.j2] if t.text == new_name)
    node = tree.at(site.start, site.end)
    if node is None or node.type != "identifier":
        return None
    rule = "rename"
    parent = node.parent
    if any(a.type in IMPORT_TYPES for a in ancestors(node)):
        rule = "import"
        module = next(a for a in ancestors(node) if a.type in IMPORT_TYPES)
        module_name = module.child_by_field_name("module_name")
        if module_name is not None and module_name.start_byte <= node.start_byte < (
            module_name.end_byte
        ):
            return None  # where it is imported from changed, not what it is called
        if parent is not None and parent.type == "dotted_name":
            names = [c for c in parent.named_children if c.type == "identifier"]
            if names and names[0] != node:
                return None  # `import a.b` -> `import a.c`: uses spell `a.b`, not `b`
        scope, skip = tree.root, rebinds(old_name, tree)
        refs = references(scope, old_name, tree, skip)
    elif (
        parent is not None
        and parent.type == "attribute"
        and parent.child_by_field_name("attribute") == node
    ):
        owner = parent.child_by_field_name("object")
        if owner is None or tree.node_text(owner) not in ("self", "cls"):
            return None  # `obj.x` -> `obj.y`: no scope to resolve; `repeat` may replay it
        scope = next((a for a in ancestors(node) if a.type == "class_definition"), None)
        if scope is None:
            return None
        refs = _self_attributes(scope, old_name, tree)
    elif (owner_class := _method_of(node)) is not None:
        # A method renamed: its calls through `self.`/`cls.` in the class (other objects'
        # calls cannot be told from another class's method of that name).
        refs = _self_attributes(owner_class, old_name, tree)
    else:
        scope = _binding_scope(node, old_name, new_name, tree)
        skip = rebinds(old_name, tree)
        refs = references(scope, old_name, tree, skip)
        taken = [
            start
            for start, _ in references(scope, new_name, tree, rebinds(new_name, tree))
            if not edit.start <= start < edit.new_end
        ]
        if taken and not _renamed_before(edit, old_name, new_name):
            return []  # the new name was in use already: a switch to it, not a rename
    note = f"{old_name} -> {new_name}"
    return [
        Candidate(rule, TextEdit(start, end, new_name), CONFIDENCE[rule], note)
        for start, end in refs
        if not (edit.start <= start < edit.new_end)
    ]


def _method_of(node: Any) -> Any | None:
    """The class whose method `node` names (the `def`'s own name, directly in a class body)."""
    function = node.parent
    if function is None or function.type != "function_definition":
        return None
    if function.child_by_field_name("name") != node:
        return None
    body = function.parent
    if body is not None and body.type == "decorated_definition":
        body = body.parent
    owner = body.parent if body is not None and body.type == "block" else None
    return owner if owner is not None and owner.type == "class_definition" else None


def earlier_changes(edit: LatestEdit, count: int) -> Iterator[tuple[LatestEdit, TokenChange]]:
    """The last `count` earlier hunks of the document, each as an edit of its own lines (its
    old lines the text before it) and its token change."""
    for hunk in edit.earlier[-count:]:
        old, new = hunk.old, hunk.new
        earlier = LatestEdit(edit.uri, old, new, 0, len(old), len(new), old, new, edit.language_id)
        change = token_change(earlier)
        if change is not None:
            yield earlier, change


def _renamed_before(edit: LatestEdit, old_name: str, new_name: str) -> bool:
    """Whether an earlier hunk of this document made the same rename (the new name's other
    uses are then the person's own, made one at a time)."""
    return any((old_name, new_name) in c.replaced for _, c in earlier_changes(edit, 8))


def _binding_scope(node: Any, old_name: str, new_name: str, tree: Tree) -> Any:
    """The function (or the module) whose `old_name` the renamed identifier at `node` was."""
    for ancestor in ancestors(node.parent):
        if ancestor.type == "function_definition" and ancestor.child_by_field_name("name") == node:
            continue  # a def's own name is bound where the def stands
        if ancestor.type in FUNCTION_TYPES:
            params = ancestor.child_by_field_name("parameters")
            in_params = params is not None and (
                params.start_byte <= node.start_byte < params.end_byte
            )
            if in_params or binds(ancestor, old_name, tree) or binds(ancestor, new_name, tree):
                return ancestor
    return tree.root


def rebinds(name: str, tree: Tree) -> Any:
    """A skip predicate: functions (nested in the scope) that make `name` local again."""

    def skip(node: Any) -> bool:
        return node.type in FUNCTION_TYPES and binds(node, name, tree)

    return skip


def references(scope: Any, name: str, tree: Tree, skip: Any) -> list[tuple[int, int]]:
    found = []
    for node in walk(scope, skip=skip):
        if node.type == "identifier" and _is_reference(node) and tree.node_text(node) == name:
            found.append(tree.span(node))
    return found


def _self_attributes(scope: Any, name: str, tree: Tree) -> list[tuple[int, int]]:
    found = []
    for node in walk(scope):
        if node.type == "attribute":
            owner = node.child_by_field_name("object")
            attribute = node.child_by_field_name("attribute")
            if (
                owner is not None
                and attribute is not None
                and tree.node_text(owner) in ("self", "cls")
                and tree.node_text(attribute) == name
            ):
                found.append(tree.span(attribute))
        elif node.type == "function_definition" and node.parent is not None:
            named = node.child_by_field_name("name")
            if named is not None and tree.node_text(named) == name:
                found.append(tree.span(named))
    return found


# --- signature -------------------------------------------------------------------------------


def enclosing_def(tree: Tree, start: int, end: int) -> Any | None:
    """The `def` whose parameter list the span start..end (a hunk's, in `tree`'s text) touches.
    A hunk holds whole lines: its indentation is left out, or a method's header line would be
    covered by the class body rather than by its `def`."""
    text = tree.text[start:end]
    start += len(text) - len(text.lstrip())
    node = tree.at(start, max(start, end - 1))
    for ancestor in ancestors(node):
        if ancestor.type == "function_definition":
            params = ancestor.child_by_field_name("parameters")
            if params is None:
                return None
            p0, p1 = tree.span(params)
            return ancestor if p0 < end and start < p1 else None
    return None


def signature_candidates(edit: LatestEdit) -> list[Candidate]:
    """The calls of a `def` whose parameter list the hunk changed, made to fit it, in this
    document (the documents that import it: context/edit_importers.py)."""
    if edit.grammar != "python":
        return []
    after = edit.after_tree
    if after.root is None:
        return []
    new_def = enclosing_def(after, edit.start, edit.new_end)
    if new_def is None:
        return []
    before = edit.before_tree
    old_def = enclosing_def(before, edit.start, edit.old_end)
    if old_def is None:
        return []
    name_node = new_def.child_by_field_name("name")
    old_name_node = old_def.child_by_field_name("name")
    if name_node is None or old_name_node is None:
        return []
    name = after.node_text(name_node)
    if before.node_text(old_name_node) != name:
        return []
    old_params, new_params = parameter_names(old_def, before), parameter_names(new_def, after)
    method = bool(old_params) and old_params[0] in ("self", "cls")
    removed = [p for p in old_params if p not in new_params]
    added = [p for p in new_params if p not in old_params]
    candidates: list[Candidate] = []
    for call, arguments in _calls(after, name, method):
        if edit.start <= after.span(call)[0] < edit.new_end:
            continue
        change, fill_at = None, None
        if len(removed) == 1 and not added:
            kind = parameter_kind(old_def, removed[0], before)
            if kind != VARIADIC:
                change = drop_argument(
                    after, arguments, old_params, removed[0], method, kind == KEYWORD
                )
        elif len(added) == 1 and not removed:
            change = add_argument(after, call, arguments, new_def, new_params, added[0], method)
            if change is None:
                hole = argument_hole(after, arguments, new_def, new_params, added[0], method)
                if hole is not None:
                    at, text, fill_at = hole
                    change = at, at, text
        if change is not None:
            start, end, text = change
            what = f"{name}: -{removed[0]}" if removed else f"{name}: +{added[0]}"
            if fill_at is not None:
                what += " (the model writes it)"
            candidates.append(
                Candidate(
                    "signature",
                    TextEdit(start, end, text),
                    CONFIDENCE["signature"],
                    what,
                    fill_at=fill_at,
                    scored=not added,
                )
            )
    return candidates


def calls(tree: Tree) -> Iterator[tuple[Any, Any, Any]]:
    """(call, its function, its argument list) of every call with an argument list."""
    for node in walk(tree.root):
        if node.type != "call":
            continue
        function = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if function is not None and arguments is not None and arguments.type == "argument_list":
            yield node, function, arguments


def _calls(tree: Tree, name: str, method: bool) -> Iterator[tuple[Any, Any]]:
    for node, function, arguments in calls(tree):
        if function.type == "identifier" and not method:
            if tree.node_text(function) == name:
                yield node, arguments
        elif function.type == "attribute" and method:
            attribute = function.child_by_field_name("attribute")
            if attribute is not None and tree.node_text(attribute) == name:
                yield node, arguments


def _arguments(arguments: Any) -> list[Any]:
    return [c for c in arguments.named_children if c.type != "comment"]


def drop_argument(
    tree: Tree,
    arguments: Any,
    old_params: list[str],
    removed: str,
    method: bool,
    keyword_only: bool = False,
) -> tuple[int, int, str] | None:
    """The argument a call passed for the parameter `removed`, taken out with its comma: by
    keyword, else (not for a keyword-only parameter) by position."""
    args = _arguments(arguments)
    target = None
    for arg in args:
        if arg.type == "keyword_argument":
            named = arg.child_by_field_name("name")
            if named is not None and tree.node_text(named) == removed:
                target = arg
    if target is None and keyword_only:
        return None
    if target is None:
        index = old_params.index(removed) - (1 if method else 0)
        positional = []
        for arg in args:
            if arg.type in ("list_splat", "dictionary_splat", "parenthesized_list_splat"):
                return None  # where the argument is cannot be told
            if arg.type == "keyword_argument":
                break
            positional.append(arg)
        if index < 0 or index >= len(positional):
            return None
        target = positional[index]
    position = args.index(target)
    start, end = tree.span(target)
    if position + 1 < len(args):
        end = tree.span(args[position + 1])[0]
    elif position > 0:
        start = tree.span(args[position - 1])[1]
    return start, end, ""


def add_argument(
    tree: Tree,
    call: Any,
    arguments: Any,
    new_def: Any,
    new_params: list[str],
    added: str,
    method: bool,
) -> tuple[int, int, str] | None:
    """A same-named variable passed for a parameter added without a default, where the call's
    function has one (otherwise the text is not known here: `argument_hole`)."""
    scope = next((a for a in ancestors(call) if a.type in FUNCTION_TYPES), None)
    if scope is None or not binds(scope, added, tree):
        return None
    place = _argument_place(tree, arguments, new_def, new_params, added, method)
    if place is None:
        return None
    at, before, after = place
    return at, at, before + added + after


def argument_hole(
    tree: Tree,
    arguments: Any,
    new_def: Any,
    new_params: list[str],
    added: str,
    method: bool,
) -> tuple[int, str, int] | None:
    """Where a call takes the argument of a parameter added without a default, when no
    same-named variable can be passed (`add_argument`): (offset, the text around it, where
    in that text the argument goes), for a model to write it."""
    place = _argument_place(tree, arguments, new_def, new_params, added, method)
    if place is None:
        return None
    at, before, after = place
    return at, before + after, len(before)


def _argument_place(
    tree: Tree, arguments: Any, new_def: Any, new_params: list[str], added: str, method: bool
) -> tuple[int, str, str] | None:
    """(offset, text before, text after) of the argument for `added` at a call: a keyword-only
    parameter's `added=` after the call's arguments, a positional one's at its place. None
    where the parameter has a default (the call need not change), is `*args` or `**kwargs`,
    the call passes `**` (a keyword may be in it), or, for a positional one, passes keyword
    arguments (where the new one goes cannot be told) or too few positional ones."""
    parameters = new_def.child_by_field_name("parameters")
    for child in parameters.named_children if parameters is not None else ():
        if parameter_name(child, tree) == added and parameter_has_default(child):
            return None
    kind = parameter_kind(new_def, added, tree)
    args = _arguments(arguments)
    if kind == VARIADIC or any(c.type == "dictionary_splat" for c in args):
        return None
    if kind == KEYWORD:
        if args:
            return tree.span(args[-1])[1], f", {added}=", ""
        return tree.span(arguments)[0] + 1, f"{added}=", ""
    if any(c.type == "keyword_argument" for c in args):
        return None
    index = new_params.index(added) - (1 if method else 0)
    if index < 0 or index > len(args):
        return None
    if index < len(args):
        return tree.span(args[index])[0], "", ", "
    if args:
        return tree.span(args[-1])[1], ", ", ""
    return tree.span(arguments)[0] + 1, "", ""


ARGUMENT_MAX_CHARS = 80
"""The longest argument a model may write for a call (`argument_written`)."""
_OPENING, _CLOSING = "([{", ")]}"


def argument_written(text: str) -> tuple[str, bool]:
    """The argument at the start of `text` (what a model wrote after `f(a, `): up to the first
    `,`, newline or unmatched closing bracket outside brackets and strings, and whether it
    ended there (False: it may go on). An argument longer than ARGUMENT_MAX_CHARS counts as
    ended, to be refused by the caller."""
    depth, quote, escaped = 0, "", False
    for i, char in enumerate(text):
        if i >= ARGUMENT_MAX_CHARS:
            return text[:i], True
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            elif char == "\n":
                return text[:i], True
            continue
        if char in "'\"":
            quote = char
        elif char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            if depth == 0:
                return text[:i], True
            depth -= 1
        elif char == "\n" or (char == "," and depth == 0):
            return text[:i], True
    return text, False


# --- repeat ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """A changed run of tokens: `old` (texts; None marks a hole) becomes `new` (texts, a hole's
    name standing for what it matched)."""

    old: tuple[str | None, ...]
    holes: tuple[str, ...]
    """The text each hole had at the edit, in order of `old`'s holes."""
    new_text: str
    """The replacement, with `{0}`, `{1}`... where the holes' texts go, and `{indent}` after each
    line break it holds: the site's own indentation (lines deeper than the edited one keep
    their extra indentation)."""
    kind: str | None = None
    """The syntax node the old tokens make at the edit: another site must make the same."""

    def fixed(self) -> list[str]:
        return [t for t in self.old if t is not None]


def repeat_pattern(edit: LatestEdit, change: TokenChange) -> Pattern | None:
    """The hunk's change as a pattern to replay elsewhere, or None when it has no anchor."""
    old, new = change.old, change.new
    i1, i2, j1, j2 = change.same or (change.i1, change.i2, change.j1, change.j2)
    if i2 - i1 > REPEAT_MAX_TOKENS or j2 - j1 > REPEAT_MAX_TOKENS:
        return None
    # Names and literals the change keeps are holes: another site has its own. A builtin the
    # change keeps (`len` in `len(x)` -> `sum(len(e) for e in x)`) is part of its shape.
    holes = {t.text for t in new[j1:j2] if _hole(t)} & {t.text for t in old[i1:i2] if _hole(t)}
    if edit.old.count("\n") <= 1 < edit.new.count("\n"):
        # One line made several: its layout changed where no token did (a break after `(`), so
        # the pattern is the whole line.
        i1, i2, j1, j2 = 0, len(old), 0, len(new)
    # Widen by unchanged context until the old side has an anchor (a name, keyword or string
    # kept fixed) and two tokens at least.
    for _ in range(REPEAT_CONTEXT + 1):
        segment = old[i1:i2]
        anchors = [t for t in segment if t.text not in holes and _specific(t)]
        if anchors and (len(segment) >= 2 or segment[0].kind == "string"):
            break
        if i1 > 0 and j1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        if i2 < len(old) and j2 < len(new):
            i2, j2 = i2 + 1, j2 + 1
    else:
        return None
    segment, replacement = old[i1:i2], new[j1:j2]
    if not replacement:
        return None  # something deleted once: on the tuned histories, seldom deleted again
    if any(t.kind == "comment" for t in (*segment, *replacement)):
        return None
    if "\n" in edit.before[segment[0].start : segment[-1].end]:
        return None  # lines joined: a change of structure, not one repeated
    indent = _indent_at(edit.after, replacement[0].start)
    hole_of: dict[str, int] = {}
    pattern: list[str | None] = []
    for t in segment:
        if t.text in holes:
            hole_of.setdefault(t.text, len(hole_of))
            pattern.append(None)
        else:
            pattern.append(t.text)
    if pattern[0] is None or pattern[-1] is None:
        return None  # a hole at an end would match anything up to there
    pieces, cursor, depth = [], replacement[0].start, 0
    for t in replacement:
        gap = _reindented(edit.after[cursor : t.start], indent)
        if gap is None or "\n" in t.text or (depth <= 0 and "\n" in gap):
            # A line break inside a token, a line outdented past the edit's, or one outside
            # brackets: lines added (a statement, a decorator), not one line wrapped.
            return None
        depth += (t.text in _CLOSE) - (t.text in _CLOSE.values())
        pieces.append(gap)
        pieces.append(f"{{{hole_of[t.text]}}}" if t.text in hole_of else _braces(t.text))
        cursor = t.end
    kind = _node_kind(edit.before_tree, segment[0].start, segment[-1].end)
    return Pattern(tuple(pattern), tuple(hole_of), "".join(pieces), kind)


def indent_of(line: str) -> str:
    """The spaces and tabs `line` starts with."""
    return line[: len(line) - len(line.lstrip(" \t"))]


def _indent_at(text: str, offset: int) -> str:
    """The indentation of the line holding `offset`."""
    return indent_of(text[text.rfind("\n", 0, offset) + 1 : offset])


def _reindented(gap: str, indent: str) -> str | None:
    """The text between two tokens of a replacement, braces escaped, each line break's
    indentation made relative to the edited line's (`{indent}` stands for the site's); None when
    a line starts left of the edited line's indentation."""
    lines = gap.split("\n")
    out = [_braces(lines[0])]
    for line in lines[1:]:
        if not line.startswith(indent):
            return None
        out.append("{indent}" + _braces(line[len(indent) :]))
    return "\n".join(out)


def _hole(token: Token) -> bool:
    return token.is_value and token.text not in BUILTINS


def _node_kind(tree: Tree, start: int, end: int) -> str | None:
    """The type of the smallest named node holding `start`..`end` (None without a grammar)."""
    node = tree.at(start, end)
    while node is not None and not node.is_named:
        node = node.parent
    return node.type if node is not None else None


def _specific(token: Token) -> bool:
    """A token that makes a pattern specific enough to replay: a string literal, or a name of
    REPEAT_ANCHOR_CHARS or more that is no builtin (on the tuned histories, patterns anchored
    on `str`, `self`, `name` or `return False` replayed type and value changes made once)."""
    if token.kind == "string":
        return True
    return (
        token.kind == "name"
        and len(token.text) >= REPEAT_ANCHOR_CHARS
        and token.text not in BUILTINS
    )


def _is_string(text: str | None) -> bool:
    return text is not None and Token(text, 0, len(text)).kind == "string"


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _match_at(
    tokens: list[Token], i: int, pattern: Pattern
) -> tuple[int, list[tuple[int, int]]] | None:
    """(index past the match, the holes' spans) for a match of `pattern` at `tokens[i]`."""
    holes: list[tuple[int, int]] = []
    k = i
    old = pattern.old
    for p, want in enumerate(old):
        if want is not None:
            if k >= len(tokens) or tokens[k].text != want:
                return None
            k += 1
            continue
        stop = old[p + 1]  # never None at the end (repeat_pattern)
        depth, start = 0, k
        while k < len(tokens) and k - start < HOLE_SPAN:
            text = tokens[k].text
            if depth == 0 and text == stop and k > start:
                break
            if text in _CLOSE:
                depth += 1
            elif text in _CLOSE.values():
                if depth == 0:
                    return None
                depth -= 1
            k += 1
        else:
            return None
        if k >= len(tokens) or depth:
            return None
        holes.append((tokens[start].start, tokens[k - 1].end))
    return k, holes


def repeat_candidates(edit: LatestEdit, change: TokenChange) -> list[Candidate]:
    pattern = repeat_pattern(edit, change)
    if pattern is None:
        return []
    fixed = pattern.fixed()
    tokens = tokenize(edit.after, edit.language_id)
    after = edit.after_tree
    first = fixed[0]
    sites = []
    for i, token in enumerate(tokens):
        if token.text != first:
            continue
        if edit.start <= token.start < edit.new_end:
            continue
        matched = _match_at(tokens, i, pattern)
        if matched is None:
            continue
        k, holes = matched
        start, end = token.start, tokens[k - 1].end
        if start < edit.new_end and edit.start < end:
            continue
        if pattern.kind is not None and _node_kind(after, start, end) != pattern.kind:
            continue
        texts = [edit.after[s:e] for s, e in holes]
        sites.append(
            (start, end, pattern.new_text.format(*texts, indent=_indent_at(edit.after, start)))
        )
        if len(sites) > REPEAT_MAX_SITES:
            return []
    confidence = CONFIDENCE["repeat"]
    if len(pattern.old) == 1 and not _is_string(pattern.old[0]):
        confidence -= REPEAT_SHORT
    if _agrees(edit, pattern):
        confidence += REPEAT_AGREEMENT
    note = f"{' '.join(t or '_' for t in pattern.old)} -> {pattern.new_text}"
    home = top_level(after, edit.start)
    return [
        Candidate(
            "repeat",
            TextEdit(s, e, text),
            round(confidence - (REPEAT_FAR if top_level(after, s) != home else 0.0), 3),
            note,
        )
        for s, e, text in sites
        if edit.after[s:e] != text
    ]


def top_level(tree: Tree, offset: int) -> tuple[int, int] | None:
    """The span of the module's child holding `offset` (None without a grammar)."""
    if tree.root is None:
        return None
    byte = syntax.byte_offset(tree.text, offset)
    for child in tree.root.children:
        if child.start_byte <= byte < child.end_byte:
            return child.start_byte, child.end_byte
    return None


def _agrees(edit: LatestEdit, pattern: Pattern) -> bool:
    """Whether an earlier hunk of this document made the same change."""
    for earlier, change in earlier_changes(edit, 4):
        other = repeat_pattern(earlier, change)
        if other is not None and other.old == pattern.old and other.new_text == pattern.new_text:
            return True
    return False


# --- an import that binds a name bound by another import ---------------------------------------


@dataclass(frozen=True)
class ChangedLines:
    """The hunk's lines without those it holds unchanged at either end (an insertion coalesced
    with the line it went before): `old` became `new`, `head` unchanged lines above them."""

    head: int
    old: list[str]
    new: list[str]
    unchanged_above: str
    """The text of the `head` unchanged lines (the changed ones start this far into the hunk)."""


def changed_lines(edit: LatestEdit) -> ChangedLines:
    old = edit.old.splitlines(keepends=True)
    new = edit.new.splitlines(keepends=True)
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    q = 0
    while q < min(len(old), len(new)) - p and old[-1 - q] == new[-1 - q]:
        q += 1
    return ChangedLines(p, old[p : len(old) - q], new[p : len(new) - q], "".join(new[:p]))


def inserted_lines(edit: LatestEdit) -> tuple[int, int] | None:
    """The span (in `after`) of the whole lines the hunk inserted, when inserting is all it did
    (its other lines the same before and after), else None."""
    changed = changed_lines(edit)
    inserted = changed.new
    if changed.old or not inserted:
        return None
    if not inserted[-1].endswith("\n") or all(not line.strip() for line in inserted):
        return None
    start = edit.start + len(changed.unchanged_above)
    return start, start + sum(len(line) for line in inserted)


def _import_bindings(statement: Any, tree: Tree) -> list[tuple[str, Any]]:
    """(name bound, the node that binds it) for each name an import statement binds."""
    found = []
    module = statement.child_by_field_name("module_name")
    for child in statement.named_children:
        if child == module:
            continue
        if child.type == "aliased_import":
            alias = child.child_by_field_name("alias")
            if alias is not None:
                found.append((tree.node_text(alias), child))
        elif child.type == "dotted_name":
            names = [c for c in child.named_children if c.type == "identifier"]
            if len(names) == 1:  # `import a.b` binds `a` too, but adds `a.b`: no move of `a`
                found.append((tree.node_text(names[0]), child))
    return found


def line_span(text: str, start: int, end: int) -> tuple[int, int]:
    """`start`..`end` widened to whole lines, the last line's break included."""
    start = text.rfind("\n", 0, start) + 1
    end = text.find("\n", end)
    return start, len(text) if end < 0 else end + 1


def duplicate_import_candidates(edit: LatestEdit) -> list[Candidate]:
    """`import`: the hunk added an import of a name another import at the module's top level
    binds too (imports under a `try` or `if` are not top level: they may be alternatives) ->
    that other binding removed: its statement's lines when it is the statement's only name, its
    line of a parenthesized list when it stands alone there, else the name and its comma."""
    inserted = inserted_lines(edit) if edit.grammar == "python" else None
    if inserted is None:
        return []
    tree = edit.after_tree
    if tree.root is None:
        return []
    added: dict[str, Any] = {}
    others: list[tuple[str, Any, Any]] = []
    for statement in tree.root.children:
        if statement.type not in ("import_statement", "import_from_statement"):
            continue
        start, end = tree.span(statement)
        inside = inserted[0] <= start and end <= inserted[1]  # not the hunk's unchanged lines
        for name, node in _import_bindings(statement, tree):
            if inside:
                added[name] = node
            elif start >= edit.new_end or end <= edit.start:
                others.append((name, node, statement))
    candidates = []
    text = edit.after
    for name, node, statement in others:
        if name not in added:
            continue
        if len(_import_bindings(statement, tree)) == 1:
            start, end = line_span(text, *tree.span(statement))
        else:
            start, end = tree.span(node)
            following = text[end:].lstrip(" \t")
            if following.startswith(","):
                end = len(text) - len(following) + 1
                rest = text[end:]
                end += len(rest) - len(rest.lstrip(" \t"))
                line_start, line_end = line_span(text, start, end)
                if not text[line_start:start].strip() and not text[end:line_end].strip():
                    start, end = line_start, line_end  # alone on its line of a (...) list
            else:
                previous = text[:start].rstrip(" \t")
                if not previous.endswith(","):
                    continue
                start = len(previous) - 1
        note = f"{name} imported again: {tree.node_text(statement)[:50]}"
        candidates.append(Candidate("import", TextEdit(start, end, ""), CONFIDENCE["import"], note))
    return candidates

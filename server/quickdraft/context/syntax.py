"""tree-sitter helpers: which grammar a document uses, and the few syntax questions we ask.

`LANGUAGES` is the one table of the languages quickdraft knows (LSP languageId, file extensions,
grammar, comment and string syntax, the nodes a benchmark hides text in); everything that asks
what language a document is in (prompts, post-processing, the bench) reads it through
`find_language` and friends.

Grammars load lazily (the first time a language is seen) and parsers are cached per thread
(a `Parser` is not safe to share between threads). A language without a grammar, or a grammar
that fails to load, makes every helper answer "don't know" (`None`, empty lists), so callers fall
back to plain-text rules instead of failing.

Positions are code-point offsets into Python `str`s, like everywhere else in quickdraft; the
byte offsets tree-sitter works in stay inside this module.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Grammar:
    """A tree-sitter grammar: the module of its wheel and the function that returns it."""

    module: str
    function: str = "language"

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.function)()


GRAMMARS: dict[str, Grammar] = {
    "python": Grammar("tree_sitter_python"),
    "javascript": Grammar("tree_sitter_javascript"),
    "typescript": Grammar("tree_sitter_typescript", "language_typescript"),
    "tsx": Grammar("tree_sitter_typescript", "language_tsx"),
    "rust": Grammar("tree_sitter_rust"),
    "go": Grammar("tree_sitter_go"),
    "java": Grammar("tree_sitter_java"),
    "c": Grammar("tree_sitter_c"),
    "cpp": Grammar("tree_sitter_cpp"),
}
"""Grammar name -> where it loads from."""


@dataclass(frozen=True)
class Lexicon:
    """How a language writes comments and strings and opens a block: what rules that read text
    without a parse need (post-processing's lexer). The defaults are plain text."""

    line_comments: tuple[str, ...] = ()
    block_comment: tuple[str, str] | None = None
    """(opening, closing)."""
    quotes: str = ""
    """Characters that open and close a string."""
    multiline_quotes: str = ""
    """Those of `quotes` whose strings may run over a line break."""
    triple_quotes: bool = False
    """Python's triple-quoted strings."""
    indentation: bool = False
    """Blocks are delimited by indentation (Python), not by braces."""
    block_opener: str = "{"
    """What ends the header line of a block."""


PLAIN_TEXT = Lexicon()
_C_LEXICON = Lexicon(("//",), ("/*", "*/"), "\"'")
_JS_LEXICON = Lexicon(("//",), ("/*", "*/"), "\"'`", "`")


@dataclass(frozen=True)
class Language:
    """One language as an editor names it: its files, its grammar, how it writes comments and
    strings, and the syntax nodes a benchmark hides text in."""

    id: str
    """The LSP languageId, as the editor sends it."""
    grammar: str
    """Its tree-sitter grammar's name (a key of GRAMMARS)."""
    extensions: tuple[str, ...]
    """Its source files (the bench samples completion points in them)."""
    aliases: tuple[str, ...]
    """Short names (`bench --languages py,ts`); an alias may name several languages."""
    lexicon: Lexicon
    body_types: frozenset[str]
    """Node types whose body is a block of statements (a bench `block` hole)."""
    call_types: frozenset[str]
    """Node types of a call, whose argument list is a bench `args` hole."""
    argument_list_types: frozenset[str] = frozenset({"argument_list", "arguments"})
    declaration_extensions: tuple[str, ...] = ()
    """Stubs and declarations (`.pyi`, `.d.ts`): the language's grammar, but nothing to complete
    in a benchmark (opened next to the code as context)."""


LANGUAGES: dict[str, Language] = {
    language.id: language
    for language in (
        Language(
            "python",
            "python",
            (".py", ".pyw"),
            ("py", "python"),
            Lexicon(
                ("#",), None, "\"'", "", triple_quotes=True, indentation=True, block_opener=":"
            ),
            frozenset({"block"}),
            frozenset({"call"}),
            declaration_extensions=(".pyi",),
        ),
        Language(
            "javascript",
            "javascript",
            (".js", ".mjs", ".cjs"),
            ("js", "javascript"),
            _JS_LEXICON,
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        Language(
            "javascriptreact",
            "javascript",
            (".jsx",),
            ("js", "jsx", "javascriptreact"),
            _JS_LEXICON,
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        Language(
            "typescript",
            "typescript",
            (".ts", ".mts", ".cts"),
            ("ts", "typescript"),
            _JS_LEXICON,
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
            declaration_extensions=(".d.ts",),
        ),
        Language(
            "typescriptreact",
            "tsx",
            (".tsx",),
            ("ts", "tsx", "typescriptreact"),
            _JS_LEXICON,
            frozenset({"statement_block"}),
            frozenset({"call_expression", "new_expression"}),
        ),
        Language(
            "rust",
            "rust",
            (".rs",),
            ("rs", "rust"),
            Lexicon(("//",), ("/*", "*/"), '"', '"'),  # '\'' is mostly lifetimes in Rust
            frozenset({"block"}),
            frozenset({"call_expression"}),
        ),
        Language(
            "go",
            "go",
            (".go",),
            ("go", "golang"),
            _JS_LEXICON,  # Go's raw strings are backquoted too
            frozenset({"block"}),
            frozenset({"call_expression"}),
        ),
        Language(
            "java",
            "java",
            (".java",),
            ("java",),
            _C_LEXICON,
            frozenset({"block", "constructor_body"}),
            frozenset({"method_invocation", "object_creation_expression"}),
        ),
        Language(
            "c",
            "c",
            (".c", ".h"),
            ("c",),
            _C_LEXICON,
            frozenset({"compound_statement"}),
            frozenset({"call_expression"}),
        ),
        Language(
            "cpp",
            "cpp",
            (".cc", ".cpp", ".cxx", ".c++", ".hpp", ".hh", ".hxx", ".h++"),
            ("cpp", "c++", "cxx"),
            _C_LEXICON,
            frozenset({"compound_statement"}),
            frozenset({"call_expression"}),
        ),
    )
}
"""The one table of languages: LSP languageId -> Language."""

_BY_EXTENSION: dict[str, Language] = {
    extension: language
    for language in LANGUAGES.values()
    for extension in (*language.extensions, *language.declaration_extensions)
    if extension.count(".") == 1  # `.d.ts` ends in `.ts`: found by that
}

# Derived views, by grammar name.
LANGUAGE_IDS: dict[str, str] = {language.id: language.grammar for language in LANGUAGES.values()}
"""LSP languageId -> grammar name."""
EXTENSIONS: dict[str, str] = {
    suffix: language.grammar for suffix, language in _BY_EXTENSION.items()
}
"""File extension -> grammar name, for documents whose languageId we don't know."""

# Nodes that hold a list of statements or members: the "blocks" whose start/end/emptiness matter.
BLOCK_TYPES = frozenset(
    {
        "block",  # python, rust, go
        "statement_block",  # javascript, typescript
        "class_body",  # javascript, typescript, java
        "interface_body",  # java
        "enum_body",  # java
        "constructor_body",  # java
        "declaration_list",  # rust (impl, mod, trait), c++ namespace
        "field_declaration_list",  # rust struct, c/c++ struct/class
        "compound_statement",  # c, c++
        "object_type",  # typescript interface body
        "interface_declaration_body",  # older typescript grammars
    }
)

# Named children of a block that don't count as content: an "empty" body holds only these.
_FILLER_TYPES = frozenset(
    {"comment", "line_comment", "block_comment", "pass_statement", "empty_statement"}
)


def language_for_id(language_id: str | None) -> Language | None:
    """The language of an LSP languageId (any case); None when no grammar knows it."""
    return LANGUAGES.get(language_id.lower()) if language_id else None


def language_for_path(path: str) -> Language | None:
    """The language of a file by its extension (stubs and declarations included); None when no
    grammar knows it."""
    name = path.rsplit("/", 1)[-1].rsplit("\\", 1)[-1].lower()
    dot = name.rfind(".")
    return _BY_EXTENSION.get(name[dot:]) if dot > 0 else None


def find_language(language_id: str | None, path: str | None = None) -> Language | None:
    """The language of an LSP languageId, else of the path's extension; None = plain text."""
    return language_for_id(language_id) or (language_for_path(path) if path else None)


def language_id_for_path(path: str) -> str:
    """The LSP languageId an editor would give a file, from its extension ("plaintext" if
    no grammar knows it)."""
    language = language_for_path(path)
    return language.id if language is not None else "plaintext"


def resolve_language(language_id: str | None, path: str | None = None) -> str | None:
    """The grammar name for an LSP languageId, else for the path's extension; None = plain text."""
    language = find_language(language_id, path)
    return language.grammar if language is not None else None


# --- grammar and parser loading -------------------------------------------------------------

_languages: dict[str, Any] = {}  # grammar -> tree_sitter.Language, or None when it failed to load
_languages_lock = threading.Lock()
_local = threading.local()


def tree_sitter_language(grammar: str | None) -> Any | None:
    """The tree_sitter.Language for a grammar name, loaded once; None if unknown or broken."""
    if grammar is None or grammar not in GRAMMARS:
        return None
    with _languages_lock:
        if grammar not in _languages:
            try:
                import tree_sitter

                _languages[grammar] = tree_sitter.Language(GRAMMARS[grammar].load())
            except Exception:  # a missing or incompatible grammar wheel: plain text, not a crash
                _languages[grammar] = None
        return _languages[grammar]


def get_parser(grammar: str | None) -> Any | None:
    """A parser for the grammar, cached per thread; None when there is no grammar."""
    language = tree_sitter_language(grammar)
    if language is None:
        return None
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    parser = parsers.get(grammar)
    if parser is None:
        from tree_sitter import Parser

        parser = parsers[grammar] = Parser(language)
    return parser


_TREE_CACHE_SIZE = 8


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def parse(text: str, grammar: str | None) -> Any | None:
    """The syntax tree of `text`, or None without a grammar. The last few trees are cached."""
    parser = get_parser(grammar)
    if parser is None:
        return None
    cache: OrderedDict = getattr(_local, "trees", None)
    if cache is None:
        cache = _local.trees = OrderedDict()
    key = (grammar, text)
    tree = cache.get(key)
    if tree is not None:
        cache.move_to_end(key)
        return tree
    tree = parser.parse(_encode(text))
    cache[key] = tree
    if len(cache) > _TREE_CACHE_SIZE:
        cache.popitem(last=False)
    return tree


def byte_offset(text: str, offset: int) -> int:
    """The UTF-8 byte offset of code-point offset `offset` in `text`."""
    return len(_encode(text[:offset]))


# --- questions ----------------------------------------------------------------------------


def _has_lone_cr(text: str) -> bool:
    # tree-sitter counts rows by "\n" only; with old-Mac "\r" line ends its rows are not ours.
    return "\r" in text and text.count("\r") != text.count("\r\n")


def _body_of(node: Any) -> Any | None:
    """The block holding a definition's members or statements, looked for a few levels down."""
    frontier = [node]
    for _ in range(3):
        following = []
        for current in frontier:
            body = current.child_by_field_name("body")
            if body is not None and body.type in BLOCK_TYPES:
                return body
            for child in current.named_children:
                if child.type in BLOCK_TYPES:
                    return child
                following.append(child)
        frontier = following
    return None


def statement_start_lines(text: str, grammar: str | None, depth: int = 2) -> list[int]:
    """Lines where statements start at nesting depth <= `depth` (1 = top level only).

    Depth 2 adds the members of top-level definitions (methods of a class, statements of a
    top-level function), which are the next-best places to cut a long prefix. Only nodes that
    begin their line count, so a cut there never splits a line. Empty without a grammar.
    """
    if _has_lone_cr(text):
        return []
    tree = parse(text, grammar)
    if tree is None:
        return []
    rows: set[int] = set()
    level = [tree.root_node]
    for _ in range(depth):
        following = []
        for parent in level:
            for child in parent.named_children:
                rows.add(child.start_point.row)
                body = _body_of(child)
                if body is not None:
                    following.append(body)
        level = following
    return sorted(rows)


def error_count(text: str, grammar: str | None) -> int | None:
    """Number of ERROR and MISSING nodes in the parse of `text`; None without a grammar."""
    tree = parse(text, grammar)
    if tree is None:
        return None
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count


def parses_without_new_errors(before: str, after: str, grammar: str | None) -> bool | None:
    """Whether `after` has no more syntax errors than `before`; None without a grammar."""
    old = error_count(before, grammar)
    if old is None:
        return None
    new = error_count(after, grammar)
    return new is not None and new <= old


def node_at(text: str, offset: int, grammar: str | None) -> Any | None:
    """The smallest node that spans the character just before `offset` (or at it, at 0)."""
    tree = parse(text, grammar)
    if tree is None:
        return None
    b = byte_offset(text, offset)
    start = max(b - 1, 0)
    return tree.root_node.descendant_for_byte_range(start, max(b, start))


def _is_empty_block(block: Any) -> bool:
    for child in block.named_children:
        if child.type in _FILLER_TYPES:
            continue
        if child.type == "expression_statement" and child.text.strip() == b"...":
            continue
        return False
    return True


def enclosing_block(text: str, offset: int, grammar: str | None) -> Any | None:
    """The innermost block node (see BLOCK_TYPES) whose delimiters enclose `offset`."""
    tree = parse(text, grammar)
    if tree is None:
        return None
    b = byte_offset(text, offset)
    node = tree.root_node.descendant_for_byte_range(b, b)
    while node is not None:
        if node.type in BLOCK_TYPES and node.start_byte < b < node.end_byte:
            return node
        node = node.parent
    return None


def in_empty_block(text: str, offset: int, grammar: str | None) -> bool | None:
    """Whether the cursor sits in a block with nothing in it yet (None without a grammar).

    Covers both `function f() {|}`-style bodies (the braces enclose the cursor) and Python
    bodies, which tree-sitter gives a zero-width block right after the `:` of the header: there
    the cursor must be on a later line than the header, with only whitespace before it.
    """
    tree = parse(text, grammar)
    if tree is None:
        return None
    block = enclosing_block(text, offset, grammar)
    if block is not None:
        return _is_empty_block(block)
    # Python-style: the last non-blank character before the cursor ends a header with an empty
    # body, and the cursor is on a following line.
    before = text[:offset]
    line_start = before.rfind("\n") + 1
    if before[line_start:].strip():
        return False
    stripped = before.rstrip()
    if not stripped:
        return False
    b = byte_offset(text, offset)
    q = len(_encode(stripped)) - 1
    leaf = tree.root_node.descendant_for_byte_range(q, q + 1)
    # Comments after the header (`def f():  # todo`) don't count as body content.
    while leaf is not None and "comment" in leaf.type:
        leaf = leaf.prev_sibling if leaf.prev_sibling is not None else leaf.parent
    if leaf is None:
        return False
    last_end = leaf.end_byte
    node = leaf
    for _ in range(4):
        if node is None:
            break
        for child in node.children:
            # The header's own body: it ends at or after the last token before the cursor, so
            # it is not some earlier, finished block of the same statement.
            if (
                child.type in BLOCK_TYPES
                and last_end <= child.end_byte <= b
                and _is_empty_block(child)
            ):
                return True
        node = node.parent
    return False

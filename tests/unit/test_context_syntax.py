"""tree-sitter helpers: language resolution, boundaries, empty blocks, errors, plain text."""

import pytest

from quickdraft.context import syntax


@pytest.mark.parametrize(
    ("language_id", "grammar"),
    [
        ("python", "python"),
        ("javascript", "javascript"),
        ("javascriptreact", "javascript"),
        ("typescript", "typescript"),
        ("typescriptreact", "tsx"),
        ("rust", "rust"),
        ("go", "go"),
        ("java", "java"),
        ("c", "c"),
        ("cpp", "cpp"),
    ],
)
def test_language_ids_map_to_grammars_that_load(language_id, grammar):
    assert syntax.resolve_language(language_id) == grammar
    assert syntax.get_parser(grammar) is not None


@pytest.mark.parametrize(
    ("path", "grammar"),
    [("/a/b.py", "python"), ("x.TSX", "tsx"), ("m.rs", "rust"), ("k.hpp", "cpp"), ("README", None)],
)
def test_extensions_are_the_fallback(path, grammar):
    assert syntax.resolve_language(None, path) == grammar
    assert syntax.resolve_language("plaintext", path) == grammar


def test_language_id_wins_over_extension():
    assert syntax.resolve_language("python", "script.js") == "python"


def test_unknown_language_answers_dont_know():
    assert syntax.resolve_language("cobol") is None
    assert syntax.parse("IDENTIFICATION DIVISION.", None) is None
    assert syntax.statement_start_lines("a\nb\n", None) == []
    assert syntax.error_count("x", None) is None
    assert syntax.in_empty_block("x", 1, None) is None


def test_top_level_and_nested_statement_lines():
    source = (
        "import os\n"  # 0
        "\n"
        "class A:\n"  # 2
        "    x = 1\n"  # 3
        "\n"
        "    def f(self):\n"  # 5
        "        return 1\n"  # 6
        "\n"
        "@dec\n"  # 8
        "def g():\n"
        "    pass\n"  # 10
    )
    assert syntax.statement_start_lines(source, "python", depth=1) == [0, 2, 8]
    assert syntax.statement_start_lines(source, "python", depth=2) == [0, 2, 3, 5, 8, 10]


def test_statement_lines_for_a_brace_language():
    source = "function a() {\n  one();\n  two();\n}\n\nclass B {\n  m() {}\n}\n"
    assert syntax.statement_start_lines(source, "javascript", depth=1) == [0, 5]
    assert syntax.statement_start_lines(source, "javascript", depth=2) == [0, 1, 2, 5, 6]


@pytest.mark.parametrize(
    ("before", "after", "grammar", "expected"),
    [
        ("def f():\n    ", "\n\nx = 2\n", "python", True),
        ("def f():  # todo\n    ", "\n", "python", True),
        ("class A:\n    def f(self):\n        ", "\n", "python", True),
        ("if x:\n    pass\nelse:\n    ", "\n", "python", True),
        ("def f():\n    return 1\n    ", "\n", "python", False),
        ("try:\n    pass\nexcept E:\n    x = 1\n", "\n", "python", False),
        ("function f() {\n  ", "\n}\n", "javascript", True),
        ("function f() {\n  x();\n  ", "\n}\n", "javascript", False),
        ("fn main() {\n    ", "\n}\n", "rust", True),
        ("func main() {\n\t", "\n}\n", "go", True),
        ("int main() {\n    ", "\n}\n", "c", True),
        ("class A {\n  ", "\n}\n", "java", True),
    ],
)
def test_in_empty_block(before, after, grammar, expected):
    assert syntax.in_empty_block(before + after, len(before), grammar) is expected


def test_error_count_and_new_errors():
    assert syntax.error_count("x = 1\n", "python") == 0
    assert syntax.error_count("def f(:\n", "python") >= 1
    assert syntax.parses_without_new_errors("x = (\n", "x = (1)\n", "python") is True
    assert syntax.parses_without_new_errors("x = 1\n", "x = 1 +\n", "python") is False
    assert syntax.parses_without_new_errors("a", "b", None) is None


def test_offsets_are_code_points_even_with_multibyte_text():
    text = 's = "héllo ✓ 🎉"\n'
    inside = text.index("🎉")
    assert syntax.byte_offset(text, inside) == len(text[:inside].encode())
    # The node just before each offset: the emoji (the string's content), the closing quote.
    assert syntax.node_at(text, inside + 1, "python").type == "string_content"
    assert syntax.node_at(text, len(text) - 1, "python").type == "string_end"


def test_parse_cache_returns_the_same_tree_for_the_same_text():
    text = "def cached():\n    pass\n"
    assert syntax.parse(text, "python") is syntax.parse(text, "python")


def test_old_mac_line_endings_give_no_boundaries_rather_than_wrong_ones():
    assert syntax.statement_start_lines("x = 1\ry = 2\r", "python") == []


def test_language_id_for_path_gives_the_editor_language_id():
    from quickdraft.context.syntax import language_id_for_path

    assert language_id_for_path("src/app.tsx") == "typescriptreact"
    assert language_id_for_path("lib.RS") == "rust"
    assert language_id_for_path("Makefile") == "plaintext"
    assert language_id_for_path("notes.txt") == "plaintext"

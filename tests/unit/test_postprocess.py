"""Post-processing: mode decision, the stop rule run during generation, final trimming."""

import pytest

from quickdraft import postprocess
from quickdraft.context.cursor import PREFIX_WINDOW_CHARS, CursorContext

# The rules take the cursor's context, read once per request; these tests give it as text.


def decide_mode(prefix, suffix, language, multiline="auto"):
    return postprocess.decide_mode(CursorContext.parse(prefix, suffix, language), multiline)


def StopRule(prefix, suffix, language, mode):  # noqa: N802 - stands for the class
    return postprocess.StopRule(CursorContext.parse(prefix, suffix, language), mode)


def finalize(text, prefix, suffix, language, mode):
    return postprocess.finalize(text, CursorContext.parse(prefix, suffix, language), mode)


def stops_after(prefix, suffix, language, mode, generated, step=1):
    """Feed `generated` to a StopRule `step` characters at a time, as a decoder would; return the
    text seen when it first said stop (None if it never did)."""
    rule = StopRule(prefix, suffix, language, mode)
    for end in range(step, len(generated) + step, step):
        seen = generated[:end]
        if rule(seen):
            return seen
    return None


# --- decide_mode --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "suffix", "language", "expected"),
    [
        # text after the cursor on the same line: finish the line
        ("x = foo(", ")\n", "python", "line"),
        ("return a + ", " * 2\n", "python", "line"),
        # text before the cursor that opens nothing: finish the line
        ("total = compute", "\n", "python", "line"),
        ("const total = compute", "\n", "javascript", "line"),
        # a block opener at the end of the line
        ("def f(x):", "\n", "python", "block"),
        ("if (ready) {", "\n}\n", "javascript", "block"),
        ("function f() {", "}\n", "javascript", "block"),  # between the braces
        ("items = [", "\n", "python", "block"),
        # ':' inside brackets (dict, slice) is not a block opener
        ("d = {'a':", "\n", "python", "line"),
        # an empty body on a blank line
        ("def f(x):\n    ", "\n\ndef g():\n    pass\n", "python", "block"),
        ("function f() {\n  ", "\n}\n", "javascript", "block"),
        ("fn main() {\n    ", "\n}\n", "rust", "block"),
        # a blank line at the end of a block or of the document
        ("def f(x):\n    y = 1\n    ", "\n\ndef g():\n    pass\n", "python", "block"),
        ("x = 1\n", "", "python", "block"),
        # a blank line in the middle of a block: one statement
        ("def f(x):\n    y = 1\n    ", "\n    return y\n", "python", "line"),
        # inside a comment or a string: finish it
        ("# compute the {", "\n", "python", "line"),
        ('s = "abc {', '"\n', "python", "line"),
        ("// note: {", "\n", "javascript", "line"),
    ],
)
def test_decide_mode(prefix, suffix, language, expected):
    assert decide_mode(prefix, suffix, language) == expected


def test_decide_mode_settings_force_it():
    assert decide_mode("x = foo(", ")\n", "python", "always") == "block"
    assert decide_mode("def f(x):", "\n", "python", "never") == "line"


def test_decide_mode_unknown_language_uses_text_rules():
    assert decide_mode("Dear team,\n", "", "plaintext") == "block"
    assert decide_mode("The answer is", "\n", "plaintext") == "line"


# --- StopRule: line mode --------------------------------------------------------------------


def test_line_mode_stops_at_the_first_newline_after_content():
    seen = stops_after("total = ", "\n", "python", "line", "compute(a, b)\nprint(total)\n")
    assert seen == "compute(a, b)\n"


def test_line_mode_goes_past_leading_whitespace_on_a_blank_line():
    seen = stops_after("    ", "\n", "python", "line", "\n    x = 1\n    y = 2\n")
    assert seen == "\n    x = 1\n"


def test_line_mode_does_not_repeat_the_next_line():
    prefix = "def f(x):\n    y = 1\n    "
    suffix = "\n    return y\n"
    assert finalize("return y\n", prefix, suffix, "python", "line") == ""
    assert finalize("y += 1\n", prefix, suffix, "python", "line") == "y += 1"


def test_completing_the_cursors_line_into_the_next_line_suggests_nothing():
    # Typing `s` on a new line above `staging = Path(`: the model re-types that line.
    prefix = "def stage():\n    s"
    suffix = "\n    staging = Path(\n        tempfile.mkdtemp()\n    )\n"
    context = CursorContext.parse(prefix, suffix, "python")
    for mode in ("line", "block"):
        shown = postprocess.finish("taging = Path(\n", context, mode)
        assert shown == postprocess.Finished("", repeated=True, changed=True), mode
        assert StopRule(prefix, suffix, "python", mode)("taging = Path(\n")
    # A different line is suggested as it is, and says it repeated nothing.
    other = postprocess.finish("ource = Path(root)\n", context, "line")
    assert other == postprocess.Finished("ource = Path(root)")
    # With text after the cursor, the completed line is judged whole.
    mid = CursorContext.parse("    x = f(", ")\n    x = f(a)\n", "python")
    assert postprocess.finish("a)", mid, "line").text == ""
    assert postprocess.finish("b)", mid, "line").text == "b"


def test_a_repeat_of_the_next_line_later_in_a_block_is_cut_and_reported():
    context = CursorContext.parse("def f(x):\n    ", "\n    return y\n", "python")
    shown = postprocess.finish("y = x * 2\n    return y\n", context, "block")
    assert shown == postprocess.Finished("y = x * 2", repeated=True, changed=True)
    # Without the rule the repeat would have been shown: that is what `changed` counts.
    plain = postprocess._finalize(
        "y = x * 2\n    return y\n",
        context,
        "block",
        postprocess.StopRule(context, "block", check_repeats=False),
    )
    assert plain == "y = x * 2\n    return y"


def test_line_mode_stops_at_once_when_the_model_leaves_a_non_blank_line():
    assert stops_after("x = compute(a)", "\n", "python", "line", "\ny = 2\n") == "\n"


def test_stop_before_a_closer_the_suffix_already_has():
    assert stops_after("x = foo(", ")\n", "python", "line", "a, b)\n") == "a, b)"
    # ... but not before one the suffix lacks
    assert stops_after("x = foo(", "\n", "python", "line", "a, b)\n") == "a, b)\n"


def test_closers_inside_strings_and_comments_do_not_count():
    seen = stops_after("print(", ")\n", "python", "line", "'(:)' + \"]\")  # )\n")
    assert seen == "'(:)' + \"]\")"


def test_the_rule_reads_only_the_unfinished_last_line_per_call(monkeypatch):
    """Called after every token, the rule lexes what is new since the last call plus the line
    that was unfinished then, never the completion from its start again, nor the 2000-line
    prefix and suffix (read once, when the cursor's context is built)."""
    prefix = "def f(x):\n" + "    y = x\n" * 2000 + "    "
    suffix = "\n" + "    z = 1\n" * 2000
    rule = StopRule(prefix, suffix, "python", "block")
    lexed: list[int] = []
    lex = postprocess.lex

    def counting(spec, text, *args, **kwargs):
        lexed.append(len(text))
        return lex(spec, text, *args, **kwargs)

    monkeypatch.setattr(postprocess, "lex", counting)
    generated = "".join(f"v{i} = compute(x, {i})  # note\n    " for i in range(40))
    longest_line = max(len(line) for line in generated.split("\n")) + 1  # with its "\n"
    previous = 0
    for end in range(1, len(generated), 4):
        lexed.clear()
        assert not rule(generated[:end])
        assert lexed  # it did read the new text
        assert sum(lexed) <= (end - previous) + longest_line, end
        previous = end
    assert end > 1000  # a rule that re-read everything would lex 1000+ characters a call


# --- StopRule: block mode -------------------------------------------------------------------


def test_python_block_stops_when_a_line_dedents():
    seen = stops_after(
        "def f(x):\n    ",
        "\n\ndef g():\n    pass\n",
        "python",
        "block",
        "y = x + 1\n    return y\n\ndef h():\n    pass\n",
    )
    assert seen == "y = x + 1\n    return y\n\nd"


def test_python_block_after_a_header_stops_at_the_headers_indentation():
    seen = stops_after(
        "    if ready:", "\n    other()\n", "python", "block", "\n        go()\n    else:\n"
    )
    assert seen == "\n        go()\n    e"


def test_block_stops_when_it_repeats_the_next_line_of_the_suffix():
    seen = stops_after(
        "def f(x):\n    ",
        "\n    return y\n",
        "python",
        "block",
        "y = x * 2\n    return y\n",
    )
    assert seen == "y = x * 2\n    return y\n"
    assert (
        finalize(
            "y = x * 2\n    return y\n", "def f(x):\n    ", "\n    return y\n", "python", "block"
        )
        == "y = x * 2"
    )


def test_brace_block_stops_before_the_brace_the_suffix_has():
    prefix = "function f() {\n  "
    generated = "const a = 1;\n  return a;\n}\n\nfunction g() {}\n"
    assert (
        stops_after(prefix, "\n}\n", "javascript", "block", generated)
        == "const a = 1;\n  return a;\n}"
    )
    assert (
        finalize(generated, prefix, "\n}\n", "javascript", "block") == "const a = 1;\n  return a;"
    )


def test_brace_block_keeps_the_closing_brace_the_suffix_lacks():
    prefix = "function f() {"
    suffix = "\n\nfunction g() {}\n"
    generated = "\n  const a = 1;\n  return a;\n}\n\nfunction h() {}\n"
    seen = stops_after(prefix, suffix, "javascript", "block", generated)
    assert seen == "\n  const a = 1;\n  return a;\n}\n"
    assert (
        finalize(generated, prefix, suffix, "javascript", "block")
        == "\n  const a = 1;\n  return a;\n}"
    )


def test_brace_block_keeps_a_closing_run_like_close_paren_semicolon():
    prefix = "items.forEach(function (item) {"
    generated = "\n  use(item);\n});\nmore();\n"
    assert finalize(generated, prefix, "\n", "javascript", "block") == "\n  use(item);\n});"


def test_closing_the_headers_bracket_mid_line_lets_the_line_finish():
    generated = "a, b) + offset\nnext_statement()\n"
    assert finalize(generated, "total = compute(", "\n", "python", "block") == "a, b) + offset"


def test_nested_callback_stops_before_the_suffixs_closers():
    prefix = "if (x) {\n    foo(function() {\n        "
    suffix = "\n    });\n}\n"
    assert finalize("bar();\n    });\n}\n", prefix, suffix, "javascript", "block") == "bar();"


def test_top_level_block_stops_at_the_next_paragraph():
    generated = "import os\nimport sys\n\n\ndef main():\n    pass\n"
    assert stops_after("", "", "python", "block", generated) == "import os\nimport sys\n\n\nd"
    assert finalize(generated, "", "", "python", "block") == "import os\nimport sys"


def test_python_multiline_list_closes_with_its_bracket():
    prefix = "values = ["
    generated = "\n    1,\n    2,\n]\nprint(values)\n"
    assert finalize(generated, prefix, "\n", "python", "block") == "\n    1,\n    2,\n]"


def test_docstring_lines_do_not_count_as_dedents():
    prefix = "def f():\n    "
    generated = '"""Summary.\n\nDetails at column zero.\n    """\n    return 1\n\nx = 2\n'
    assert finalize(generated, prefix, "\n", "python", "block") == (
        '"""Summary.\n\nDetails at column zero.\n    """\n    return 1'
    )


def test_rust_lifetimes_are_not_strings():
    prefix = "fn f<'a>(x: &'a str) -> &'a str {\n    "
    generated = "let y: &'a str = x;\n    y\n}\n"
    assert finalize(generated, prefix, "\n}\n", "rust", "block") == "let y: &'a str = x;\n    y"


def test_unknown_language_block_uses_indentation_and_brackets():
    prefix = "steps:\n  "
    generated = "- one\n  - two\nnext: 1\n"
    assert finalize(generated, prefix, "\n", "yaml", "block") == "- one\n  - two"


def test_a_long_prefix_is_scanned_from_an_unindented_line():
    # Make the scan window's first full line the *second* line of a docstring: read from there,
    # its closing quotes would open a string and the code after it would look like text.
    chunk = 'def f():\n    """Doc (with an open bracket\n    and more text."""\n    return 1\n\n'
    body = chunk * (PREFIX_WINDOW_CHARS // len(chunk) + 2)
    for pad in range(len(chunk)):
        prefix = body + "#" * pad + "\nx = compute("
        window = prefix[-PREFIX_WINDOW_CHARS:]
        if window[window.find("\n") + 1 :].startswith("    and more text."):
            break
    else:
        raise AssertionError("no padding puts the window start inside a docstring")
    assert decide_mode(prefix, ")\n", "python") == "line"
    assert finalize("a)", prefix, ")\n", "python", "line") == "a"


def test_rule_restarts_if_the_decoded_text_changes_behind_it():
    rule = StopRule("def f(x):\n    ", "\n", "python", "block")
    assert not rule("y = 1\n    ")
    # a detokenizer fixed up an earlier byte: the rule reads everything again
    assert not rule("z = 1\n    w")
    assert rule("z = 1\n    w = 2\nx")


# --- finalize -------------------------------------------------------------------------------


def test_line_mode_never_includes_a_newline():
    text = finalize("compute(a, b)\nprint(total)\n", "total = ", "\n", "python", "line")
    assert text == "compute(a, b)"
    assert finalize("\ny = 2\n", "x = compute(a)", "\n", "python", "line") == ""


def test_line_mode_on_a_blank_line_takes_the_first_content_line():
    assert finalize("\n    x = 1\n", "    ", "\n", "python", "line") == "x = 1"
    assert finalize("\n        x = 1\n", "    ", "\n", "python", "line") == "    x = 1"


def test_finalize_drops_the_closer_the_suffix_already_has():
    assert finalize("a, b)", "x = foo(", ")\n", "python", "line") == "a, b"
    assert finalize("a, b))", "print(foo(", ")\n", "python", "line") == "a, b)"


def test_finalize_drops_a_tail_the_rest_of_the_line_repeats():
    assert finalize('lo"', 'x = "hel', '"\n', "python", "line") == "lo"
    assert finalize("foo();", "", ";\n", "javascript", "line") == "foo()"
    assert finalize("x: int = 0", "", ": int = 0\n", "python", "line") == "x"
    assert finalize("self.name", "return ", "name\n", "python", "line") == "self."


def test_finalize_keeps_text_that_only_looks_like_the_suffix():
    # "some_value" ends with "e" and the suffix starts with "e": not a repeat of a word
    assert finalize("some_value", "x = ", "e\n", "python", "line") == "some_value"
    # a quote that closes the completion's own string is not the suffix's quote
    assert finalize('"abc"', "x = ", '"\n', "python", "line") == '"abc"'


def test_finalize_strips_trailing_whitespace():
    assert finalize("y = 1   \n    return y  \n\n", "def f():\n    ", "\n", "python", "block") == (
        "y = 1\n    return y"
    )
    assert finalize("   ", "x = ", "\n", "python", "line") == ""


def test_finalize_drops_a_trailing_line_cut_off_mid_statement():
    prefix = "def f(items):\n    "
    generated = (
        "total = 0\n    for item in items:\n        total += item\n    return compute(total,"
    )
    assert finalize(generated, prefix, "\n", "python", "block") == (
        "total = 0\n    for item in items:\n        total += item"
    )


def test_finalize_multibyte_text():
    assert finalize("'héllo 🎉')\nnext()\n", "print(", ")\n", "python", "line") == "'héllo 🎉'"

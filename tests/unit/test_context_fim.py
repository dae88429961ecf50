"""FIM templates: each family's exact layout, stop tokens, snippets, unknown families."""

import pytest

from quickdraft.context import FIM_FAMILIES, get_fim_template
from quickdraft.context.snippets import Snippet
from quickdraft.errors import ConfigError, QuickdraftError


def test_qwen_file_level_layout():
    t = get_fim_template("qwen2.5-coder")
    assert t.render("def f(", "):\n", []) == "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"


def test_qwen_repo_level_layout_matches_model_card():
    t = get_fim_template("qwen2.5-coder")
    snippets = [Snippet("lib.py", "def helper():\n    pass", 0, 2, 0.5)]
    text = t.render("import lib\n", "\n", snippets, repo_name="demo", path="main.py")
    assert text == (
        "<|repo_name|>demo\n"
        "<|file_sep|>lib.py\ndef helper():\n    pass\n"
        "<|file_sep|>main.py\n"
        "<|fim_prefix|>import lib\n<|fim_suffix|>\n<|fim_middle|>"
    )


def test_qwen_snippets_without_repo_name_skip_the_repo_line():
    t = get_fim_template("qwen2.5-coder")
    text = t.render("a", "b", [("x.py", "X = 1")], path="y.py")
    assert text.startswith("<|file_sep|>x.py\nX = 1\n<|file_sep|>y.py\n<|fim_prefix|>a")


def test_qwen_stop_tokens():
    stops = get_fim_template("qwen2.5-coder").stop_tokens
    for token in ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>", "<|fim_prefix|>"):
        assert token in stops


def test_deepseek_uses_fullwidth_bars():
    t = get_fim_template("deepseek-coder")
    assert t.render("p", "s") == "<｜fim▁begin｜>p<｜fim▁hole｜>s<｜fim▁end｜>"
    assert "<｜end▁of▁sentence｜>" in t.stop_tokens
    assert "|" not in t.fim_prefix  # ASCII bars would be plain text to the tokenizer


def test_deepseek_snippets_are_comment_labelled_inside_the_prefix():
    t = get_fim_template("deepseek-coder")
    text = t.render(
        "x = 1\n", "", [("util.py", "def u(): pass")], path="main.py", language_id="python"
    )
    assert text.startswith("<｜fim▁begin｜># util.py\ndef u(): pass\n\n# main.py\nx = 1\n")
    js = t.render("", "", [("util.js", "let u")], path="main.js", language_id="javascript")
    assert "// util.js\n" in js and "// main.js\n" in js


def test_starcoder2_layout():
    t = get_fim_template("starcoder2")
    assert t.render("p", "s") == "<fim_prefix>p<fim_suffix>s<fim_middle>"
    text = t.render("p", "s", [("a.py", "A")], repo_name="r", path="b.py")
    assert (
        text
        == "<repo_name>r<file_sep>a.py\nA\n<file_sep><fim_prefix>b.py\np<fim_suffix>s<fim_middle>"
    )
    assert {"<file_sep>", "<|endoftext|>", "<fim_prefix>"} <= set(t.stop_tokens)


def test_codellama_layout():
    t = get_fim_template("codellama")
    assert t.render("def f(", ")") == "<PRE> def f( <SUF>) <MID>"
    assert "<EOT>" in t.stop_tokens


def test_unknown_family_lists_known_ones():
    with pytest.raises(ConfigError) as info:
        get_fim_template("gpt-17")
    message = str(info.value)
    assert "gpt-17" in message
    for family in FIM_FAMILIES:
        assert family in message
    assert isinstance(info.value, QuickdraftError)


def test_family_lookup_is_case_insensitive():
    assert get_fim_template("Qwen2.5-Coder").family == "qwen2.5-coder"


@pytest.mark.parametrize("family", FIM_FAMILIES)
def test_special_tokens_in_document_text_are_defused(family):
    t = get_fim_template(family)
    marker = t.stop_tokens[0]
    text = t.render(f"s = '{marker}'\n", "", [])
    # The marker appears once as a template marker at most, never verbatim from the document.
    assert f"'{marker}'" not in text
    assert "s = '" in text


def test_sanitize_leaves_ordinary_text_alone():
    t = get_fim_template("qwen2.5-coder")
    assert t.sanitize("if a < b and c > d:") == "if a < b and c > d:"

"""build_prompt: positions, budgets, trimming at stable syntactic boundaries, snippets (in the
classic layout unless a test says otherwise)."""

import pytest

from quickdraft.config import ContextConfig
from quickdraft.context import build_prompt, get_fim_template, split_lines, syntax
from quickdraft.errors import PositionError
from quickdraft.testing import build_tiny_tokenizer

QWEN = get_fim_template("qwen2.5-coder")


def utf8_count(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.fixture(scope="module")
def tiny_count():
    tokenizer = build_tiny_tokenizer()
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def functions(count: int, start: int = 0) -> str:
    return "".join(
        f"def func_{i}(value):\n    result = value + {i}\n    return result\n\n"
        for i in range(start, start + count)
    )


def classic(**kw) -> ContextConfig:
    """The classic layout (prefix up to the cursor, then the suffix), which most tests here
    measure; the append layout's own rules are tested in test_completer.py."""
    return ContextConfig(**{"layout": "classic", **kw})


def no_snippets(**kw) -> ContextConfig:
    return classic(snippet_share=0.0, **kw)


def test_small_document_goes_in_whole():
    text = "def f(x):\n    return x\n\nprint(f(1))\n"
    prompt = build_prompt(text, 1, 10, "python", [], QWEN, utf8_count, classic())
    assert prompt.prefix == "def f(x):\n    return"
    assert prompt.suffix == " x\n\nprint(f(1))\n"
    assert prompt.text == QWEN.render(prompt.prefix, prompt.suffix)
    assert prompt.prefix_start_line == 0
    assert prompt.suffix_end_line == len(split_lines(text)[0])
    assert not prompt.prefix_truncated and not prompt.suffix_truncated
    assert prompt.prompt_tokens == utf8_count(prompt.text)
    assert prompt.language == "python"


@pytest.mark.parametrize(
    ("line", "character", "needle"),
    [(-1, 0, "line -1"), (3, 0, "line 3"), (0, 99, "character 99"), (1, -1, "character -1")],
)
def test_positions_outside_the_document_raise(line, character, needle):
    text = "abc\nde\nf"
    with pytest.raises(PositionError) as info:
        build_prompt(text, line, character, "python", [], QWEN, utf8_count)
    assert needle in str(info.value)


def test_end_of_line_and_empty_last_line_are_valid():
    text = "abc\n"
    assert build_prompt(text, 0, 3, "python", [], QWEN, utf8_count).prefix == "abc"
    assert build_prompt(text, 1, 0, "python", [], QWEN, utf8_count).prefix == "abc\n"
    assert build_prompt("", 0, 0, "python", [], QWEN, utf8_count).prefix == ""


def test_characters_are_code_points_with_multibyte_text():
    text = 'name = "héllo 🎉 wörld"\nnext_line = 1\n'
    character = text.index("🎉") + 1  # just after the emoji (2 UTF-16 units, 4 bytes, 1 code point)
    prompt = build_prompt(text, 0, character, "python", [], QWEN, utf8_count)
    assert prompt.prefix == 'name = "héllo 🎉'
    assert prompt.suffix.startswith(' wörld"\n')


def test_crlf_and_cr_line_breaks_count_as_lsp_lines():
    text = "a = 1\r\nb = 2\rc = 3\n"
    prompt = build_prompt(text, 2, 1, "python", [], QWEN, utf8_count)
    assert prompt.prefix == "a = 1\r\nb = 2\rc"
    assert prompt.suffix == " = 3\n"


def test_budget_is_respected_with_a_real_tokenizer(tiny_count):
    text = functions(400)
    for budget in (64, 300, 1536):
        config = no_snippets(max_prompt_tokens=budget)
        prompt = build_prompt(text, 800, 4, "python", [], QWEN, tiny_count, config)
        assert prompt.prompt_tokens == tiny_count(prompt.text)
        assert prompt.prompt_tokens <= budget
        assert prompt.prefix_truncated and prompt.suffix_truncated
        # the budget is used, not wasted: at least half of it
        assert prompt.prompt_tokens >= budget // 2


def test_trimming_keeps_whole_lines():
    text = functions(300)
    lines, _ = split_lines(text)
    full = text.splitlines(keepends=True)
    prompt = build_prompt(
        text, 600, 10, "python", [], QWEN, utf8_count, no_snippets(max_prompt_tokens=800)
    )
    start, end = prompt.prefix_start_line, prompt.suffix_end_line
    assert 0 < start < 600 < end < len(lines)
    assert prompt.prefix == "".join(full[start:600]) + lines[600][:10]
    assert prompt.suffix == lines[600][10:] + "\n" + "".join(full[601:end])


def test_prefix_starts_at_a_top_level_statement():
    text = functions(300)
    config = no_snippets(max_prompt_tokens=1000)
    tops = set(syntax.statement_start_lines(text, "python", depth=1))
    for line in (400, 401, 402, 555, 777):
        prompt = build_prompt(text, line, 0, "python", [], QWEN, utf8_count, config)
        assert prompt.prefix_start_line in tops
        assert prompt.prefix.startswith("def func_")
        assert prompt.suffix_end_line in tops  # the suffix ends before a top-level statement


def test_prefix_start_is_stable_while_typing_and_moving_down():
    text = functions(400)
    lines, _ = split_lines(text)
    config = no_snippets(max_prompt_tokens=1536)
    # Typing on one line: the prompt's beginning doesn't move at all.
    starts = set()
    for character in range(len(lines[1001]) + 1):
        prompt = build_prompt(text, 1001, character, "python", [], QWEN, utf8_count, config)
        starts.add(prompt.prefix_start_line)
    assert len(starts) == 1
    # Moving down 64 lines: the start moves in a few coarse jumps, not on every line.
    starts_by_line = [
        build_prompt(text, line, 0, "python", [], QWEN, utf8_count, config).prefix_start_line
        for line in range(1000, 1064)
    ]
    changes = sum(1 for a, b in zip(starts_by_line, starts_by_line[1:], strict=False) if a != b)
    assert changes <= 64 // 4
    assert starts_by_line == sorted(starts_by_line)


def test_suffix_share_splits_the_file_budget():
    text = functions(400)
    config = no_snippets(max_prompt_tokens=2000, suffix_share=0.25)
    prompt = build_prompt(text, 800, 0, "python", [], QWEN, utf8_count, config)
    suffix_tokens = utf8_count(prompt.suffix)
    prefix_tokens = utf8_count(prompt.prefix)
    assert suffix_tokens <= 0.25 * 2000
    assert suffix_tokens >= 0.25 * 2000 * 0.6  # trimmed at a boundary, but mostly used
    assert prefix_tokens > 2 * suffix_tokens


def test_a_short_suffix_leaves_its_share_to_the_prefix():
    text = functions(400) + "print('done')\n"
    lines, _ = split_lines(text)
    config = no_snippets(max_prompt_tokens=2000, suffix_share=0.5)
    prompt = build_prompt(text, len(lines) - 2, 0, "python", [], QWEN, utf8_count, config)
    assert not prompt.suffix_truncated
    assert utf8_count(prompt.prefix) > 0.75 * 2000


def test_a_short_prefix_leaves_its_share_to_the_suffix():
    text = "import os\n" + functions(400)
    config = no_snippets(max_prompt_tokens=2000, suffix_share=0.25)
    prompt = build_prompt(text, 1, 0, "python", [], QWEN, utf8_count, config)
    assert not prompt.prefix_truncated
    assert utf8_count(prompt.suffix) > 0.75 * 2000


def test_a_very_long_line_is_cut_inside_the_line():
    text = "x = [" + ", ".join(str(i) for i in range(5000)) + "]\n"
    character = len(text) // 2
    config = no_snippets(max_prompt_tokens=200)
    prompt = build_prompt(text, 0, character, "python", [], QWEN, utf8_count, config)
    assert prompt.prompt_tokens <= 200
    assert text[:character].endswith(prompt.prefix) and prompt.prefix
    assert text[character:].startswith(prompt.suffix) and prompt.suffix


def test_a_very_long_line_fits_in_the_append_layout_too():
    """Text from the anchor to the cursor goes whole after the middle marker in the append
    layout: one huge line would not fit, so that request is laid out as classic."""
    text = "x = [" + ", ".join(str(i) for i in range(5000)) + "]\n"
    config = ContextConfig(layout="append", snippet_share=0.0, max_prompt_tokens=200)
    prompt = build_prompt(text, 0, len(text) // 2, "python", [], QWEN, utf8_count, config)
    assert prompt.prompt_tokens <= 200 and prompt.layout == "classic"
    short = build_prompt("x = [1, 2, ", 0, 11, "python", [], QWEN, utf8_count, config)
    assert short.layout == "append"


def test_unknown_language_is_plain_text_with_paragraph_boundaries():
    paragraphs = "".join(f"Paragraph {i} line one.\nline two of {i}.\n\n" for i in range(300))
    config = no_snippets(max_prompt_tokens=600)
    prompt = build_prompt(paragraphs, 501, 3, "cobol", [], QWEN, utf8_count, config)
    assert prompt.language is None
    assert prompt.prompt_tokens <= 600
    assert prompt.prefix.startswith("Paragraph ")


def test_snippets_from_other_documents_within_their_share():
    other = "def invoice_total(invoice_items):\n    return sum(invoice_items)\n" + functions(200)
    docs = [
        {"uri": "file:///proj/billing.py", "text": other, "language_id": "python"},
        {"uri": "file:///proj/main.py", "text": "ignored: this is the current file"},
    ]
    text = functions(5) + "items = load()\ntotal = invoice_total(invoice_items)\n"
    config = classic(max_prompt_tokens=1500, snippet_share=0.3, max_snippets=2)
    prompt = build_prompt(
        text,
        21,
        0,
        "python",
        docs,
        QWEN,
        utf8_count,
        config,
        path="/proj/main.py",
        repo_name="proj",
    )
    assert prompt.snippets and len(prompt.snippets) <= 2
    assert all(s.path == "billing.py" for s in prompt.snippets)
    assert "invoice_total" in prompt.snippets[0].text
    assert prompt.text.startswith("<|repo_name|>proj\n<|file_sep|>billing.py\n")
    assert "<|file_sep|>main.py\n<|fim_prefix|>" in prompt.text
    snippet_part = prompt.text.split("<|file_sep|>main.py")[0].removeprefix("<|repo_name|>proj\n")
    assert utf8_count(snippet_part) <= 0.3 * 1500
    assert prompt.prompt_tokens <= 1500


def test_typing_on_a_line_keeps_the_prompt_start_identical():
    other = "".join(
        f"def invoice_{i}(invoice_items):\n    return sum(invoice_items) * {i}\n\n"
        for i in range(50)
    )
    docs = [{"uri": "file:///proj/billing.py", "text": other}]
    head = functions(300) + "invoice_items = load()\nfirst = invoice_1(invoice_items)\n"
    typed = "total = invoice_3(items) + invoice_7(items)"
    config = classic(max_prompt_tokens=1500, snippet_share=0.3)
    previous = None
    for n in range(len(typed) + 1):
        text = head + typed[:n] + "\n"
        prompt = build_prompt(
            text, 1202, n, "python", docs, QWEN, utf8_count, config, path="/proj/m.py"
        )
        assert prompt.snippets
        before_cursor = prompt.text.split("<|fim_suffix|>")[0]
        if previous is not None:
            assert before_cursor.startswith(previous)  # only grows: the KV cache stays valid
        previous = before_cursor


def test_no_snippets_when_their_share_is_zero():
    docs = [{"path": "/p/other.py", "text": "def invoice_total(x):\n    return x\n"}]
    text = "total = invoice_total(1)\n"
    prompt = build_prompt(text, 1, 0, "python", docs, QWEN, utf8_count, classic(snippet_share=0))
    assert prompt.snippets == []
    assert prompt.text.startswith("<|fim_prefix|>")


@pytest.mark.parametrize("family", ["deepseek-coder", "starcoder2", "codellama"])
def test_other_families_render_through_build_prompt(family):
    template = get_fim_template(family)
    prompt = build_prompt("a = 1\nb = ", 1, 4, "python", [], template, utf8_count, classic())
    assert prompt.text == template.render("a = 1\nb = ", "")

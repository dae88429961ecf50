"""The pinned layout (context/prompt.py): the file's top stays in place whatever the cursor does,
and only a short window above the anchor, the suffix and the middle move with it."""

import pytest

from quickdraft.config import ContextConfig
from quickdraft.context import build_prompt, get_fim_template

QWEN = get_fim_template("qwen2.5-coder")


@pytest.fixture(scope="module")
def count():
    """About a real code tokenizer's rate (the tiny test tokenizer spells code nearly letter by
    letter, so a 16-line middle alone would overflow the moving part)."""
    return lambda text: (len(text) + 3) // 4


def module(functions: int) -> str:
    header = "import os\nimport sys\n\nLIMIT = 10\n\n\n"
    body = "".join(
        f"def func_{i}(value):\n    result = value + {i}\n    return result\n\n"
        for i in range(functions)
    )
    return header + body


def pinned(**kw) -> ContextConfig:
    return ContextConfig(
        **{"layout": "pinned", "snippet_share": 0.0, "max_prompt_tokens": 1536, **kw}
    )


def prompt_at(text: str, line: int, count, config: ContextConfig | None = None):
    return build_prompt(text, line, 4, "python", [], QWEN, count, config or pinned())


def part(prompt, role: str) -> str:
    return "".join(p.text for p in prompt.parts if p.role == role)


def test_the_top_is_the_same_wherever_the_cursor_is_below_it(count):
    text = module(200)
    prompts = [prompt_at(text, line, count) for line in (400, 430, 462, 600, 790)]
    tops = {p.top for p in prompts}
    assert len(tops) == 1
    top = tops.pop()
    assert text.startswith(top) and top.startswith("import os\n")
    assert all(p.layout == "pinned" and p.prefix_start_line == 0 for p in prompts)
    # The top is a part of its own, right after the prefix marker, so its tokens do not depend
    # on what follows it.
    for p in prompts:
        roles = [x.role for x in p.parts]
        assert roles[roles.index("top") - 1] == "marker"
        assert p.parts[roles.index("top") - 1].text == QWEN.fim_prefix
        assert p.prompt_tokens <= 1536
        assert p.prefix.startswith(top)
        assert p.prefix_truncated  # the lines between the top and the window are left out


def test_a_move_changes_only_the_part_near_the_cursor(count):
    text = module(200)
    config = pinned()
    before, after = prompt_at(text, 300, count, config), prompt_at(text, 330, count, config)
    moving = sum(count(x.text) for x in after.parts if x.role in ("prefix", "suffix", "middle"))
    assert after.top == before.top
    # near_share of the budget, give or take the middle's steps: the rest stays in place
    assert moving <= 1536 * config.near_share + 64
    assert count(after.top) >= 600 - 1536 * config.near_share - 64
    # the append layout moves its whole prefix instead
    append = ContextConfig(layout="append", snippet_share=0.0, max_prompt_tokens=1536)
    a, b = prompt_at(text, 300, count, append), prompt_at(text, 330, count, append)
    assert a.prefix_start_line != b.prefix_start_line and not a.top and not b.top


def test_typing_only_appends_in_the_pinned_layout(count):
    text = module(200)
    lines = text.split("\n")
    first = prompt_at(text, 322, count)
    lines[322] = lines[322][:4] + "res" + lines[322][4:]
    typed = build_prompt("\n".join(lines), 322, 7, "python", [], QWEN, count, pinned())
    assert typed.top == first.top
    assert part(typed, "prefix") == part(first, "prefix")
    assert typed.middle.startswith(first.middle) and typed.middle.endswith("res")


def test_a_cursor_near_the_top_joins_top_and_window_into_one_run(count):
    text = module(200)
    top_end = prompt_at(text, 790, count).top.count("\n")
    # inside the top, and just below it where the window above the anchor reaches into it
    for line in (20, 40, 70, top_end + 9, top_end + 10):
        prompt = prompt_at(text, line, count)
        assert text.startswith(prompt.top + part(prompt, "prefix") + prompt.middle), line
        assert not prompt.prefix_truncated
        assert prompt.top and prompt.prompt_tokens <= 1536
    assert part(prompt_at(text, top_end + 10, count), "prefix")
    # a cursor on the first lines has nothing above its anchor to pin
    first = prompt_at(text, 3, count)
    assert first.top == "" and first.prefix_start_line == 0


def test_the_top_ends_at_the_anchor_when_the_cursor_is_inside_it(count):
    text = module(200)
    far = prompt_at(text, 500, count)
    near = prompt_at(text, 34, count)  # anchor 32, inside the far prompt's top
    assert near.anchor_line == 32
    assert near.top == "".join(text.splitlines(keepends=True)[:32])
    assert far.top.startswith(near.top)


def test_a_short_file_is_one_run_of_lines(count):
    text = module(3)
    prompt = prompt_at(text, 10, count)
    assert text.startswith(prompt.prefix)
    assert prompt.prefix + prompt.suffix == text.replace(text.split("\n")[10][4:], "", 1) or (
        prompt.prefix.endswith(text.split("\n")[10][:4])
    )
    assert not prompt.prefix_truncated and not prompt.suffix_truncated


def test_a_huge_middle_falls_back_to_the_classic_layout(count):
    text = module(100) + "x = [" + ", ".join(str(i) for i in range(3000)) + "]\n"
    last = text.count("\n") - 1
    prompt = build_prompt(text, last, 6000, "python", [], QWEN, count, pinned())
    assert prompt.layout == "classic" and prompt.top == ""
    assert prompt.prompt_tokens <= 1536


def test_the_whole_prompt_stays_in_budget_with_a_head(count):
    text = module(200)
    others = [
        {"path": f"/w/other_{i}.py", "text": module(30), "language_id": "python"} for i in range(4)
    ]
    for line in (7, 40, 300, 790):
        prompt = build_prompt(
            text,
            line,
            4,
            "python",
            others,
            QWEN,
            count,
            ContextConfig(layout="pinned", max_prompt_tokens=1536),
            path="/w/main.py",
        )
        assert prompt.prompt_tokens <= 1536
        assert sum(count(p.text) for p in prompt.parts) == prompt.prompt_tokens


# --- with the pipeline: what a visit and a move compute ----------------------------------------

BODY = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(300))


@pytest.fixture(scope="module")
def models():
    from quickdraft.testing import build_tiny_loaded_models

    return build_tiny_loaded_models()


def test_after_the_file_level_warm_up_a_visit_and_a_move_compute_only_the_window(models):
    from quickdraft.config import load_config
    from quickdraft.generation import CompletionRequest
    from quickdraft.testing import local_completer

    # The tiny tokenizer spells code nearly letter by letter: a budget of 4096 of its tokens
    # holds about what 1536 of a real one do.
    settings = {
        "decoding": {"max_new_tokens": 2, "strategy": "ar"},
        "context": {"layout": "pinned", "max_prompt_tokens": 4096},
    }
    completer = local_completer(models, load_config(settings))
    uri = "file:///work/long.py"
    completer.set_document(uri, BODY, "python")
    warmed = completer.warm(CompletionRequest(uri, BODY, 0, 0, "python"), file_level=True)
    assert warmed > 2000  # the header and the pinned top
    line = 3 * 200 + 1  # "    return x + 200", far below the top
    visit = completer.complete(CompletionRequest(uri, BODY, line, 4, "python"))
    assert visit.stats.reused_tokens >= warmed
    assert visit.stats.prefill_tokens <= 0.25 * visit.stats.prompt_tokens
    moved = completer.complete(CompletionRequest(uri, BODY, line + 30, 4, "python"))
    assert moved.stats.prefill_tokens <= 0.25 * moved.stats.prompt_tokens
    assert moved.stats.reused_tokens >= warmed


def test_every_documents_pinned_prompt_starts_with_the_same_head(models):
    from quickdraft.config import load_config
    from quickdraft.decoding.runner import common_prefix_length
    from quickdraft.generation import CompletionRequest
    from quickdraft.testing import local_completer

    settings = {"context": {"layout": "pinned", "max_prompt_tokens": 4096, "snippet_lines": 3}}
    completer = local_completer(models, load_config(settings))
    uris = [f"file:///work/m{i}.py" for i in range(3)]
    texts = [BODY.replace("f_", f"g{i}_") for i in range(3)]
    for uri, text in zip(uris, texts, strict=True):
        completer.set_document(uri, text, "python")
    line = 3 * 200 + 1
    prompts = [
        completer.prepare(CompletionRequest(uri, text, line, 4, "python"))
        for uri, text in zip(uris, texts, strict=True)
    ]
    # Each file's own chunk (its first 3 lines) stays in the head, so the heads are one; the
    # file's top starts after it, and no line is shown twice.
    assert all([s.path for s in p.prompt.snippets] == ["m0.py", "m1.py", "m2.py"] for p in prompts)
    for p, uri, text in zip(prompts, uris, texts, strict=True):
        lines = text.splitlines(keepends=True)
        end = completer.head.chunk_of(uri).end_line  # 2: the blank third line is trimmed
        assert end == 2 and p.prompt.prefix_start_line == end
        assert p.prompt.top.startswith("".join(lines[end : end + 3]))
        assert "".join(lines[:end]).strip() not in p.prompt.top
    head = completer.file_level_tokens(prompts[0].prompt)
    header = len(completer.prompts.cache.ids("<|file_sep|>m0.py\n")) + len(
        completer.prompts.cache.ids(prompts[0].prompt.top)
    )
    common = common_prefix_length(prompts[0].prompt_ids, prompts[1].prompt_ids)
    assert head - header - 1 <= common < head
    # A cursor among the chunk's lines: the chunk leaves the head (the text shows them).
    near = completer.prepare(CompletionRequest(uris[0], texts[0], 1, 4, "python"))
    assert [s.path for s in near.prompt.snippets] == ["m1.py", "m2.py"]

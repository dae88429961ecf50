"""Token healing: the constraint's rules, and the engine's output under it (every strategy
equal to plain decoding, the owed bytes spelled first)."""

from __future__ import annotations

import pytest
import torch

from quickdraft.decoding import Engine, GenerationRequest
from quickdraft.decoding.healing import TokenBytes, constrain
from quickdraft.testing import build_tiny_model, build_tiny_tokenizer
from quickdraft.tokens import PromptTokenizer, spelled, token_byte_table

WORDS = [b"a", b"ar", b"arg", b"args", b"rgs", b"r", b"gs", b"s", b" ", b" x", b"x", b"("]


def table(vocab: int) -> TokenBytes:
    """A vocabulary where ids 0..11 spell WORDS, 12 is special, the rest single letters."""
    spellings: list[bytes | None] = list(WORDS) + [None]
    spellings += [bytes([ord("b") + i % 20]) for i in range(vocab - len(spellings))]
    return TokenBytes(spellings, vocab)


def test_allowed_tokens_start_with_the_owed_bytes_or_are_a_start_of_them():
    tb = table(40)
    allowed = {tb.token_bytes[i] for i in tb.allowed_ids(b"ar")}
    assert allowed == {b"ar", b"arg", b"args", b"a"}
    assert {tb.token_bytes[i] for i in tb.allowed_ids(b"rgs")} == {b"rgs", b"r"}
    assert tb.mask(b"ar")[12].item() is False  # special tokens never
    assert tb.advance(b"ar", WORDS.index(b"a")) == b"r"
    assert tb.advance(b"ar", WORDS.index(b"args")) == b""
    assert tb.advance(b"r", WORDS.index(b"rgs")) == b""


def test_verify_rows_follow_the_drafted_path():
    tb = table(40)
    logits = torch.zeros(3, 40)
    drafts = [WORDS.index(b"a"), WORDS.index(b"r")]
    masked = constrain(logits, tb, b"arg", drafts)
    assert torch.isfinite(masked[0]).sum() == len(tb.allowed_ids(b"arg"))
    # after "a", "rg" is owed; after "a" "r", "g" is owed; the row beyond is free again only
    # once nothing is owed.
    assert set(torch.isfinite(masked[1]).nonzero().flatten().tolist()) == set(tb.allowed_ids(b"rg"))
    assert set(torch.isfinite(masked[2]).nonzero().flatten().tolist()) == set(tb.allowed_ids(b"g"))


@pytest.fixture(scope="module")
def engine():
    tokenizer = build_tiny_tokenizer()
    vocab = len(tokenizer)
    target = build_tiny_model(vocab, seed=0)
    draft = build_tiny_model(vocab, seed=1, layers=1)
    engine = Engine(target, draft, stop_token_ids=[tokenizer.eos_token_id])
    engine.token_bytes = TokenBytes(token_byte_table(tokenizer), vocab)
    return engine, tokenizer


@pytest.mark.parametrize("owed", [b"x", b"ret", b"\n    "])
def test_every_strategy_writes_the_owed_bytes_first_and_equals_plain_decoding(engine, owed):
    engine, tokenizer = engine
    prompt = tokenizer.encode("def f(x):\n    return x\n\ndef g(y):\n    return y\n\n" * 3)
    outputs = {}
    for strategy in ("ar", "ngram", "draft", "hybrid"):
        engine.reset_cache()
        result = engine.generate(
            GenerationRequest(
                prompt,
                max_new_tokens=12,
                strategy=strategy,
                draft_length=3 if strategy != "ar" else None,
                required_prefix=owed,
                anchored_draft=tokenizer.encode(owed.decode()),
            )
        )
        outputs[strategy] = result.tokens
        assert spelled(engine.token_bytes.token_bytes, result.tokens).startswith(owed), strategy
    for strategy, tokens in outputs.items():
        assert tokens == outputs["ar"], strategy


def test_the_prompt_tokenizer_backs_off_to_a_character_boundary():
    tokenizer = build_tiny_tokenizer()
    from quickdraft.context.fim import get_fim_template

    prompts = PromptTokenizer(tokenizer, get_fim_template("qwen2.5-coder"))
    assert prompts.parts_ok
    assert prompts.split_last_token("x = 中") == ("x = ", "中")  # 3 byte tokens, one character
    assert prompts.split_last_token("ab") == ("a", "b")
    table_bytes = token_byte_table(tokenizer)
    assert table_bytes[tokenizer.convert_tokens_to_ids("<|endoftext|>")] is None
    assert spelled(table_bytes, tokenizer.encode("héllo\n")) == "héllo\n".encode()

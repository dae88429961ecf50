"""Tokenizers: loading one per model, checking that target and draft share one, and what a
tokenizer says of its model (its FIM family, its stop tokens)."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from quickdraft.errors import ModelError, TokenizerMismatchError
from quickdraft.models import convert, store
from quickdraft.models.presets import STOP_TOKENS
from quickdraft.models.references import ResolvedModel


def load_tokenizer(resolved: ResolvedModel):
    """The tokenizer of `resolved` (written from its GGUF first, when that is all it has)."""

    if resolved.gguf is not None and not store.is_complete(resolved.path):
        convert.ensure_tokenizer(resolved.gguf, resolved.path)
    try:
        return AutoTokenizer.from_pretrained(resolved.path)
    except Exception as exc:
        raise ModelError(
            f"cannot load the tokenizer of {resolved.reference} from {resolved.path}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


_PROBES = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "function add(a, b) { return a + b; }  // JS\nconst x = `tmpl ${a}`;\n",
    'fn main() {\n\tlet v: Vec<u8> = vec![1, 2, 3];\n\tprintln!("{:?}", v);\n}\n',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); }\n',
    "    \t  \n\n\n  trailing   spaces  ",
    "Unicode: é ü ß 漢字 😀 — ∑",
]


def check_tokenizers(
    target_tokenizer,
    draft_tokenizer,
    shared_vocab_size: int,
    *,
    target_name: str = "target",
    draft_name: str = "draft",
    extra_tokens: tuple[str, ...] = (),
) -> None:
    """Raise TokenizerMismatchError unless both tokenizers agree on ids below the shared size.

    Below `shared_vocab_size`, every id both vocabularies define must be the same token, and
    every token both define must have the same id. An id only one side defines (padding
    entries, a few extra special tokens) is allowed: the target rejects a draft token it does
    not know like any other wrong guess. Then the encodings of probe strings (code in several
    languages, whitespace, Unicode, the family's special tokens) must be identical.
    """
    tv = {t: i for t, i in target_tokenizer.get_vocab().items() if i < shared_vocab_size}
    dv = {t: i for t, i in draft_tokenizer.get_vocab().items() if i < shared_vocab_size}
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    conflicts = sorted(i for i in t_by_id.keys() & d_by_id.keys() if t_by_id[i] != d_by_id[i])
    moved = sorted((tv[t], t) for t in tv.keys() & dv.keys() if tv[t] != dv[t])
    smaller = min(len(tv), len(dv))
    overlap = len(tv.keys() & dv.keys())
    if conflicts or moved or overlap < 0.99 * smaller:
        if conflicts:
            idx = conflicts[0]
            example = (
                f"; e.g. id {idx} is {t_by_id[idx]!r} in {target_name} "
                f"but {d_by_id[idx]!r} in {draft_name}"
            )
        elif moved:
            idx, tok = moved[0]
            example = f"; e.g. {tok!r} is id {idx} in {target_name} but {dv[tok]} in {draft_name}"
        else:
            example = f"; they share only {overlap:,} of {smaller:,} tokens"
        raise TokenizerMismatchError(
            f"{target_name} and {draft_name} do not share a tokenizer: "
            f"{max(len(conflicts), len(moved)):,} of the first {shared_vocab_size:,} ids differ"
            f"{example}. Pick a draft of the same model family (see `quickdraft models list`)"
        )
    probes = list(_PROBES) + ["".join(f"x{tok}y" for tok in extra_tokens)]
    for probe in probes:
        a = target_tokenizer.encode(probe, add_special_tokens=False)
        b = draft_tokenizer.encode(probe, add_special_tokens=False)
        if a != b:
            raise TokenizerMismatchError(
                f"{target_name} and {draft_name} tokenize text differently (probe {probe[:30]!r}: "
                f"{a[:8]} vs {b[:8]}). Pick a draft of the same model family"
            )
        high = [i for i in a if i >= shared_vocab_size]
        if high:
            raise TokenizerMismatchError(
                f"{target_name} encodes ordinary text to ids {high[:4]} beyond the {draft_name}'s "
                f"{shared_vocab_size:,}-row embedding"
            )


def detect_family(tokenizer, model_type: str | None) -> str | None:
    vocab = tokenizer.get_vocab()
    if "<|fim_prefix|>" in vocab:
        return "qwen2.5-coder"
    if "<fim_prefix>" in vocab:
        return "starcoder2"
    if "<｜fim▁begin｜>" in vocab:
        return "deepseek-coder"
    if "▁<PRE>" in vocab or model_type == "llama" and "<s>" in vocab:
        return "codellama"
    return None


def stop_token_ids_for(tokenizer, family: str, models: list[Any]) -> tuple[set[int], list[str]]:
    """EOS ids (tokenizer, configs, generation configs) and the family's stop tokens in vocab."""
    vocab = tokenizer.get_vocab()
    ids: set[int] = set()
    names: list[str] = []
    for token in STOP_TOKENS.get(family, ()):
        if token in vocab:
            ids.add(vocab[token])
            names.append(token)

    def add(value):
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple, set)) else [value]:
            if isinstance(v, int) and v >= 0:
                ids.add(v)

    add(tokenizer.eos_token_id)
    for model in models:
        if model is None:
            continue
        add(getattr(model.config, "eos_token_id", None))
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            add(getattr(gen, "eos_token_id", None))
    id_to_token = {i: t for t, i in vocab.items()}
    for i in sorted(ids):
        token = id_to_token.get(i)
        if token is not None and token not in names:
            names.append(token)
    return ids, names

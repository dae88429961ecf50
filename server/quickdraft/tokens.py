"""Prompts into tokens: once per request, part by part, with token healing at the cursor.

A prompt is markers and text sections (context.fim.PromptPart). The model's tokenizer splits
text at its special tokens before anything else, so a prompt's tokens are its parts' tokens
joined: each part is tokenized once and remembered (`TokenCache`), and a keystroke that changes
only the middle re-tokenizes only the middle. Whether this holds for a tokenizer is checked
once (`PromptTokenizer.parts_ok`); where it does not (a format whose markers are not single
special tokens), the whole prompt is tokenized instead, still once.

Token healing (append layout): the middle's last token is taken off the prompt, down to a
character boundary, and its characters become `required`, the bytes the first generated tokens
must spell (decoding.healing). A character typed onto the last word then changes only that
last token, and the model writes whole tokens as it learned them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quickdraft.context.fim import FimTemplate, PromptPart
from quickdraft.context.prompt import Prompt


class TokenCache:
    """`encode(text)` remembered per text (bounded, least recently used out), with a count of
    the characters actually tokenized, which tests use to count work."""

    def __init__(self, encode: Callable[[str], list[int]], size: int = 20000):
        self.encode = encode
        self.size = size
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.encoded_chars = 0

    def ids(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        found = self._ids.get(text)
        if found is not None:
            self._ids.move_to_end(text)
            return found
        self.encoded_chars += len(text)
        found = tuple(self.encode(text))
        self._ids[text] = found
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
        return found

    def count(self, text: str) -> int:
        return len(self.ids(text))


@dataclass
class PromptTokens:
    """A prompt as the engine gets it."""

    ids: list[int]
    """The prompt's tokens (healed: the middle's last token taken off)."""
    before_cursor: list[int]
    """The tokens of the document text before the cursor that are in the prompt (the prefix
    section, then the middle): what the new tokens continue, for n-gram lookups."""
    after_cursor: list[int]
    """The suffix section's tokens."""
    healed: str = ""
    """The characters taken off the end of the prompt, which generation must write first."""


class PromptTokenizer:
    """Tokenizes prompts for one tokenizer and FIM template."""

    def __init__(self, tokenizer, template: FimTemplate, cache: TokenCache | None = None):
        self.tokenizer = tokenizer
        self.template = template
        self.cache = cache or TokenCache(self._encode)
        self.parts_ok = self._parts_tokenize_apart()

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _parts_tokenize_apart(self) -> bool:
        """Whether joining the parts' tokens gives the whole prompt's tokens, for this
        tokenizer and format (checked on a probe prompt with every kind of part)."""
        parts = self.template.render_parts(
            "import os\n\ndef main(argv):\n    ",
            "\n    return 0\n",
            [("src/util.py", "def helper(x):\n    return x * 2")],
            None,
            "src/main.py",
            "python",
            "    args = ",
        )
        joined = [i for part in parts for i in self._encode(part.text)]
        return joined == self._encode("".join(part.text for part in parts))

    def tokenize(self, prompt: Prompt, *, heal: bool) -> PromptTokens:
        parts = prompt.parts or [PromptPart(prompt.text, "prefix")]
        healed = ""
        middle = parts[-1].text if parts and parts[-1].role == "middle" else ""
        if heal and middle:
            middle, healed = self.split_last_token(middle)
            parts = [*parts[:-1], PromptPart(middle, "middle")] if middle else parts[:-1]
        if self.parts_ok:
            pieces = [(part.role, list(self.cache.ids(part.text))) for part in parts]
            ids = [i for _, part_ids in pieces for i in part_ids]
        else:
            ids = list(self.cache.ids("".join(part.text for part in parts)))
            pieces = [(part.role, list(self.cache.ids(part.text))) for part in parts]
        before = [
            i for role, part_ids in pieces if role in ("top", "prefix", "middle") for i in part_ids
        ]
        after = [i for role, part_ids in pieces if role == "suffix" for i in part_ids]
        return PromptTokens(ids=ids, before_cursor=before, after_cursor=after, healed=healed)

    def split_last_token(self, text: str) -> tuple[str, str]:
        """(text without its last token, that token's characters), cut at a character
        boundary: a character the tokenizer spells in several tokens goes whole."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
        if not offsets:
            return text, ""
        start = offsets[-1][0]
        return text[:start], text[start:]

    def token_bytes(self) -> list[bytes | None]:
        """What every token id spells (for decoding.healing.TokenBytes)."""
        return token_byte_table(self.tokenizer)


def token_byte_table(tokenizer) -> list[bytes | None]:
    """The bytes of every token of a Hugging Face tokenizer (None for special tokens).

    Byte-level BPE vocabularies (GPT-2, Qwen, StarCoder, DeepSeek) spell bytes with printable
    stand-ins; SentencePiece ones (CodeLlama) use `▁` for a space and `<0xNN>` for raw bytes.
    """
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1 if vocab else 0
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    for index, token in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(token, "special", False):
            special.add(index)
    byte_decoder = _byte_stand_ins()
    stand_ins = sum(1 for token in vocab if token.startswith("Ġ"))
    byte_level = stand_ins > 0
    table: list[bytes | None] = [None] * size
    for token, index in vocab.items():
        if index in special:
            continue
        if byte_level and all(ch in byte_decoder for ch in token):
            table[index] = bytes(byte_decoder[ch] for ch in token)
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            table[index] = bytes([int(token[3:5], 16)])
        else:
            table[index] = token.replace("▁", " ").encode("utf-8")
    return table


def _byte_stand_ins() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character each byte is written as -> the
    byte. Printable Latin-1 bytes stand for themselves; the rest get characters from 256 on."""
    kept = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(kept)
    extra = 0
    for byte in range(256):
        if byte not in kept:
            kept.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(kept, chars, strict=True)}


def spelled(table: Sequence[bytes | None], ids: Sequence[int]) -> bytes:
    """The bytes a run of tokens spells."""
    return b"".join(table[i] or b"" for i in ids if i < len(table))

"""Fill-in-the-middle prompt formats, one per model family.

Every template lays the prompt out prefix-first (PSM): other files and the text before the
cursor come first, so consecutive requests in one document share a long token prefix that the
engine's KV cache can reuse.

Formats (from each family's model card / paper):

* qwen2.5-coder: `<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>`; with other files,
  the repository format `<|repo_name|>{repo}\\n<|file_sep|>{path}\\n{content}\\n ...
  <|file_sep|>{current path}\\n<|fim_prefix|>...`.
* starcoder2: `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>`; with other files,
  `<repo_name>{repo}<file_sep>{path}\\n{content}...<file_sep><fim_prefix>{current path}\\n{prefix}...`.
* deepseek-coder: `<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>` (fullwidth bars); it has
  no file separator token, so other files go at the top of the prefix, each under a comment
  with its path, the way its repository-level examples lay files out.
* codellama: `<PRE> {prefix} <SUF>{suffix} <MID>`, other files as in deepseek-coder.

Special-token strings that occur inside document text are defused (a zero-width space after the
first character) so a file that mentions `<|endoftext|>` cannot end the prompt early.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from quickdraft.errors import ConfigError

_ZWSP = "\u200b"

# languageIds whose line comments start with "#"; everything else gets "//".
_HASH_COMMENT_LANGUAGES = frozenset(
    {
        "python",
        "ruby",
        "shellscript",
        "perl",
        "r",
        "yaml",
        "toml",
        "dockerfile",
        "makefile",
        "powershell",
    }
)


def _snippet_fields(snippet: Any) -> tuple[str, str]:
    """(path, text) of a snippet given as an object, a dict or a (path, text) pair."""
    if isinstance(snippet, tuple):
        return str(snippet[0]), str(snippet[1])
    if isinstance(snippet, dict):
        return str(snippet.get("path") or snippet.get("uri") or ""), str(snippet.get("text", ""))
    return str(getattr(snippet, "path", "") or ""), str(getattr(snippet, "text", ""))


def comment_prefix(language_id: str | None) -> str:
    """The line-comment marker used to label other files in formats without file tokens."""
    return "#" if (language_id or "").lower() in _HASH_COMMENT_LANGUAGES else "//"


@dataclass(frozen=True)
class FimTemplate:
    """How one model family wants a fill-in-the-middle prompt laid out."""

    family: str
    fim_prefix: str
    fim_suffix: str
    fim_middle: str
    stop_tokens: tuple[str, ...]
    """Strings that end a completion (the engine maps them to token ids)."""
    file_sep: str | None = None
    repo_name: str | None = None

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """Every marker this format uses; defused when found inside document text."""
        tokens = {self.fim_prefix.strip(), self.fim_suffix.strip(), self.fim_middle.strip()}
        tokens.update(t for t in (self.file_sep, self.repo_name) if t)
        tokens.update(self.stop_tokens)
        return tuple(sorted(tokens, key=len, reverse=True))

    def sanitize(self, text: str) -> str:
        """`text` with any special-token string broken up, so it tokenizes as plain text."""
        if "<" not in text:
            return text
        for token in self.special_tokens:
            if token in text:
                text = text.replace(token, token[0] + _ZWSP + token[1:])
        return text

    # -- pieces ---------------------------------------------------------------------------

    def render_snippet(self, path: str, text: str, language_id: str | None = None) -> str:
        """One other file's block, as it appears ahead of the current file."""
        text = self.sanitize(text)
        if self.family == "qwen2.5-coder":
            return f"{self.file_sep}{path}\n{text}\n"
        if self.family == "starcoder2":
            return f"{self.file_sep}{path}\n{text}\n"
        marker = comment_prefix(language_id)
        return f"{marker} {path}\n{text}\n\n"

    def render(
        self,
        prefix: str,
        suffix: str,
        snippets: Iterable[Any] = (),
        repo_name: str | None = None,
        path: str | None = None,
        language_id: str | None = None,
    ) -> str:
        """The whole prompt: other files (`snippets`: objects/dicts with path and text, or
        (path, text) pairs), then the current file's prefix, the hole, and the suffix."""
        blocks = [self.render_snippet(*_snippet_fields(s), language_id) for s in snippets]
        prefix = self.sanitize(prefix)
        suffix = self.sanitize(suffix)
        repo = self.sanitize(repo_name) if repo_name else None
        current = self.sanitize(path) if path else "untitled"
        if self.family == "qwen2.5-coder":
            if not blocks and repo is None:
                return f"{self.fim_prefix}{prefix}{self.fim_suffix}{suffix}{self.fim_middle}"
            head = f"{self.repo_name}{repo}\n" if repo is not None else ""
            return (
                f"{head}{''.join(blocks)}{self.file_sep}{current}\n"
                f"{self.fim_prefix}{prefix}{self.fim_suffix}{suffix}{self.fim_middle}"
            )
        if self.family == "starcoder2":
            if not blocks and repo is None:
                return f"{self.fim_prefix}{prefix}{self.fim_suffix}{suffix}{self.fim_middle}"
            head = f"{self.repo_name}{repo}" if repo is not None else ""
            return (
                f"{head}{''.join(blocks)}{self.file_sep}"
                f"{self.fim_prefix}{current}\n{prefix}{self.fim_suffix}{suffix}{self.fim_middle}"
            )
        # deepseek-coder, codellama: other files lead the prefix, labelled by comments.
        context = ""
        if blocks:
            marker = comment_prefix(language_id)
            context = "".join(blocks) + f"{marker} {current}\n"
        return f"{self.fim_prefix}{context}{prefix}{self.fim_suffix}{suffix}{self.fim_middle}"


_QWEN_STOPS = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<|im_start|>",
    "<|im_end|>",
)

TEMPLATES: dict[str, FimTemplate] = {
    "qwen2.5-coder": FimTemplate(
        family="qwen2.5-coder",
        fim_prefix="<|fim_prefix|>",
        fim_suffix="<|fim_suffix|>",
        fim_middle="<|fim_middle|>",
        file_sep="<|file_sep|>",
        repo_name="<|repo_name|>",
        stop_tokens=_QWEN_STOPS,
    ),
    "deepseek-coder": FimTemplate(
        family="deepseek-coder",
        fim_prefix="<｜fim▁begin｜>",
        fim_suffix="<｜fim▁hole｜>",
        fim_middle="<｜fim▁end｜>",
        stop_tokens=(
            "<｜end▁of▁sentence｜>",
            "<｜fim▁begin｜>",
            "<｜fim▁hole｜>",
            "<｜fim▁end｜>",
            "<|EOT|>",
        ),
    ),
    "starcoder2": FimTemplate(
        family="starcoder2",
        fim_prefix="<fim_prefix>",
        fim_suffix="<fim_suffix>",
        fim_middle="<fim_middle>",
        file_sep="<file_sep>",
        repo_name="<repo_name>",
        stop_tokens=(
            "<|endoftext|>",
            "<fim_prefix>",
            "<fim_suffix>",
            "<fim_middle>",
            "<fim_pad>",
            "<file_sep>",
            "<repo_name>",
        ),
    ),
    "codellama": FimTemplate(
        family="codellama",
        fim_prefix="<PRE> ",
        fim_suffix=" <SUF>",
        fim_middle=" <MID>",
        stop_tokens=("<EOT>", "</s>", "<PRE>", "<SUF>", "<MID>"),
    ),
}

FIM_FAMILIES: tuple[str, ...] = tuple(TEMPLATES)


def get_fim_template(family: str) -> FimTemplate:
    """The template for a model family; ConfigError naming the known families otherwise."""
    template = TEMPLATES.get((family or "").strip().lower())
    if template is None:
        raise ConfigError(
            f"unknown model family {family!r} for fill-in-the-middle prompts "
            f"(known: {', '.join(FIM_FAMILIES)})"
        )
    return template

"""Fill-in-the-middle prompt formats, one per model family.

Every template lays the prompt out prefix-first (PSM): other files and the text before the
cursor come first, so consecutive requests in one document share a long token prefix that the
engine's KV cache can reuse. In the append layout (context/prompt.py) the text from an anchor
line to the cursor follows the middle marker as the middle written so far, so typing only
appends to the prompt: `{prefix}<suffix marker>{suffix}<middle marker>{middle}`.

`render_parts` gives the prompt as parts: markers, and text by role (context, prefix, suffix,
middle), so the Completer tokenizes each part once and knows where each section's tokens are.

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
from typing import Any, Literal

from quickdraft.errors import ConfigError

Role = Literal["marker", "context", "top", "prefix", "suffix", "middle"]
"""`top`: the pinned top of the current file (context/prompt.py's `pinned` layout), before the
rest of the text before the cursor (`prefix`)."""


@dataclass(frozen=True)
class PromptPart:
    """A piece of a rendered prompt: a marker of the format, or text of one role."""

    text: str
    role: Role


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
        middle: str = "",
        top: str = "",
    ) -> str:
        """The whole prompt as one string (see `render_parts`)."""
        parts = self.render_parts(
            prefix, suffix, snippets, repo_name, path, language_id, middle, top
        )
        return "".join(part.text for part in parts)

    def render_parts(
        self,
        prefix: str,
        suffix: str,
        snippets: Iterable[Any] = (),
        repo_name: str | None = None,
        path: str | None = None,
        language_id: str | None = None,
        middle: str = "",
        top: str = "",
    ) -> list[PromptPart]:
        """The whole prompt: other files (`snippets`: objects/dicts with path and text, or
        (path, text) pairs), then the current file's prefix (its pinned `top` first, a part of
        its own), the hole, the suffix, and the middle written so far (empty in the classic
        layout)."""
        blocks = [self.render_snippet(*_snippet_fields(s), language_id) for s in snippets]
        top = self.sanitize(top)
        prefix = self.sanitize(prefix)
        suffix = self.sanitize(suffix)
        middle = self.sanitize(middle)
        repo = self.sanitize(repo_name) if repo_name else None
        current = self.sanitize(path) if path else "untitled"
        parts: list[PromptPart] = []

        def marker(text: str | None) -> None:
            if text:
                parts.append(PromptPart(text, "marker"))

        def text(value: str, role: Role = "context") -> None:
            if value:
                parts.append(PromptPart(value, role))

        def blocks_with_separators() -> None:
            # Each block starts with the file separator marker (qwen, starcoder2).
            for block in blocks:
                marker(self.file_sep)
                text(block[len(self.file_sep) :] if self.file_sep else block)

        if self.family in ("qwen2.5-coder", "starcoder2"):
            if blocks or repo is not None:
                if repo is not None:
                    marker(self.repo_name)
                    text(f"{repo}\n" if self.family == "qwen2.5-coder" else repo)
                blocks_with_separators()
                marker(self.file_sep)
                if self.family == "qwen2.5-coder":
                    text(f"{current}\n")
                    marker(self.fim_prefix)
                else:
                    marker(self.fim_prefix)
                    text(f"{current}\n")
            else:
                marker(self.fim_prefix)
        else:
            # deepseek-coder, codellama: other files lead the prefix, labelled by comments.
            marker(self.fim_prefix)
            if blocks:
                marker_comment = comment_prefix(language_id)
                text("".join(blocks) + f"{marker_comment} {current}\n")
        text(top, "top")
        text(prefix, "prefix")
        marker(self.fim_suffix)
        text(suffix, "suffix")
        marker(self.fim_middle)
        text(middle, "middle")
        return parts


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

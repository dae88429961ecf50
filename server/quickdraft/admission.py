"""The one gate every request passes before any model work is done for it.

Completions, next edits, the warm-up after an edit, the prefetch after an accepted suggestion
and `quickdraft complete` all ask `refusal` whether a document may be worked on, so they
always agree: the feature is switched on (`edits.enabled` for next edits), the document's
language is enabled (`languages`), and the document is usable (`text.unusable_reason`: not
larger than `context.max_document_bytes`, no NUL). Where the cursor lies is checked where
positions arrive (the LSP layer, in the client's units).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from quickdraft.config import QuickdraftConfig
from quickdraft.text import unusable_reason

Feature = Literal["completion", "edit"]


@dataclass(frozen=True)
class Refusal:
    """Why a request gets no model work. `level`: how the server logs it: `info` for what the
    settings ask for (a language switched off), `warning` for a document that cannot be used."""

    reason: str
    level: Literal["info", "warning"]

    def __str__(self) -> str:
        return self.reason


def refusal(
    config: QuickdraftConfig, feature: Feature, language_id: str, text: str
) -> Refusal | None:
    """None when `feature` may run on a document of `language_id` holding `text`, else why
    not."""
    if feature == "edit" and not config.edits.enabled:
        return Refusal("next edits are disabled (edits.enabled)", "info")
    if not config.language(language_id).enabled:
        return Refusal(f"completion disabled for {language_id}", "info")
    unusable = unusable_reason(text, config.context.max_document_bytes)
    if unusable is not None:
        return Refusal(unusable, "warning")
    return None

"""Every error quickdraft raises on purpose. One module, so callers catch one family.

Each error carries a message meant for a person: the CLI prints it as one line, the language
server sends it back as the JSON-RPC error message or a `window/showMessage`.
"""

from __future__ import annotations


class QuickdraftError(Exception):
    """Base of every error quickdraft raises deliberately."""


class ConfigError(QuickdraftError):
    """A configuration value is missing, of the wrong type or out of range."""


class ModelError(QuickdraftError):
    """A model cannot be found, loaded, or paired with another."""


class ModelNotFoundError(ModelError):
    """A model reference points at nothing that exists locally."""


class TokenizerMismatchError(ModelError):
    """Target and draft do not share a tokenizer, so draft tokens mean nothing to the target."""


class FetchError(ModelError):
    """Downloading or assembling model weights failed (network, checksum, disk)."""


class ChecksumError(FetchError):
    """An assembled file's sha256 is not the expected one."""


class DocumentError(QuickdraftError):
    """A request names a document or position that does not exist."""


class PositionError(DocumentError):
    """A line/column lies outside the document."""


class InputError(QuickdraftError):
    """A request's input is unusable: binary content, too large, malformed."""


class LanguageServerError(QuickdraftError):
    """A language server driven as a client (`quickdraft bench --typing`) exited, reported that
    it cannot serve, or did not answer in time."""

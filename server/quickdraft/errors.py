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


class RemoteEngineError(QuickdraftError):
    """A serving engine (`model.backend: openai`) failed a completion request.

    `kind` names the failure class, so the language server can tell one failure state from
    another (one `showMessage` per state). `engine_down` is False for a failure that belongs to
    one request (the engine refused that prompt) rather than to the engine.
    """

    kind = "engine"
    engine_down = True


class EngineUnreachableError(RemoteEngineError):
    """Nothing answers at the engine's address (connection refused, unknown host)."""

    kind = "unreachable"


class EngineTLSError(RemoteEngineError):
    """The TLS handshake with the engine failed (certificate, protocol)."""

    kind = "tls"


class EngineAuthError(RemoteEngineError):
    """The engine refused the API key (HTTP 401 or 403)."""

    kind = "auth"


class UnknownModelError(RemoteEngineError):
    """The engine does not serve the configured `model.remote_model`."""

    kind = "unknown-model"


class EngineRateLimitedError(RemoteEngineError):
    """The engine answered HTTP 429 for longer than a keystroke may wait."""

    kind = "rate-limited"


class EngineServerError(RemoteEngineError):
    """The engine answered with an HTTP 5xx status."""

    kind = "server-error"


class EngineTimeoutError(RemoteEngineError):
    """The engine did not connect, or did not send the next part of its answer, in time."""

    kind = "timeout"


class MalformedStreamError(RemoteEngineError):
    """The engine's answer is not the server-sent event stream of an OpenAI completion."""

    kind = "malformed-stream"


class TruncatedStreamError(RemoteEngineError):
    """The engine's stream ended before its end marker."""

    kind = "truncated-stream"


class EngineRejectedRequestError(RemoteEngineError):
    """The engine refused one request (HTTP 400/413/422: a prompt too long for its context)."""

    kind = "rejected"
    engine_down = False


class LanguageServerError(QuickdraftError):
    """A language server driven as a client (`quickdraft bench --typing`) exited, reported that
    it cannot serve, or did not answer in time."""

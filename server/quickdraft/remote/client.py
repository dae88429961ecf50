"""One streamed completion from an OpenAI-compatible `/v1/completions`, failures classified.

The request is the raw FIM prompt as `prompt`, `stream: true`, `max_tokens`, temperature/top_p
(and `seed` when set) and the family's stop strings. The answer is read as server-sent events;
after every piece of text `should_stop(text so far)` is asked, and the stream is closed the
moment it says yes: closing the connection is how vLLM, llama.cpp's server and SGLang learn
that nobody reads the rest, and they free the request's slot. A cancelled task closes the
stream the same way.

Retries, only where nothing can have been generated yet and within `RETRY_BUDGET_S`: a failed
connection, HTTP 429 with a `Retry-After` that fits, HTTP 503 before any byte streamed.

Every failure becomes one `quickdraft.errors.RemoteEngineError` subclass with a one-line message.
The API key goes into the `Authorization` header and nowhere else: messages name the URL without
credentials, and text an engine sends back has the key blanked out before it is quoted.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from quickdraft.errors import (
    EngineAuthError,
    EngineRateLimitedError,
    EngineRejectedRequestError,
    EngineServerError,
    EngineTimeoutError,
    EngineTLSError,
    EngineUnreachableError,
    MalformedStreamError,
    RemoteEngineError,
    TruncatedStreamError,
    UnknownModelError,
)

logger = logging.getLogger(__name__)

RETRY_BUDGET_S = 1.0
"""The longest a request waits in retries (backoff, Retry-After) before it fails."""
CONNECT_BACKOFF_S = (0.05, 0.2)
"""Pauses before the second and third connection attempts."""
UNAVAILABLE_RETRY_S = 0.25
"""Pause before retrying a 503 that named no Retry-After."""
DETAIL_CHARS = 200
"""The most characters of an engine's error text quoted in a message."""


@dataclass(frozen=True)
class Endpoint:
    """Where the engine is: `base` ends in `/v1`; `display` is safe to print."""

    base: str
    display: str

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """`http://h:8000`, `http://h:8000/v1` and `http://h:8000/v1/completions` all mean the
        engine whose API root is `http://h:8000/v1`. (load_config has checked the URL.)"""
        parts = urlsplit(url.strip())
        path = parts.path.rstrip("/")
        if path.endswith("/completions"):
            path = path[: -len("/completions")]
        if not path.endswith("/v1"):
            path += "/v1"
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
        base = urlunsplit((parts.scheme, netloc, path, "", ""))
        return cls(base=base, display=base)

    @property
    def completions(self) -> str:
        return self.base + "/completions"

    @property
    def models(self) -> str:
        return self.base + "/models"


@dataclass
class CompletionParams:
    """The body of one `/v1/completions` request (see the module docstring)."""

    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    model: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": True,
            "n": 1,
            "echo": False,
        }
        if self.model is not None:
            body["model"] = self.model
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        return body


@dataclass
class StreamProgress:
    """What has arrived so far; read by the waiting thread when it gives up (cancel, deadline)."""

    text: str = ""
    events: int = 0
    started_at: float = field(default_factory=time.perf_counter)
    first_text_at: float | None = None


@dataclass
class StreamOutcome:
    text: str
    finish: str
    """"rule" (should_stop said so), "stop-string" (a stop string showed up in the text),
    "stop" (the engine ended: end of text or one of its stop strings), "length" (max_tokens)."""
    events: int
    first_text_at: float | None
    ended_at: float


class CompletionsClient:
    """An `httpx.AsyncClient` for one engine. Use it from one event loop (RemoteGenerator's)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        api_key: str | None,
        api_key_env: str | None,
        connect_timeout_s: float,
        read_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._api_key = api_key
        self._api_key_env = api_key_env
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4),
            follow_redirects=False,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- requests ----------------------------------------------------------------------

    async def list_models(self) -> list[str] | None:
        """The model ids the engine serves; None when it has no `/v1/models` (HTTP 404)."""
        try:
            response = await self._http.get(self.endpoint.models, headers={"Accept": "*/*"})
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, streamed=False) from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self.status_error(response)
        try:
            data = response.json()["data"]
            return [str(item["id"]) for item in data]
        except (ValueError, KeyError, TypeError):
            # Completions may well work: only the model's name cannot be checked.
            logger.warning(
                "the completion engine at %s answered /models with something other than an "
                "OpenAI model list; the model's name is not checked",
                self.endpoint.display,
            )
            return None

    async def stream(
        self,
        params: CompletionParams,
        should_stop: Callable[[str], bool],
        progress: StreamProgress,
        *,
        retry: bool = True,
    ) -> StreamOutcome:
        """Run one streamed completion (see the module docstring). Raises RemoteEngineError."""
        give_up_at = time.monotonic() + RETRY_BUDGET_S
        attempt = 0
        body = params.body()
        while True:
            attempt += 1
            pause: float | None = None
            try:
                async with self._http.stream("POST", self.endpoint.completions, json=body) as r:
                    if r.status_code == 200:
                        return await self._read_events(r, params.stop, should_stop, progress)
                    await r.aread()
                    error = self.status_error(r)
                    pause = self._retry_pause(r)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                error = self.transport_error(exc, streamed=False)
                if not isinstance(error, EngineTLSError) and attempt <= len(CONNECT_BACKOFF_S):
                    pause = CONNECT_BACKOFF_S[attempt - 1]
            except httpx.HTTPError as exc:
                raise self.transport_error(exc, streamed=progress.events > 0) from None
            if not retry or pause is None or time.monotonic() + pause > give_up_at:
                raise error
            logger.info("%s; retrying in %.2f s", error, pause)
            await asyncio.sleep(pause)

    # --- the event stream --------------------------------------------------------------

    async def _read_events(
        self,
        response: httpx.Response,
        stop_strings: list[str],
        should_stop: Callable[[str], bool],
        progress: StreamProgress,
    ) -> StreamOutcome:
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "text/event-stream":
            await response.aread()
            raise MalformedStreamError(
                f"the completion engine at {self.endpoint.display} answered with "
                f"{kind or 'no content type'}, not a stream of events: "
                f"{self._quote(response.text)}"
            )
        finish: str | None = None
        data: list[str] = []

        def outcome(how: str) -> StreamOutcome:
            return StreamOutcome(
                progress.text, how, progress.events, progress.first_text_at, time.perf_counter()
            )

        try:
            async for line in response.aiter_lines():
                if line:
                    name, _, value = line.partition(":")
                    if name == "data":
                        data.append(value[1:] if value.startswith(" ") else value)
                    continue  # comments (": ping") and other fields carry no text
                if not data:
                    continue
                payload, data = "\n".join(data), []
                if payload.strip() == "[DONE]":
                    return outcome(finish or "stop")
                piece, reason = self._parse_event(payload)
                progress.events += 1
                finish = reason or finish
                if piece:
                    if progress.first_text_at is None:
                        progress.first_text_at = time.perf_counter()
                    progress.text += piece
                    cut = _first_stop(progress.text, stop_strings)
                    if cut is not None:
                        progress.text = progress.text[:cut]
                        return outcome("stop-string")
                    if should_stop(progress.text):
                        return outcome("rule")  # leaving `async with` closes the stream
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, streamed=True) from None
        if data:  # a last event without its blank line
            raise TruncatedStreamError(self._truncated(progress.events))
        if finish is not None:
            return outcome(finish)  # every choice finished; only the end marker is missing
        raise TruncatedStreamError(self._truncated(progress.events))

    def _parse_event(self, payload: str) -> tuple[str, str | None]:
        """(text, finish_reason) of one event; raises for errors and malformed events."""
        where = self.endpoint.display
        try:
            event = json.loads(payload)
        except ValueError:
            raise MalformedStreamError(
                f"the completion engine at {where} sent an event that is not JSON: "
                f"{self._quote(payload)}"
            ) from None
        if isinstance(event, dict) and event.get("error") is not None:
            raise EngineServerError(
                f"the completion engine at {where} failed while generating: "
                f"{self._quote(_error_text(event))}"
            )
        if isinstance(event, dict) and event.get("choices") == []:
            return "", None  # a usage-only event, as OpenAI's `include_usage` last chunk
        try:
            choice = event["choices"][0]
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):
                raise MalformedStreamError(
                    f"the engine at {where} answered in the chat format; quickdraft needs an "
                    "OpenAI text completions endpoint (/v1/completions) that takes a raw prompt"
                )
            if not isinstance(text, str):
                raise TypeError
            reason = choice.get("finish_reason")
            return text, str(reason) if reason else None
        except MalformedStreamError:
            raise
        except (KeyError, IndexError, TypeError, AttributeError):
            raise MalformedStreamError(
                f"the completion engine at {where} sent an event without a completion text: "
                f"{self._quote(payload)}"
            ) from None

    def _truncated(self, events: int) -> str:
        return (
            f"the stream from the completion engine at {self.endpoint.display} broke off after "
            f"{events} events, before its end marker"
        )

    # --- failures ----------------------------------------------------------------------

    def transport_error(self, exc: httpx.HTTPError, *, streamed: bool) -> RemoteEngineError:
        """A one-line error for an httpx failure (connection, TLS, timeout, broken stream)."""
        where = self.endpoint.display
        if isinstance(exc, httpx.ConnectTimeout):
            return EngineTimeoutError(
                f"the completion engine at {where} did not accept a connection within "
                f"{self.connect_timeout_s:g} s (model.connect_timeout_s)"
            )
        if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
            waited = "its next part" if streamed else "an answer"
            return EngineTimeoutError(
                f"the completion engine at {where} sent no {waited} for "
                f"{self.read_timeout_s:g} s (model.read_timeout_s)"
            )
        tls = _tls_cause(exc)
        if tls is not None:
            hint = ""
            if "CERTIFICATE_VERIFY_FAILED" in tls or "certificate verify failed" in tls.lower():
                hint = "; a private CA's certificate can be given in SSL_CERT_FILE"
            return EngineTLSError(f"TLS error with the completion engine at {where}: {tls}{hint}")
        if isinstance(exc, httpx.ConnectError):
            return EngineUnreachableError(
                f"cannot reach the completion engine at {where}: {_reason(exc)}"
            )
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
            if streamed:
                return TruncatedStreamError(
                    f"the stream from the completion engine at {where} broke off "
                    f"({_reason(exc)}), before its end marker"
                )
            return EngineUnreachableError(
                f"the completion engine at {where} closed the connection without an answer "
                f"({_reason(exc)})"
            )
        return RemoteEngineError(
            f"talking to the completion engine at {where} failed: {type(exc).__name__}: "
            f"{_reason(exc)}"
        )

    def status_error(self, response: httpx.Response) -> RemoteEngineError:
        """A one-line error for an HTTP status other than 200."""
        where = self.endpoint.display
        status = response.status_code
        detail = self._quote(_error_text(_json_or_text(response)))
        said = f"HTTP {status}" + (f": {detail}" if detail else "")
        if status in (401, 403):
            if self._api_key_env is None:
                fix = "it wants an API key: name the variable holding it in model.api_key_env"
            elif not self._api_key:
                fix = f"${self._api_key_env} is empty"
            else:
                fix = f"check the key in ${self._api_key_env}"
            return EngineAuthError(
                f"the completion engine at {where} refused the request ({said}); {fix}"
            )
        if _names_missing_model(status, detail):
            return UnknownModelError(
                f"the completion engine at {where} does not serve the model asked for ({said}); "
                "check model.remote_model"
            )
        if status == 404:
            return RemoteEngineError(
                f"no OpenAI completions endpoint at {self.endpoint.completions} ({said}); "
                "check model.url"
            )
        if status == 429:
            after = _retry_after(response)
            wait = f", retry after {after:g} s" if after is not None else ""
            return EngineRateLimitedError(
                f"the completion engine at {where} is rate limiting requests ({said}{wait})"
            )
        if status >= 500:
            return EngineServerError(f"the completion engine at {where} failed ({said})")
        return EngineRejectedRequestError(
            f"the completion engine at {where} refused the request ({said})"
        )

    def _retry_pause(self, response: httpx.Response) -> float | None:
        """How long to wait before retrying this answer, or None when retrying is unsafe."""
        if response.status_code == 429:
            return _retry_after(response)  # without one, there is no telling when
        if response.status_code == 503:
            after = _retry_after(response)
            return UNAVAILABLE_RETRY_S if after is None else after
        return None

    def _quote(self, text: str) -> str:
        """Engine text fit for a one-line message: the API key blanked, one line, bounded."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        line = " ".join(text.split())
        if len(line) > DETAIL_CHARS:
            line = line[: DETAIL_CHARS - 1] + "…"
        return line


# --- helpers ------------------------------------------------------------------------------


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return min(found) if found else None


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_text(value: Any) -> str:
    """The human part of an engine's error body: OpenAI's {"error": {"message"}}, FastAPI's
    {"detail"}, TGI's {"error": "..."}, or the text itself."""
    if isinstance(value, dict):
        for key in ("error", "detail", "message"):
            inner = value.get(key)
            if inner is not None:
                return _error_text(inner)
        return json.dumps(value)
    if isinstance(value, list):
        return "; ".join(_error_text(item) for item in value[:3])
    return str(value)


def _names_missing_model(status: int, detail: str) -> bool:
    """vLLM answers 404 "The model `x` does not exist."; others use 400 or 404 with similar
    words."""
    lowered = detail.lower()
    return (
        status in (400, 404)
        and "model" in lowered
        and any(
            words in lowered
            for words in ("does not exist", "not found", "unknown", "not served", "no such")
        )
    )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _causes(exc: BaseException):
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _tls_cause(exc: BaseException) -> str | None:
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            detail = getattr(cause, "verify_message", None)
            return "certificate verify failed" + (f": {detail}" if detail else "")
        if isinstance(cause, ssl.SSLError):
            return cause.reason or str(cause)
    text = str(exc)
    if "SSL" in text or "CERTIFICATE" in text or "TLS" in text:
        return text
    return None


def _reason(exc: BaseException) -> str:
    """The innermost useful words of an exception chain ("Connection refused")."""
    for cause in reversed(list(_causes(exc))):
        text = str(cause)
        if isinstance(cause, OSError) and not isinstance(cause, socket.gaierror):
            # asyncio says "Connect call failed ('10.0.0.1', 8000)" for ECONNREFUSED
            text = os.strerror(cause.errno) if cause.errno and cause.errno > 0 else text
        elif isinstance(cause, socket.gaierror):
            text = cause.strerror or text
        if text:
            return " ".join(text.split())
    return type(exc).__name__

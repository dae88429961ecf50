"""`RemoteGenerator`: a serving engine in the role the local `Engine.generate` plays.

The model worker thread calls `generate` and waits; the HTTP work runs on an event loop thread
of the generator's own, so a cancel (or the deadline) ends the wait within `POLL_S` and cancels
the request's task, which closes its stream and frees the engine's slot, even while the
connection is still being made or the engine has not sent its first token.

While the engine cannot be reached (or does not serve the model), a probe (`GET /v1/models`)
asks again with backoff, so the state turns back to "ready" when the engine returns even if
nobody is typing. Other failures (HTTP errors, broken streams, timeouts) are only cleared by a
request that succeeds: an engine whose model list answers tells nothing about its completions.
Requests to an engine known to be unreachable make one attempt each, without retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from quickdraft.config import ModelConfig
from quickdraft.errors import ConfigError, RemoteEngineError, UnknownModelError
from quickdraft.remote.client import (
    CompletionParams,
    CompletionsClient,
    Endpoint,
    StreamProgress,
)
from quickdraft.remote.status import EngineStatus

logger = logging.getLogger(__name__)

POLL_S = 0.01
"""How often the waiting thread looks at the cancel event and the deadline."""
PROBE_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
"""Pauses between probes while the engine is unavailable (the last one repeats)."""
PROBED_KINDS = ("unreachable", "tls", "unknown-model")
"""Failure states a probe of `/v1/models` can clear."""

STOP_REASONS = {"rule": "stop", "stop-string": "eos", "stop": "eos", "length": "max_tokens"}
"""The engine's way of finishing -> `Completion.stop_reason` (as the local engine names them)."""


@dataclass
class RemoteResult:
    text: str
    """The generated text (cut at a stop string; the stop rule's cut is postprocess's job)."""
    stop_reason: str
    """"eos", "max_tokens", "stop" (the stop rule closed the stream), "deadline", "cancelled"."""
    prefill_ms: float
    """Time to the first text: request, network, queueing, prefill and the first token."""
    decode_ms: float
    total_ms: float
    events: int


def read_api_key(env_name: str | None) -> str | None:
    """The key from the environment variable named `env_name` (never from settings)."""
    if env_name is None:
        return None
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise ConfigError(
            f"model.api_key_env: the environment variable {env_name} is not set or empty in "
            "the environment quickdraft runs in"
        )
    return value


class RemoteGenerator:
    def __init__(
        self,
        endpoint: Endpoint,
        *,
        stop_strings: list[str],
        api_key: str | None = None,
        api_key_env: str | None = None,
        remote_model: str | None = None,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.stop_strings = list(stop_strings)
        self.remote_model = remote_model
        self.model_name: str | None = remote_model
        """The `model` sent: the configured one, else the first the engine lists."""
        self._model_checked = False
        self.status = EngineStatus(endpoint.display)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="quickdraft-remote", daemon=True
        )
        self._thread.start()
        self._client = CompletionsClient(
            endpoint,
            api_key=api_key,
            api_key_env=api_key_env,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            transport=transport,
        )
        self._watch: asyncio.Task | None = None
        self._closed = False

    @classmethod
    def from_config(cls, model: ModelConfig, stop_strings: list[str]) -> RemoteGenerator:
        return cls(
            Endpoint.from_url(model.url or ""),
            stop_strings=stop_strings,
            api_key=read_api_key(model.api_key_env),
            api_key_env=model.api_key_env,
            remote_model=model.remote_model,
            connect_timeout_s=model.connect_timeout_s,
            read_timeout_s=model.read_timeout_s,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.endpoint.display,
            "model": self.model_name,
            "state": self.status.state,
            "connect_timeout_s": self._client.connect_timeout_s,
            "read_timeout_s": self._client.read_timeout_s,
        }

    # --- requests (from the model worker thread) ---------------------------------------

    def check(self) -> RemoteEngineError | None:
        """Ask the engine which models it serves, now; the failure, or None when it answered
        and serves the model configured."""
        logger.info("checking the completion engine at %s", self.endpoint.display)
        future = asyncio.run_coroutine_threadsafe(self._probe(), self._loop)
        try:
            future.result()
        except RemoteEngineError as error:
            self._failed(error)
            return error
        self.status.record_success()
        return None

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        should_stop: Callable[[str], bool] | None = None,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> RemoteResult:
        """One completion of `prompt`. Raises RemoteEngineError (after recording it)."""
        progress = StreamProgress()
        params = CompletionParams(
            prompt, max_tokens, temperature, top_p, seed, list(self.stop_strings)
        )
        if cancel is not None and cancel.is_set():
            return self._result(progress, "cancelled", time.perf_counter())
        future = asyncio.run_coroutine_threadsafe(
            self._complete(
                params, should_stop or _never, progress, self.status.kind in PROBED_KINDS
            ),
            self._loop,
        )
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        while not done.wait(POLL_S):
            gave_up = None
            if cancel is not None and cancel.is_set():
                gave_up = "cancelled"
            elif deadline is not None and time.monotonic() >= deadline:
                gave_up = "deadline"
            if gave_up is not None:
                future.cancel()  # the task is cancelled: its stream closes
                return self._result(progress, gave_up, time.perf_counter())
        try:
            outcome = future.result()
        except RemoteEngineError as error:
            self._failed(error)
            raise
        except concurrent.futures.CancelledError:
            raise RemoteEngineError("the connection to the completion engine was closed") from None
        self.status.record_success()
        return self._result(progress, STOP_REASONS.get(outcome.finish, "eos"), outcome.ended_at)

    def close(self) -> None:
        """Stop probing, close the connections and the event loop thread."""
        if self._closed:
            return
        self._closed = True
        self.status.unsubscribe_all()

        async def shut() -> None:
            if self._watch is not None:
                self._watch.cancel()
            await self._client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=5)
        except Exception:  # closing is best effort; the thread is a daemon
            logger.debug("closing the remote client failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # --- on the event loop --------------------------------------------------------------

    async def _probe(self) -> None:
        models = await self._client.list_models()
        if models is not None:
            if self.remote_model is None:
                self.model_name = models[0] if models else None
            elif self.remote_model not in models:
                served = ", ".join(models) or "none"
                raise UnknownModelError(
                    f"the completion engine at {self.endpoint.display} does not serve model "
                    f"{self.remote_model!r} (it serves: {served}); check model.remote_model"
                )
        self._model_checked = True

    async def _complete(
        self,
        params: CompletionParams,
        should_stop: Callable[[str], bool],
        progress: StreamProgress,
        known_down: bool,
    ):
        if not self._model_checked or self.status.kind == UnknownModelError.kind:
            await self._probe()
        params.model = self.model_name
        return await self._client.stream(params, should_stop, progress, retry=not known_down)

    async def _watch_until_ready(self) -> None:
        attempt = 0
        while self.status.kind in PROBED_KINDS and not self._closed:
            await asyncio.sleep(PROBE_DELAYS_S[min(attempt, len(PROBE_DELAYS_S) - 1)])
            attempt += 1
            if self.status.kind not in PROBED_KINDS:
                return  # a request found it back (or failing otherwise) first
            try:
                await self._probe()
            except RemoteEngineError as error:
                self.status.record_failure(error)
                continue
            self.status.record_success()

    def _start_watch(self) -> None:
        if self._closed or (self._watch is not None and not self._watch.done()):
            return
        self._watch = self._loop.create_task(self._watch_until_ready())

    # --- bookkeeping --------------------------------------------------------------------

    def _failed(self, error: RemoteEngineError) -> None:
        self.status.record_failure(error)
        if self.status.kind in PROBED_KINDS and not self._closed:
            self._loop.call_soon_threadsafe(self._start_watch)

    @staticmethod
    def _result(progress: StreamProgress, stop_reason: str, ended_at: float) -> RemoteResult:
        first = progress.first_text_at or ended_at
        return RemoteResult(
            text=progress.text,
            stop_reason=stop_reason,
            prefill_ms=(first - progress.started_at) * 1000,
            decode_ms=(ended_at - first) * 1000,
            total_ms=(ended_at - progress.started_at) * 1000,
            events=progress.events,
        )


def _never(text: str) -> bool:
    return False

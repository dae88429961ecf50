"""The remote backend's client against a real engine (llama.cpp's server on the 0.5B GGUF):
streaming, the stop rule and cancellation closing the stream on the engine, and every failure
class, with the engine itself or behind a loopback proxy that misbehaves (engine_proxy.py).

Each failure must come out as its own RemoteEngineError subclass with a one-line message that
never holds the API key, and change the engine's state once, not once per request.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import httpx
import pytest
from conftest import ENGINE_KEY_ENV
from engine_proxy import Act, EngineProxy, status, text_event
from llamacpp_engine import ALIAS, free_port

from quickdraft.errors import (
    EngineAuthError,
    EngineRateLimitedError,
    EngineRejectedRequestError,
    EngineServerError,
    EngineTimeoutError,
    EngineTLSError,
    EngineUnreachableError,
    MalformedStreamError,
    TruncatedStreamError,
    UnknownModelError,
)
from quickdraft.models.presets import STOP_TOKENS
from quickdraft.remote.client import Endpoint
from quickdraft.remote.generator import RemoteGenerator

pytestmark = pytest.mark.timeout(300)

PROMPT = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n<|fim_middle|>"
LONG_PROMPT = (
    "<|fim_prefix|># the first forty square numbers, one per line\nSQUARES = [\n    0,\n    1,\n"
    "    4,\n<|fim_suffix|>\n]\n<|fim_middle|>"
)
STOPS = list(STOP_TOKENS["qwen2.5-coder"])


@pytest.fixture
def generators():
    """`make(url, **options)`: a RemoteGenerator that is closed after the test."""
    made: list[RemoteGenerator] = []

    def make(url: str, *, key: str | None = None, key_env: str | None = ENGINE_KEY_ENV, **kw):
        import os

        generator = RemoteGenerator(
            Endpoint.from_url(url),
            stop_strings=STOPS,
            api_key=key if key is not None else (os.environ.get(key_env) if key_env else None),
            api_key_env=key_env,
            **kw,
        )
        made.append(generator)
        return generator

    yield make
    for generator in made:
        generator.close()


@pytest.fixture
def proxy(llama_engine):
    proxy = EngineProxy(llama_engine.port).start()
    yield proxy
    proxy.stop()


def fails_with(generator: RemoteGenerator, error_class, key: str, **kw):
    with pytest.raises(error_class) as caught:
        generator.generate(PROMPT, max_tokens=kw.pop("max_tokens", 2), **kw)
    message = str(caught.value)
    assert "\n" not in message and key not in message
    return message


def assert_stopped_early(engine, generators, number: int, max_tokens: int) -> None:
    """Completion `number` stopped when its stream closed: it made fewer chunks than its budget
    and none after the next completion (started here) began."""
    generators(engine.url).generate(PROMPT, max_tokens=1)
    records = engine.completions()
    assert number + 1 in records
    record = records[number]
    assert not record.completed and record.chunks < max_tokens
    assert not record.produced_after_next_started


# --- streaming -----------------------------------------------------------------------------


def test_streamed_text_is_what_the_engine_answers_directly(llama_engine, engine_key, generators):
    generator = generators(llama_engine.url)
    assert generator.check() is None
    assert generator.model_name == ALIAS and generator.status.state == "ready"
    result = generator.generate(PROMPT, max_tokens=6)
    direct = httpx.post(
        llama_engine.url + "/completions",
        json={"model": ALIAS, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0},
        headers={"Authorization": f"Bearer {engine_key}"},
        timeout=120,
    ).json()["choices"][0]["text"]
    assert result.text == direct and result.text
    assert result.stop_reason in ("max_tokens", "eos")


def test_the_stop_rule_closes_the_stream_on_the_engine(llama_engine, generators):
    generator = generators(llama_engine.url)
    number = len(llama_engine.completions()) + 1
    seen: list[str] = []

    def stop_at_first_text(text: str) -> bool:
        seen.append(text)
        return True

    result = generator.generate(LONG_PROMPT, max_tokens=64, should_stop=stop_at_first_text)
    assert result.stop_reason == "stop" and result.text == seen[0] and len(seen) == 1
    assert_stopped_early(llama_engine, generators, number, 64)


def test_a_cancel_closes_the_stream_on_the_engine(llama_engine, generators):
    generator = generators(llama_engine.url)
    number = len(llama_engine.completions()) + 1
    cancel, first_text = threading.Event(), threading.Event()

    def note(text: str) -> bool:
        first_text.set()
        return False

    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            generator.generate(LONG_PROMPT, max_tokens=64, should_stop=note, cancel=cancel)
        )
    )
    worker.start()
    assert first_text.wait(120)
    cancel.set()
    worker.join(30)
    assert results and results[0].stop_reason == "cancelled"
    assert_stopped_early(llama_engine, generators, number, 64)


# --- failure classes -------------------------------------------------------------------------


def test_unreachable_engine_one_state_change_for_many_requests(engine_key, generators):
    generator = generators(f"http://127.0.0.1:{free_port()}/v1")
    heard: list[tuple[str, str]] = []
    generator.status.subscribe(lambda state, message: heard.append((state, message)))
    for _ in range(3):
        message = fails_with(generator, EngineUnreachableError, engine_key)
        assert message.startswith("cannot reach the completion engine at http://127.0.0.1:")
    assert [state for state, _ in heard] == ["unavailable"]
    assert generator.status.kind == "unreachable"


def test_tls_to_a_server_that_speaks_plain_http(llama_engine, engine_key, generators):
    generator = generators(llama_engine.url.replace("http://", "https://"))
    assert "TLS error" in fails_with(generator, EngineTLSError, engine_key)


def test_tls_with_a_private_certificate(
    llama_engine, engine_key, generators, tmp_path, monkeypatch
):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    proxy = EngineProxy(llama_engine.port, tls=context).start()
    try:
        untrusted = generators(proxy.url)
        message = fails_with(untrusted, EngineTLSError, engine_key)
        assert "certificate verify failed" in message and "SSL_CERT_FILE" in message
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusted = generators(proxy.url)
        assert trusted.generate(PROMPT, max_tokens=2).text
    finally:
        proxy.stop()


def test_a_wrong_or_missing_key_is_refused(llama_engine, engine_key, generators):
    wrong = generators(llama_engine.url, key="not-the-key")
    message = fails_with(wrong, EngineAuthError, engine_key)
    assert (
        "HTTP 401" in message and f"${ENGINE_KEY_ENV}" in message and "not-the-key" not in message
    )
    keyless = generators(llama_engine.url, key_env=None)
    assert "model.api_key_env" in fails_with(keyless, EngineAuthError, engine_key)


def test_403_is_an_auth_failure(proxy, engine_key, generators):
    generator = generators(proxy.url)
    proxy.script("/completions", status(403, f"key {engine_key} may not use this model"))
    message = fails_with(generator, EngineAuthError, engine_key)
    assert "HTTP 403" in message and "***" in message  # the engine's words, key blanked


def test_an_unknown_model_is_named_before_any_generation(llama_engine, engine_key, generators):
    generator = generators(llama_engine.url, remote_model="no-such-model")
    started = len(llama_engine.completions())
    error = generator.check()
    assert isinstance(error, UnknownModelError)
    assert "'no-such-model'" in str(error) and ALIAS in str(error)
    fails_with(generator, UnknownModelError, engine_key)
    assert len(llama_engine.completions()) == started  # its default model was never used


def test_an_unknown_model_answered_the_vllm_way(proxy, engine_key, generators):
    generator = generators(proxy.url, remote_model=ALIAS)
    proxy.script("/completions", status(404, "The model `qwen-7b` does not exist."))
    assert "does not exist" in fails_with(generator, UnknownModelError, engine_key)


def test_429_is_retried_when_retry_after_fits_else_reported(proxy, engine_key, generators):
    generator = generators(proxy.url)
    proxy.script("/completions", status(429, "slow down", {"Retry-After": "0"}))
    assert generator.generate(PROMPT, max_tokens=2).text
    assert len(proxy.requests_to("/completions")) == 2
    proxy.script("/completions", status(429, "slow down", {"Retry-After": "30"}))
    message = fails_with(generator, EngineRateLimitedError, engine_key)
    assert "HTTP 429" in message and "retry after 30 s" in message
    assert len(proxy.requests_to("/completions")) == 3  # no waiting 30 s in a keystroke


def test_5xx_fails_and_503_before_the_stream_is_retried(proxy, engine_key, generators):
    generator = generators(proxy.url)
    proxy.script("/completions", status(500, "CUDA error: out of memory"))
    message = fails_with(generator, EngineServerError, engine_key)
    assert "HTTP 500: CUDA error: out of memory" in message
    assert len(proxy.requests_to("/completions")) == 1
    proxy.script("/completions", status(503, "loading"))
    assert generator.generate(PROMPT, max_tokens=2).text
    assert len(proxy.requests_to("/completions")) == 3


def test_an_engine_that_hangs_times_out(proxy, engine_key, generators):
    generator = generators(proxy.url, read_timeout_s=0.5)
    proxy.script("/completions", Act("hang"))
    assert "model.read_timeout_s" in fails_with(generator, EngineTimeoutError, engine_key)


def test_malformed_streams(proxy, engine_key, generators):
    generator = generators(proxy.url)
    proxy.script("/completions", Act("events", events=["{not json"]))
    assert "not JSON" in fails_with(generator, MalformedStreamError, engine_key)
    proxy.script("/completions", Act("events", events=['{"choices": "none"}']))
    assert "without a completion text" in fails_with(generator, MalformedStreamError, engine_key)
    proxy.script("/completions", Act("status", status=200, body='{"choices": []}'))
    assert "application/json" in fails_with(generator, MalformedStreamError, engine_key)


def test_a_stream_that_breaks_off_is_truncated(proxy, engine_key, generators):
    generator = generators(proxy.url)
    proxy.script("/completions", Act("events", events=[text_event("a + ")]))
    assert "broke off after 1 events" in fails_with(generator, TruncatedStreamError, engine_key)


def test_a_rejected_request_does_not_mark_the_engine_down(proxy, engine_key, generators):
    generator = generators(proxy.url)
    assert generator.check() is None
    proxy.script("/completions", status(400, "prompt is longer than the context (2048)"))
    fails_with(generator, EngineRejectedRequestError, engine_key)
    assert generator.status.state == "ready"


def test_one_notice_per_failure_state_and_one_on_recovery(proxy, engine_key, generators):
    generator = generators(proxy.url)
    assert generator.check() is None
    heard: list[str] = []
    generator.status.subscribe(lambda state, message: heard.append(f"{state} {message}"))
    proxy.script("/completions", status(500), status(502), status(403))
    fails_with(generator, EngineServerError, engine_key)
    fails_with(generator, EngineServerError, engine_key)
    fails_with(generator, EngineAuthError, engine_key)
    assert generator.generate(PROMPT, max_tokens=2).text
    assert [line.split(" ")[0] for line in heard] == ["unavailable", "unavailable", "ready"]
    assert "HTTP 500" in heard[0] and "HTTP 403" in heard[1] and "answers again" in heard[2]


def test_the_state_turns_ready_without_requests_when_the_engine_returns(
    llama_engine, engine_key, generators
):
    port = free_port()
    generator = generators(f"http://127.0.0.1:{port}/v1")
    assert isinstance(generator.check(), EngineUnreachableError)
    proxy = EngineProxy(llama_engine.port)
    proxy.start(port=port)
    try:
        deadline = time.monotonic() + 20
        while generator.status.state != "ready":
            assert time.monotonic() < deadline, generator.status.message
            time.sleep(0.1)  # pacing: polls the generator's state (the state waited for)
        assert proxy.requests_to("/models") and not proxy.requests_to("/completions")
    finally:
        proxy.stop()

"""The remote backend without an engine: settings checked at the edge, the command-line flags,
the event-stream reading (httpx's MockTransport plays the engine), the state changes, the
tokenizer lookup, and the pipeline around the engine. The real engine's tests are in
tests/e2e/test_remote_engine.py and test_remote_lsp.py."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from quickdraft.config import load_config
from quickdraft.errors import (
    ConfigError,
    EngineServerError,
    MalformedStreamError,
    ModelNotFoundError,
    RemoteEngineError,
    TruncatedStreamError,
)
from quickdraft.remote.client import Endpoint
from quickdraft.remote.generator import RemoteGenerator
from quickdraft.remote.status import EngineStatus

URL = "http://gpu-box:8000/v1"


def remote(**model) -> dict:
    return {"model": {"backend": "openai", "url": URL, "preset": "qwen2.5-coder-1.5b", **model}}


# --- settings ----------------------------------------------------------------------------------


def test_a_complete_remote_configuration_loads():
    config = load_config(remote(api_key_env="TEAM_KEY", remote_model="qwen-coder-7b"))
    assert config.model.backend == "openai" and config.model.api_key_env == "TEAM_KEY"


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"url": None}, "model.url: backend openai needs"),
        ({"url": "ftp://gpu-box/v1"}, "is not an http:// or https:// URL"),
        ({"url": "http:///v1"}, "is not an http:// or https:// URL"),
        ({"url": "http://gpu-box/v1?model=x"}, "no query or fragment"),
        ({"family": "gpt"}, "model.family: 'gpt' is not one of qwen2.5-coder"),
        ({"preset": None}, "a preset (model.preset"),
        ({"connect_timeout_s": 0}, "model.connect_timeout_s: 0.0 is below the minimum"),
    ],
)
def test_remote_settings_are_checked_at_the_edge(model, words):
    with pytest.raises(ConfigError) as caught:
        load_config(remote(**model))
    assert words in str(caught.value)


def test_secrets_put_in_the_wrong_place_are_refused_without_being_echoed():
    with pytest.raises(ConfigError) as caught:
        load_config(remote(url="https://user:sk-live-123@gpu-box/v1"))
    assert "sk-live-123" not in str(caught.value) and "model.api_key_env" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(remote(api_key_env="sk-live-123"))
    assert "sk-live-123" not in str(caught.value)


def test_a_local_configuration_ignores_the_remote_keys():
    assert load_config({"model": {"url": "not a url"}}).model.backend == "local"


def test_the_command_line_flags_reach_the_model_settings():
    from quickdraft.cli import build_parser
    from quickdraft.cli_args import config_dict_from_args

    for command in ("serve", "complete", "bench"):
        argv = [command, *(["x.py", "--line", "1", "--col", "1"] if command == "complete" else [])]
        argv += ["--repo", "."] if command == "bench" else []
        args = build_parser().parse_args(
            [*argv, "--backend", "openai", "--url", URL, "--api-key-env", "TEAM_KEY"]
            + ["--remote-model", "m", "--preset", "qwen2.5-coder-7b", "--read-timeout", "5"]
        )
        model = config_dict_from_args(args)["model"]
        assert model == {
            "preset": "qwen2.5-coder-7b",
            "backend": "openai",
            "url": URL,
            "api_key_env": "TEAM_KEY",
            "remote_model": "m",
            "read_timeout_s": 5.0,
        }
        load_config({"model": model})


def test_the_bench_keeps_the_local_models_for_its_local_strategies():
    from quickdraft.bench.cli import remote_model_settings

    data = {"model": {"preset": "p", "backend": "openai", "url": URL, "api_key_env": "K"}}
    assert remote_model_settings(data, URL) == {"backend": "openai", "url": URL, "api_key_env": "K"}
    assert data == {"model": {"preset": "p"}}
    assert remote_model_settings({"model": {}}, None) is None


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:8000", "http://h:8000/v1"),
        ("http://h:8000/v1/", "http://h:8000/v1"),
        ("https://h/proxy/v1/completions", "https://h/proxy/v1"),
        ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
    ],
)
def test_the_endpoint_is_the_api_root(url, base):
    endpoint = Endpoint.from_url(url)
    assert endpoint.base == base and endpoint.completions == base + "/completions"


def test_a_missing_key_variable_is_named():
    from quickdraft.remote.generator import read_api_key

    with pytest.raises(ConfigError, match="QD_SURELY_UNSET_KEY is not set"):
        read_api_key("QD_SURELY_UNSET_KEY")
    assert read_api_key(None) is None


# --- the event stream ----------------------------------------------------------------------------


def sse(*events: object, done: bool = True, extra: str = "") -> bytes:
    lines = [extra] if extra else []
    for event in events:
        payload = event if isinstance(event, str) else json.dumps(event)
        lines.append(f"data: {payload}\n\n")
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def piece(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}


class Engine:
    """httpx.MockTransport's handler: /models lists one model, /completions answers `body`."""

    def __init__(self, body: bytes, status: int = 200, content_type="text/event-stream"):
        self.body, self.status, self.content_type = body, status, content_type
        self.requests: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "served"}]})
        self.requests.append(json.loads(request.content))
        return httpx.Response(
            self.status, content=self.body, headers={"content-type": self.content_type}
        )


@pytest.fixture
def generator_with():
    made = []

    def make(engine: Engine, **kw) -> RemoteGenerator:
        generator = RemoteGenerator(
            Endpoint.from_url(URL),
            stop_strings=["<|endoftext|>", "<|file_sep|>"],
            transport=httpx.MockTransport(engine),
            **kw,
        )
        made.append(generator)
        return generator

    yield make
    for generator in made:
        generator.close()


def test_the_request_is_a_raw_streamed_prompt(generator_with):
    engine = Engine(sse(piece("a"), piece(" + b", "length")))
    result = generator_with(engine).generate("PROMPT", max_tokens=7, top_p=0.9, seed=3)
    assert result.text == "a + b" and result.stop_reason == "max_tokens"
    assert engine.requests == [
        {
            "prompt": "PROMPT",
            "max_tokens": 7,
            "temperature": 0.0,
            "top_p": 0.9,
            "stream": True,
            "n": 1,
            "echo": False,
            "model": "served",
            "seed": 3,
            "stop": ["<|endoftext|>", "<|file_sep|>"],
        }
    ]


def test_pings_comments_and_multiline_data_are_read_as_server_sent_events(generator_with):
    body = (
        b': ping - 2026-01-01\r\n\r\nevent: message\r\ndata: {"choices": [{"text":\r\n'
        b'data: "x = 1", "finish_reason": "stop"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    )
    result = generator_with(Engine(body)).generate("p", max_tokens=4)
    assert result.text == "x = 1" and result.stop_reason == "eos"


def test_a_stop_string_the_engine_let_through_ends_the_text(generator_with):
    engine = Engine(sse(piece("done"), piece("<|file_sep|>other.py"), piece("more")))
    result = generator_with(engine).generate("p", max_tokens=20)
    assert result.text == "done" and result.stop_reason == "eos"


def test_the_stop_rule_sees_the_text_so_far_and_ends_the_stream(generator_with):
    seen: list[str] = []

    def stop(text: str) -> bool:
        seen.append(text)
        return "\n" in text

    engine = Engine(sse(piece("a"), piece("b\nc"), piece("never read")))
    result = generator_with(engine).generate("p", max_tokens=20, should_stop=stop)
    assert seen == ["a", "ab\nc"] and result.stop_reason == "stop"


def test_an_event_without_choices_carries_no_text(generator_with):
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    result = generator_with(Engine(sse(piece("x", "stop"), usage))).generate("p", max_tokens=4)
    assert result.text == "x" and result.stop_reason == "eos"


def test_a_finish_reason_without_the_end_marker_is_accepted(generator_with):
    result = generator_with(Engine(sse(piece("x", "stop"), done=False))).generate("p", max_tokens=4)
    assert result.text == "x"


@pytest.mark.parametrize(
    ("engine", "error", "words"),
    [
        (Engine(sse(piece("x"), done=False)), TruncatedStreamError, "broke off after 1 events"),
        (Engine(b'data: {"choices": [{"text": "x"'), TruncatedStreamError, "broke off"),
        (
            Engine(sse({"choices": [{"delta": {"content": "x"}}]})),
            MalformedStreamError,
            "chat format",
        ),
        (Engine(sse({"error": {"message": "CUDA OOM"}})), EngineServerError, "CUDA OOM"),
        (Engine(b"<html>hi</html>", content_type="text/html"), MalformedStreamError, "text/html"),
    ],
)
def test_broken_streams(generator_with, engine, error, words):
    with pytest.raises(error, match=words):
        generator_with(engine).generate("p", max_tokens=4)


def test_a_cancel_before_the_request_sends_nothing(generator_with):
    engine = Engine(sse(piece("x")))
    cancel = threading.Event()
    cancel.set()
    result = generator_with(engine).generate("p", max_tokens=4, cancel=cancel)
    assert result.stop_reason == "cancelled" and engine.requests == []


def test_the_key_is_sent_as_a_bearer_token_and_blanked_in_quoted_errors(generator_with):
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx.Response(500, json={"error": {"message": "bad key sk-123 here"}})

    generator = RemoteGenerator(
        Endpoint.from_url(URL),
        stop_strings=[],
        api_key="sk-123",
        api_key_env="TEAM_KEY",
        remote_model="m",
        transport=httpx.MockTransport(handler),
    )
    try:
        with pytest.raises(EngineServerError) as caught:
            generator.generate("p", max_tokens=1)
    finally:
        generator.close()
    assert seen[-1] == "Bearer sk-123"
    assert "sk-123" not in str(caught.value) and "bad key *** here" in str(caught.value)


# --- state -----------------------------------------------------------------------------------


class Down(RemoteEngineError):
    kind = "down"


def test_listeners_hear_changes_of_state_only():
    status = EngineStatus("http://e/v1")
    heard: list[str] = []
    assert status.subscribe(lambda state, message: heard.append(state)) == (
        "unknown",
        "the completion engine at http://e/v1 has not been asked yet",
    )
    status.record_success()
    status.record_failure(Down("first"))
    status.record_failure(Down("second"))
    status.record_success()
    status.record_success()
    assert heard == ["ready", "unavailable", "ready"]
    assert status.message == "the completion engine at http://e/v1 answers again"


# --- tokenizer and pipeline --------------------------------------------------------------------


def test_a_preset_without_tokenizer_files_says_how_to_get_them(tmp_path):
    from quickdraft.config import ModelConfig
    from quickdraft.remote import load_remote_models

    config = ModelConfig(backend="openai", url=URL, preset="qwen2.5-coder-7b")
    with pytest.raises(ModelNotFoundError) as caught:
        load_remote_models(config, home=tmp_path)
    message = str(caught.value)
    assert "quickdraft models fetch qwen2.5-coder-7b" in message and "--tokenizer" in message


def test_the_remote_pipeline_builds_the_local_prompt_and_post_processes(tmp_path):
    from quickdraft.completer import Completer, CompletionRequest
    from quickdraft.remote import RemoteBackend, load_remote_models
    from quickdraft.testing import build_tiny_tokenizer

    build_tiny_tokenizer().save_pretrained(tmp_path / "tok")
    config = load_config(
        remote(preset=None, tokenizer=str(tmp_path / "tok"), family="qwen2.5-coder")
    )
    models = load_remote_models(config.model)
    engine = Engine(sse(piece("b)\n"), piece("print(1)\n")))
    generator = RemoteGenerator(
        Endpoint.from_url(URL),
        stop_strings=models.stop_tokens,
        transport=httpx.MockTransport(engine),
    )
    completer = Completer(RemoteBackend(models, config, generator), config)
    try:
        text = "def f(a, b):\n    return max(a, \n"
        completer.set_document("file:///w/f.py", text, "python")
        completion = completer.complete(CompletionRequest("file:///w/f.py", text, 1, 18, "python"))
        assert completion.text == "b)"  # line mode: the stop rule ended it at the newline
        assert completion.stop_reason == "stop" and completion.stats.strategy == "remote"
        assert completion.tokens == models.tokenizer.encode("b)\n", add_special_tokens=False)
        [sent] = engine.requests
        assert sent["prompt"].startswith("<|fim_prefix|>") and "return max(a, " in sent["prompt"]
        assert sent["prompt"].endswith("<|fim_middle|>")
        # An engine cannot be held to healed characters: the cursor stays at the middle marker.
        assert config.context.layout == "pinned" and completer.config.context.layout == "classic"
    finally:
        completer.close()

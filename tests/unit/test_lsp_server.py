"""Server pieces without a client: the worker, malformed requests, completion items."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

from lsprotocol import types

from quickdraft.config import QuickdraftConfig
from quickdraft.lsp.assembly import create_server
from quickdraft.lsp.handlers.completion import completion_item
from quickdraft.lsp.server import MalformedRequest
from quickdraft.lsp.service import Answer, stats_payload
from quickdraft.lsp.status import WaitProgress, file_name
from quickdraft.lsp.worker import Loaded, ModelHost, ModelWorker


def test_worker_runs_jobs_in_order_on_its_thread():
    worker = ModelWorker(name="test-worker")
    seen = []
    futures = [
        worker.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
        for i in range(5)
    ]
    for future in futures:
        future.result(5)
    assert seen == [(i, "test-worker") for i in range(5)]
    worker.stop()
    assert worker.submit(lambda: 1).exception(1) is not None


def test_worker_skips_jobs_cancelled_before_they_start():
    worker = ModelWorker()
    gate = threading.Event()
    ran = []
    first = worker.submit(gate.wait, 5)
    second = worker.submit(ran.append, "second")
    assert second.cancel()
    gate.set()
    first.result(5)
    worker.submit(lambda: None).result(5)
    assert ran == []
    worker.stop()


def test_model_host_keeps_the_old_completer_when_a_reload_fails():
    class Completer:
        works_ahead = True
        engine_status = None
        compute = {"runtime": "fake"}

        def __init__(self, name):
            self.name, self.docs = name, {}
            self.models = SimpleNamespace(describe=lambda: {"target": name})

        def set_document(self, uri, text, language_id):
            self.docs[uri] = text

        def close_document(self, uri):
            self.docs.pop(uri)

        def describe(self):
            return f"fake {self.name}"

        def close(self):
            self.closed = True

    def loader(config, progress=None):
        if config.model.target == "bad":
            raise OSError("disk on fire\nmore detail")
        return Completer(config.model.target)

    host = ModelHost(loader)
    ok = QuickdraftConfig()
    ok.model.target = "one"
    host.load(ok)
    host.set_document("file:///a", "text", "python")
    bad = QuickdraftConfig()
    bad.model.target = "bad"
    try:
        host.load(bad)
    except Exception as exc:
        assert "OSError: disk on fire" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("load should fail")
    assert host.completer.name == "one" and host.load_error is None
    two = QuickdraftConfig()
    two.model.target = "two"
    loaded = host.load(two)
    assert host.completer.name == "two"
    # What the event loop is told, as values: it never reads the ModelHost.
    assert loaded.summary == "fake two" and loaded.models == {"target": "two"}
    assert loaded.config is two and loaded.works_ahead and loaded.engine_status is None
    assert host.completer.docs == {"file:///a": "text"}  # handed over to the new Completer


def test_malformed_request_becomes_invalid_params():
    server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
    sent = []
    server.protocol._send_data = sent.append
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "textDocument/inlineCompletion",
            "params": {"textDocument": {"uri": "file:///a"}, "position": {"line": "x"}},
        }
    )
    message = json.loads(body, object_hook=server.protocol.structure_message)
    assert isinstance(message, MalformedRequest)
    server.protocol.handle_message(message)
    [response] = sent
    assert response.id == 7
    assert response.error.code == types.ErrorCodes.InvalidParams
    assert "position" in response.error.message
    server.stop()


def test_malformed_notification_is_not_answered():
    """Through pygls' reading loop, as `serve` runs it: a notification whose params do not
    deserialize gets no response (it has no id), one error message says what was ignored, and
    the next message is read as usual."""
    import io

    from pygls.io_ import run

    server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
    sent = []
    server.protocol._send_data = sent.append
    bad = {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"x": 1}}
    good = {
        "jsonrpc": "2.0",
        "method": "textDocument/didOpen",
        "params": {
            "textDocument": {
                "uri": "file:///a.py",
                "languageId": "python",
                "version": 1,
                "text": "x",
            }
        },
    }
    stream = b""
    for message in (bad, good):
        body = json.dumps(message).encode()
        stream += b"Content-Length: %d\r\n\r\n" % len(body) + body
    run(
        threading.Event(),
        io.BytesIO(stream),
        server.protocol,
        error_handler=server.report_server_error,
    )
    [shown] = sent
    assert not hasattr(shown, "id") and shown.method == types.WINDOW_SHOW_MESSAGE
    assert shown.params.type == types.MessageType.Error
    assert shown.params.message.startswith(
        "quickdraft: ignored a textDocument/didOpen notification with invalid params: "
    )
    assert "params.text_document" in shown.params.message  # what was wrong with it
    assert server.documents.get("file:///a.py").text == "x"  # the next message was read
    server.stop()


def test_completion_item_label_is_the_first_line_with_text():
    here = types.Position(line=0, character=0)
    item = completion_item(Answer("\n    return x\n", here, here, here))
    assert item.label == "return x"
    assert item.text_edit.new_text == "\n    return x\n"
    item = completion_item(Answer("a" * 100 + "\nb", here, here, here))
    assert item.label.endswith("… …") and len(item.label) < 70
    assert completion_item(Answer("  ", here, here, here)).label == "(whitespace)"


def test_stats_payload():
    """From the engine's own GenerationStats (its to_dict), not a dict already shaped right."""
    from quickdraft.completer import Completion
    from quickdraft.decoding import GenerationStats

    engine_stats = GenerationStats(
        strategy="hybrid",
        prompt_tokens=500,
        prefill_tokens=100,
        reused_tokens=400,
        reused_shared_tokens=250,
        reused_warm_tokens=100,
        new_tokens=3,
        target_forwards=2,
        produced_tokens=5,
        drafted_by_source={"ngram": 10, "draft": 0},
        accepted_by_source={"ngram": 5},
    )

    completion = Completion(text="abc", tokens=[1, 2, 3], stats=engine_stats, mode="block")
    payload = stats_payload(completion, latency_ms=12.3456, source="model")
    assert payload["tokens"] == 3
    assert payload["acceptanceBySource"] == {"ngram": 0.5, "draft": 0.0}
    assert payload["prefillTokens"] == 100 and payload["reusedTokens"] == 400
    split = [payload[f"reused{k}Tokens"] for k in ("Shared", "Warm", "Own")]
    assert split == [250, 100, 50]
    assert payload["latencyMs"] == 12.346 and payload["mode"] == "block"
    assert payload["tokensPerForward"] == 2.5 and payload["targetForwards"] == 2
    assert payload["promptTokens"] == 500
    assert payload["engine"]["strategy"] == "hybrid"
    cached = stats_payload(None, latency_ms=0.1, source="typed-ahead")
    assert cached["tokens"] == 0 and cached["cached"] is True
    json.dumps(payload)


def test_worker_stop_ends_the_thread_and_a_running_background_job():
    """stop() wakes an idle worker (it waits on a condition with no timeout: not woken, it would
    never end) and stops a running background job through its cancel event. The join timeout
    only guards against a hang."""
    idle = ModelWorker()
    assert idle.thread.is_alive()
    idle.stop(timeout=30)
    assert not idle.thread.is_alive()

    busy = ModelWorker()
    running = threading.Event()

    def background(cancel):
        running.set()
        return "stopped" if cancel.wait(30) else "ran to its end"

    job = busy.submit_background(background)
    queued = busy.submit_background(background)
    assert running.wait(30)
    busy.stop(timeout=30)
    assert not busy.thread.is_alive()
    assert job.result(0) == "stopped" and queued.cancelled()


def test_background_jobs_run_when_idle_and_yield_to_a_request():
    worker = ModelWorker()
    order: list[str] = []
    release = threading.Event()
    started = threading.Event()

    def background(name, cancel):
        order.append(f"{name} start")
        started.set()
        # A stand-in for a prefill: one "forward" per 10 ms, checking cancel between them.
        for _ in range(500):
            if cancel.is_set():
                order.append(f"{name} stopped")
                return "stopped"
            release.wait(0.01)
        order.append(f"{name} done")
        return "done"

    first = worker.submit_background(background, "warm")
    assert started.wait(5)
    request = worker.submit(lambda: order.append("request") or "answered", preempt=True)
    assert request.result(5) == "answered" and first.result(5) == "stopped"
    assert order == ["warm start", "warm stopped", "request"]
    assert worker.preemptions == 1
    # A plain (not preempting) job, e.g. a document sync, waits for the background job.
    started.clear()
    second = worker.submit_background(background, "prefetch")
    assert started.wait(5)
    sync = worker.submit(lambda: order.append("sync"))
    release.set()
    assert second.result(10) == "done" and sync.result(5) is None
    assert order[-2:] == ["prefetch done", "sync"] and worker.preemptions == 1
    # Foreground jobs go first whatever was queued earlier in the background.
    gate = threading.Event()
    worker.submit(gate.wait, 5)
    later = worker.submit_background(lambda cancel: order.append("late background"))
    early = worker.submit(lambda: order.append("foreground"))
    gate.set()
    early.result(5)
    later.result(5)
    assert order[-2:] == ["foreground", "late background"]
    worker.stop()


def test_a_running_background_job_can_be_preempted_without_a_foreground_job():
    """didFocus on another document stops the prefetch or warm-up that is running."""
    worker = ModelWorker()
    started = threading.Event()

    def background(cancel):
        started.set()
        return "stopped" if cancel.wait(30) else "done"

    job = worker.submit_background(background)
    queued = worker.submit_background(lambda cancel: "queued ran")
    assert started.wait(5)
    worker.preempt_background()
    assert job.result(5) == "stopped" and worker.preemptions == 1
    assert queued.result(5) == "queued ran"  # queued jobs stay queued
    worker.preempt_background()  # nothing running: nothing to count
    assert worker.preemptions == 1
    worker.stop()


def test_a_background_job_can_go_first_and_stop_only_the_job_it_names():
    """A next edit decided ahead goes before the work ahead queued, and stops a running
    warm-up, but never another kind of job (a prefetch)."""
    worker = ModelWorker()
    order = []
    started = threading.Event()
    gate = threading.Event()

    def background(name, cancel):
        order.append(name)
        started.set()
        return "stopped" if cancel.wait(gate.wait(30) and 0.05) else "done"

    prefetch = worker.submit_background(background, "prefetch")
    assert started.wait(5)
    warm = worker.submit_background(background, "warm")
    ahead = worker.submit_background(background, "ahead", first=True)
    worker.preempt_background(warm)  # the warm-up is not the job running: nothing stops
    assert worker.preemptions == 0
    gate.set()
    assert prefetch.result(5) == "done" and ahead.result(5) == "done"
    assert warm.result(5) == "done" and order == ["prefetch", "ahead", "warm"]
    gate.clear()
    started.clear()
    running = worker.submit_background(background, "warm again")
    assert started.wait(5)
    worker.preempt_background(prefetch, running)
    gate.set()
    assert running.result(5) == "stopped" and worker.preemptions == 1
    worker.stop()


def test_each_log_line_is_logged_at_the_level_it_is_sent_at(caplog):
    """README: each server log line carries its level (a client reads stderr's levels)."""
    import logging

    server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
    with caplog.at_level(logging.DEBUG, logger="quickdraft.lsp.server"):
        server.log("a warning", "warning")
        server.log("an error", "error")
        server.log("some info")
        server.log("detail", "log")
        server.show("shown as a warning", "warning")
        server.show("shown as an error")
    levels = {r.getMessage(): r.levelname for r in caplog.records if r.name.endswith("server")}
    assert levels == {
        "a warning": "WARNING",
        "an error": "ERROR",
        "some info": "INFO",
        "detail": "DEBUG",
        "shown as a warning": "WARNING",
        "shown as an error": "ERROR",
    }
    server.stop()


async def warm_ups_done(server) -> None:
    """The warm-ups run on the worker while it is idle: wait until none is queued or running."""
    deadline = time.monotonic() + 10
    while server.work_ahead._warm_targets or server.work_ahead._warming:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)  # pacing: polls the worker's warm-up state


def loaded(*, works_ahead: bool) -> Loaded:
    """What a finished load would have told the event loop, for a server driven by hand."""
    return Loaded(
        summary="fake models",
        config=QuickdraftConfig(),
        models={},
        compute={},
        works_ahead=works_ahead,
        engine_status=None,
        loaded_at=0.0,
    )


def test_warm_up_builds_no_prompt_for_a_serving_engine():
    """A backend that does not work ahead (a serving engine keeps no caches of ours) gets no
    idle warm-up: no prompt is built and tokenized for it (counted here); local models warm."""

    class Counting:
        def __init__(self, works_ahead: bool):
            self.warmed = 0
            self.works_ahead = works_ahead

        def warm(self, request, cancel=None, file_level=False):
            self.warmed += 1  # the real Completer builds and tokenizes the prompt here
            return 0

    def warmed(works_ahead: bool) -> int:
        server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
        counting = Counting(works_ahead)
        server.host.completer = counting
        server.serving = loaded(works_ahead=counting.works_ahead)
        server.documents.open("file:///a.py", "x = 1\n", "python", 1)

        async def scenario():
            server.work_ahead.schedule_warm("file:///a.py")
            await warm_ups_done(server)

        asyncio.run(scenario())
        server.stop()
        return counting.warmed

    assert warmed(works_ahead=True) == 1
    assert warmed(works_ahead=False) == 0


def test_a_burst_of_changes_is_one_update_with_the_latest_text():
    """The worker's update of a document carries the text read on the event loop at the last
    change before it ran (one update for the burst); a document closed meanwhile is not
    updated, and one opened again is."""
    server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
    seen = []
    server.host.set_document = lambda uri, text, language_id: seen.append((uri, text))
    busy = threading.Event()
    server.worker.submit(busy.wait)
    a = server.documents.open("file:///a.py", "x", "python", 1)
    server.sync_document(a, opened=True)
    server.documents.change("file:///a.py", [("x = 1", None)], 2)
    server.sync_document(a)
    b = server.documents.open("file:///b.py", "y", "python", 1)
    server.sync_document(b, opened=True)
    server.documents.close("file:///b.py")
    server.forget_document("file:///b.py")
    busy.set()
    server.worker.submit(lambda: None).result(5)
    assert seen == [("file:///a.py", "x = 1")]
    b = server.documents.open("file:///b.py", "y = 2", "python", 1)
    server.sync_document(b, opened=True)
    server.worker.submit(lambda: None).result(5)
    assert seen[-1] == ("file:///b.py", "y = 2")
    server.stop()


def test_a_stopped_warm_up_goes_on_first_unless_the_person_moved_on():
    """A warm-up stopped by a job that had to run is queued again by the event loop: first, or,
    when another document is focused, after the others."""

    class StoppedOnce:
        def __init__(self):
            self.warmed = []

        def warm(self, request, cancel=None, file_level=False):
            self.warmed.append(request.uri)
            if len(self.warmed) == 1:
                cancel.set()  # as a request arriving would
            return 0

    def order(focused) -> list[str]:
        server = create_server(QuickdraftConfig(), loader=lambda config, progress=None: None)
        server.host.completer = StoppedOnce()
        server.serving = loaded(works_ahead=True)  # local models
        for name in ("a", "b"):
            server.documents.open(f"file:///{name}.py", "x = 1\n", "python", 1)
        server.work_ahead.focused = focused

        async def scenario():
            server.work_ahead.schedule_warm("file:///a.py")
            server.work_ahead.schedule_warm("file:///b.py", first=False)
            await warm_ups_done(server)

        asyncio.run(scenario())
        server.stop()
        return [uri[len("file:///") :] for uri in server.host.completer.warmed]

    assert order(None) == ["a.py", "a.py", "b.py"]
    assert order("file:///b.py") == ["a.py", "b.py", "a.py"]


def test_a_wait_names_the_file_as_a_person_does():
    assert file_name("file:///work/my%20app/m%C3%A9tier.py") == "métier.py"
    assert file_name("untitled:Untitled-1") == "Untitled-1"
    assert file_name("file:///work/a.py") == "a.py"


def test_a_wait_says_what_is_done_for_the_file():
    """Queued, reading (a prefill of several chunks), then what the request is for: a
    suggestion is written; a next edit is prepared (the model checks a rule's candidate, or
    writes one)."""
    wait = WaitProgress(None, None, "1", "file:///w/app.py", doing="preparing a next edit")
    assert wait.message() == "waiting for the model to finish other work"
    wait.prefilling(128, 1280)
    assert wait.message() == "reading app.py: 128 of 1,280 tokens"
    wait.prefilling(1280, 1280)
    assert wait.message() == "preparing a next edit for app.py"
    suggestion = WaitProgress(None, None, "2", "file:///w/app.py")
    suggestion.prefilling(1280, 1280)
    assert suggestion.message() == "writing a suggestion for app.py"

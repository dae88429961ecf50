"""A prefill of more than one chunk reports how far it has got to whoever listens on its thread
(`quickdraft.prefill_progress`): the language server shows a long one."""

from __future__ import annotations

import threading

import pytest
import torch

from quickdraft import prefill_progress
from quickdraft.decoding.runner import ModelRunner
from quickdraft.testing import build_tiny_int8_model, build_tiny_tokenizer

PROMPT = list(range(10, 150))  # 140 tokens: chunks of 64 end at 64, 128, 140


@pytest.fixture(scope="module")
def target():
    return build_tiny_int8_model(len(build_tiny_tokenizer()))


def test_each_chunk_of_a_long_prefill_is_reported_counting_only_new_tokens(target):
    runner = ModelRunner(target, prefill_chunk=64)
    heard: list[tuple[int, int]] = []
    with prefill_progress.listening(lambda computed, total: heard.append((computed, total))):
        runner.extend(PROMPT)
        assert heard == [(0, 140), (64, 140), (128, 140), (140, 140)]
        # Warm: the cached 140 are reused, and a prefill within one chunk says nothing.
        heard.clear()
        runner.extend([*PROMPT, *range(20, 60)])
        assert heard == []
        # A chunk holds at most 64 and ends on a multiple of 32 (but the last): 180 -> 224
        # -> 260.
        runner.extend([*PROMPT, *range(20, 140)])
        assert heard == [(0, 80), (44, 80), (80, 80)]


def test_a_warm_tail_that_fits_one_chunk_is_one_forward_across_a_chunk_boundary(target):
    runner = ModelRunner(target, prefill_chunk=64)
    runner.extend(PROMPT[:120])
    sizes: list[int] = []
    forward = runner.forward
    runner.forward = lambda tokens, **kwargs: sizes.append(len(tokens)) or forward(tokens, **kwargs)
    _, computed, warm = runner.extend(PROMPT)  # 120 -> 140 crosses 128
    assert computed == 20 and sizes == [20]
    _, _, cold = ModelRunner(target, prefill_chunk=64).extend(PROMPT)
    assert torch.equal(warm, cold)


def test_nobody_listening_and_other_threads_hear_nothing(target):
    runner = ModelRunner(target, prefill_chunk=64)
    heard: list[tuple[int, int]] = []
    runner.extend(PROMPT)  # nobody listens: no error, nothing kept

    def elsewhere():
        ModelRunner(target, prefill_chunk=64).extend(PROMPT)

    with prefill_progress.listening(lambda computed, total: heard.append((computed, total))):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert heard == []

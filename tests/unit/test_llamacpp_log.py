"""llama.cpp's log reaches Python's logging at its own level, each kind of warning once."""

from __future__ import annotations

import logging

from quickdraft.decoding import llamacpp


def test_llama_cpp_lines_keep_their_level_and_each_warning_kind_is_said_once(caplog, monkeypatch):
    monkeypatch.setattr(llamacpp, "_warned", set())
    caplog.set_level(logging.DEBUG, logger=llamacpp.log.name)
    llamacpp.log_llama_cpp(2, "llama_model_loader: loaded meta data with 30 key-value pairs\n")
    llamacpp.log_llama_cpp(3, "load: control-looking token: 128247 '</s>' was not control-type\n")
    llamacpp.log_llama_cpp(3, "load: control-looking token: 128244 '<unk>' was not control-type\n")
    llamacpp.log_llama_cpp(3, "llama_context: n_ctx_per_seq (4096) < n_ctx_train (32768)\n")
    llamacpp.log_llama_cpp(4, "llama_decode: failed to decode, ret = -1\n")
    llamacpp.log_llama_cpp(5, ".")  # a continuation of the line before
    llamacpp.log_llama_cpp(3, "   \n")  # nothing to say
    levels = [(r.levelname, r.getMessage().split(": ", 2)[1]) for r in caplog.records]
    assert levels == [
        ("DEBUG", "llama_model_loader"),
        ("WARNING", "load"),
        ("DEBUG", "load"),  # the same kind of warning again: detail
        ("WARNING", "llama_context"),
        ("ERROR", "llama_decode"),
        ("DEBUG", "."),
    ]

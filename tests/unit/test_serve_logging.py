"""`quickdraft serve` routes libraries' output through Python's logging, at their own level."""

from __future__ import annotations

import logging

from transformers.utils import logging as hf_logging

from quickdraft.lsp.cli import route_library_output


def test_transformers_records_reach_the_servers_log_at_their_level(caplog, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "")  # route_library_output only sets what is unset
    hf_logging.disable_propagation()
    hf_logging.enable_default_handler()
    try:
        caplog.set_level(logging.INFO)
        assert hf_logging._default_handler in hf_logging.get_logger().handlers  # its own, bare
        route_library_output()
        hf_logging.get_logger("transformers.quickdraft_test").warning("after")
        records = [r for r in caplog.records if r.getMessage() == "after"]
        assert records and {r.levelname for r in records} == {"WARNING"}
        library_logger = hf_logging.get_logger()
        assert hf_logging._default_handler not in library_logger.handlers  # no bare stderr line
        assert library_logger.propagate
    finally:
        hf_logging.enable_default_handler()
        hf_logging.disable_propagation()

"""Reading the params of requests pygls has no types for (`textDocument/didFocus`,
`textDocument/copilotInlineEdit`, command arguments): they arrive as plain objects or dicts."""

from __future__ import annotations

from typing import Any


def param(value: Any, name: str) -> Any:
    """`value.name` or `value[name]`, None where it is missing."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)

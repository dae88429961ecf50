"""Prompt building: FIM templates per model family, tree-sitter helpers, snippets, budgets."""

from quickdraft.context.fim import FIM_FAMILIES, FimTemplate, get_fim_template
from quickdraft.context.prompt import Prompt, build_prompt, check_position, split_lines
from quickdraft.context.snippets import OpenDocument, Snippet, select_snippets

__all__ = [
    "FIM_FAMILIES",
    "FimTemplate",
    "OpenDocument",
    "Prompt",
    "Snippet",
    "build_prompt",
    "check_position",
    "get_fim_template",
    "select_snippets",
    "split_lines",
]

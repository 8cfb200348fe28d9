"""vLLM 0.32's import path for the tool-call parsers and their registry.

The parsers live in `vllm.entrypoints.openai.tool_parsers` (imported on first use, see
there); this package re-exports the registry and, lazily, every public class.
"""
from __future__ import annotations

from typing import Any

from vllm.entrypoints.openai import tool_parsers as _parsers
from vllm.entrypoints.openai.tool_parsers import ToolParserManager  # noqa: F401


def __getattr__(name: str) -> Any:
    """ToolParser and the parser classes, from their home package on first use."""
    return getattr(_parsers, name)


__all__ = list(_parsers.__all__)

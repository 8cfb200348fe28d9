"""Jamba 1.5 format: one section `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class JambaToolParser(TaggedJsonToolParser):
    start_markers = ("<tool_calls>",)
    end_marker = "</tool_calls>"
    layout = "section"

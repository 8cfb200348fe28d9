"""Granite 3.x format: `<|tool_call|>` (3.0) or `<tool_call>` (3.1+) followed by a JSON list
`[{"name": ..., "arguments": {...}}, ...]` up to the end of the output."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class GraniteToolParser(TaggedJsonToolParser):
    start_markers = ("<|tool_call|>", "<tool_call>")
    layout = "section"

"""ERNIE-4.5 format: Hermes's tags, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call (the answer before them is content)."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class Ernie45ToolParser(TaggedJsonToolParser):
    start_markers = ("<tool_call>",)
    end_marker = "</tool_call>"

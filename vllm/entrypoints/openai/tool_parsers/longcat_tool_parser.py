"""LongCat-Flash format: Hermes's layout with its own tags,
`<longcat_tool_call>{"name": ..., "arguments": {...}}</longcat_tool_call>`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class LongcatFlashToolParser(TaggedJsonToolParser):
    start_markers = ("<longcat_tool_call>",)
    end_marker = "</longcat_tool_call>"

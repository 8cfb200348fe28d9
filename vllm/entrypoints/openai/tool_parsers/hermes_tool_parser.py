"""Hermes / Qwen format: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser

START, END = "<tool_call>", "</tool_call>"


class Hermes2ProToolParser(TaggedJsonToolParser):
    start_markers = (START,)
    end_marker = END

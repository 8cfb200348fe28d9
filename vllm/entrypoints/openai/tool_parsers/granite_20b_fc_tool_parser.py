"""Granite-20B-FunctionCalling format (`granite-20b-fc`): each call is
`<function_call> {"name": ..., "arguments": {...}}`, with no closing tag: a call ends where
the next `<function_call>` (or the output) does."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class Granite20bFCToolParser(TaggedJsonToolParser):
    start_markers = ("<function_call>",)
    end_marker = ""

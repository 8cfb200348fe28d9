"""GigaChat3 format: `function call{"name": ..., "arguments": {...}}`, the JSON optionally
after the role separator: `function call<|role_sep|>\n{...}`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class GigaChat3ToolParser(TaggedJsonToolParser):
    start_markers = ("function call",)
    layout = "section"
    body_prefixes = ("<|role_sep|>",)
    strict_begin = "function call<|role_sep|>\n"

"""Phi-4-mini format (`phi4_mini_json`): `functools[{"name": ..., "arguments": {...}}, ...]`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class Phi4MiniJsonToolParser(TaggedJsonToolParser):
    start_markers = ("functools",)
    layout = "section"

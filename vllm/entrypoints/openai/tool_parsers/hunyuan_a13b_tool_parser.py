"""Hunyuan-A13B format: one section `<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>`
after the answer (which its reasoning parser has already taken out of `<answer>`)."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class HunyuanA13BToolParser(TaggedJsonToolParser):
    start_markers = ("<tool_calls>",)
    end_marker = "</tool_calls>"
    layout = "section"

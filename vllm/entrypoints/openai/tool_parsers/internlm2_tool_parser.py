"""InternLM2 / 2.5 format (`--tool-call-parser internlm`):
`<|action_start|><|plugin|>\n{"name": ..., "parameters": {...}}<|action_end|>`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class Internlm2ToolParser(TaggedJsonToolParser):
    start_markers = ("<|action_start|><|plugin|>",)
    end_marker = "<|action_end|>"

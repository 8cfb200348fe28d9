"""Mistral format: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} objects."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (PartialCall, ToolParser,
                                                                       mistral_tool_call_id)
from vllm.entrypoints.openai.tool_parsers.json_calls import call_from_object, load_json


class MistralToolParser(ToolParser):
    start_marker = "[TOOL_CALLS]"

    def make_tool_call_id(self) -> str:
        return mistral_tool_call_id()

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        text = tool_text.strip()
        if final:
            value = load_json(text, final=True)
            items = value if isinstance(value, list) else [value]
            return [call_from_object(item, True) for item in items]
        value = load_json(text, final=False)
        if value is None:
            return []
        items = value if isinstance(value, list) else [value]
        # All but the last element are complete once a later one has started.
        return [call_from_object(item, i < len(items) - 1)
                for i, item in enumerate(items) if isinstance(item, dict)]

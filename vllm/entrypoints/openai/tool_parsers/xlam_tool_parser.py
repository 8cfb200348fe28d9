"""xLAM format: a JSON list `[{"name": ..., "arguments": {...}}, ...]`, written bare as the
whole output, or after `[TOOL_CALLS]`, inside `<tool_call>...</tool_call>`, or in a
```json fence (the models vary by size and fine-tune)."""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall
from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser, stripped_of

CLOSERS = ("</tool_call>", "```")


class xLAMToolParser(TaggedJsonToolParser):  # noqa: N801 - vLLM's class name
    start_markers = ("[TOOL_CALLS]", "<tool_call>", "```json")
    layout = "section"

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        head = text.lstrip()
        if head.startswith("[") and not head.startswith("[TOOL_CALLS]"):
            if final or not "[TOOL_CALLS]".startswith(head):
                return "", head  # the bare list is the whole output
        return super().split(text, final)

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        return self._section_calls(stripped_of(tool_text, CLOSERS, final), final)

"""Llama 4 pythonic format: the pythonic list `[f(a=1), g()]`, optionally wrapped in
`<|python_start|>` ... `<|python_end|>`."""
from __future__ import annotations

from typing import Any, Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser
from vllm.entrypoints.openai.tool_parsers.pythonic_tool_parser import PythonicToolParser
from vllm.entrypoints.openai.tool_parsers.tagged_json import stripped_of

START, END = "<|python_start|>", "<|python_end|>"


class Llama4PythonicToolParser(PythonicToolParser):

    def adjust_request(self, request: Any) -> Any:
        """The tags are special tokens: keep them in the text."""
        return ToolParser.adjust_request(self, request)

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        head = text.lstrip()
        if head.startswith(START):
            return "", head[len(START):]
        if not final and head and START.startswith(head):
            return "", None  # the start tag is still arriving
        return super().split(text, final)

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        return super().parse_calls(stripped_of(tool_text, (END,), final), final)

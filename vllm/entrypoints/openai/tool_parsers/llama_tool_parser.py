"""Llama 3.x JSON format: `{"name": ..., "parameters": {...}}`, several separated by `;`,
optionally after `<|python_tag|>`; the whole output is the call(s)."""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser
from vllm.entrypoints.openai.tool_parsers.json_calls import call_from_object, iter_json_values

BOT = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        head = text.lstrip()
        if head.startswith(BOT):
            return "", head[len(BOT):]
        if head.startswith("{"):
            return "", head
        if not final and (not head or BOT.startswith(head)):
            return "", None  # may still become a call
        return text, None

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls = []
        for value, complete in iter_json_values(tool_text):
            if value is None:
                break
            calls.append(call_from_object(value, complete or final))
        return calls

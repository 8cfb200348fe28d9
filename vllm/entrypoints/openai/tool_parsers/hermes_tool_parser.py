"""Hermes / Qwen format: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser
from vllm.entrypoints.openai.tool_parsers.json_calls import call_from_object, load_json

START, END = "<tool_call>", "</tool_call>"


class Hermes2ProToolParser(ToolParser):
    start_marker = START

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls = []
        for block in (START + tool_text).split(START)[1:]:
            body, closed, _ = block.partition(END)
            if not body.strip() and not closed:
                continue
            complete = bool(closed) or final
            obj = load_json(body.strip(), final=complete)
            if obj is None:
                break
            calls.append(call_from_object(obj, complete))
        return calls

"""GPT-OSS (`openai`): tool calls are harmony `commentary` messages addressed
`to=functions.NAME`, their content the arguments' JSON:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

(the recipient may also stand before the channel: `<|start|>assistant to=functions.NAME
<|channel|>commentary json<|message|>...`). `<|call|>` stops generation, so the last
call usually ends with the text. The content is what is not a call: the `final`
message and `commentary` preambles; `analysis` messages (reasoning) are dropped here,
they are the `openai_gptoss` reasoning parser's. Text with no harmony structure is
content.

Strict tools under tool_choice "auto" are not enforced for this format: with the
`openai_gptoss` reasoning parser, grammars start after the reasoning, which in harmony
is at the final answer, after any call (logged as for other such formats).
"""
from __future__ import annotations

import json
from typing import Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCallInformation, PartialCall, ToolParser)
from vllm.reasoning.harmony import HarmonyMessage, held_suffix, is_harmony, parse_harmony


class OpenAIToolParser(ToolParser):

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        """(content, the text from the first call on); a call's header is known only
        once its `<|message|>` arrived, so content stops growing there."""
        if not is_harmony(text):
            return (text, None) if final else (text[:len(text) - held_suffix(text)], None)
        content: list[str] = []
        for seg in parse_harmony(text, final):
            if isinstance(seg, HarmonyMessage) and seg.tool_name is not None:
                return "".join(content), text
            if not isinstance(seg, HarmonyMessage):
                content.append(seg)
            elif seg.channel != "analysis":
                content.append(seg.content)
        return "".join(content), None

    def extract_tool_calls(self, model_output: str, request: object = None
                           ) -> ExtractedToolCallInformation:
        """As the base, but an output without calls answers with its harmony content
        (the final message, preambles), not the raw text."""
        content, tool_text = self.split(model_output, final=True)
        if tool_text is None:
            return ExtractedToolCallInformation(False, content=content or None)
        return super().extract_tool_calls(model_output, request)

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls: list[PartialCall] = []
        for seg in parse_harmony(tool_text, final):
            if not isinstance(seg, HarmonyMessage) or seg.tool_name is None:
                continue
            args = seg.content.strip()
            if final or seg.closed:
                if args and not _is_json_object(args):
                    raise ValueError(f"arguments of {seg.tool_name} are not a JSON object")
                calls.append(PartialCall(seg.tool_name, complete=True,
                                         arguments_text=args or "{}"))
            else:
                calls.append(PartialCall(seg.tool_name, complete=False,
                                         arguments_text=seg.content.lstrip()))
        if final and not calls:
            raise ValueError("no tool call in the tool-call text")
        return calls


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False

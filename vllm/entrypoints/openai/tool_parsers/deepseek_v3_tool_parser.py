"""DeepSeek-V3 / R1 format (`--tool-call-parser deepseek_v3`):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"arg": ...}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(the markers are special tokens of the DeepSeek tokenizer, spelled with a full-width
bar and U+2581). A call's name is known once the line after `<｜tool▁sep｜>` ends; its
arguments are the JSON between the ```json fence and the closing fence.
"""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser
from vllm.entrypoints.openai.tool_parsers.json_calls import load_json
from vllm.entrypoints.openai.tool_parsers import structural_tags as st

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
OPEN_FENCE = "```json"
CLOSE_FENCE = "```"


class DeepSeekV3ToolParser(ToolParser):
    start_marker = CALLS_BEGIN

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        text = tool_text.split(CALLS_END, 1)[0]
        calls: list[PartialCall] = []
        for chunk in text.split(CALL_BEGIN)[1:]:
            complete = CALL_END in chunk
            call = self._parse_call(chunk.split(CALL_END, 1)[0], complete or final)
            if call is None:
                break
            calls.append(call)
            if not complete:
                break
        if final and not calls:
            raise ValueError("no complete DeepSeek tool call in the tool-call section")
        return calls

    @staticmethod
    def _parse_call(body: str, complete: bool) -> PartialCall | None:
        """One call from the text between its begin and end markers (None: nothing
        usable yet). Raises ValueError for a complete call that is malformed."""
        if SEP not in body:
            if complete:
                raise ValueError(f"tool call without {SEP!r}: {body!r}")
            return None
        _type, rest = body.split(SEP, 1)
        name, newline, args = rest.partition("\n")
        if not newline:
            if complete:
                raise ValueError(f"tool call {rest!r} has no arguments block")
            return None
        args = args.strip()
        if args.startswith(OPEN_FENCE):
            args = args[len(OPEN_FENCE):]
        elif OPEN_FENCE.startswith(args):  # the fence itself is still streaming
            args = ""
        if complete:
            args = args.strip()
            if args.endswith(CLOSE_FENCE):
                args = args[:-len(CLOSE_FENCE)]
            value = load_json(args, final=True)
            if not isinstance(value, dict):
                raise ValueError("tool call arguments must be a JSON object")
            return PartialCall(name=name.strip(), arguments=value, complete=True)
        fence = args.rfind("\n" + CLOSE_FENCE[:1])
        if fence >= 0 and CLOSE_FENCE.startswith(args[fence + 1:].rstrip()):
            args = args[:fence]  # a closing fence that is still streaming
        value = load_json(args, final=False)
        return PartialCall(name=name.strip(), arguments=value if isinstance(value, dict)
                           else None, complete=False)

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """The calls section: each call `function<sep>NAME` and its JSON in a fence."""
        return st.triggered([CALLS_BEGIN], [st.section(CALLS_BEGIN, [
            st.tag(f"{CALL_BEGIN}function{SEP}{name}\n{OPEN_FENCE}\n", st.arguments(schema),
                   f"\n{CLOSE_FENCE}{CALL_END}") for name, schema in tools], CALLS_END, "\n")])

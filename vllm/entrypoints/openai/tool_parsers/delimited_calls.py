"""The "special-token delimited" family: a section of calls, each
`CALL_BEGIN header ARGS_SEP {json arguments} CALL_END`, where the header names the function
(DeepSeek-V3.1: the name; Kimi-K2: `functions.NAME:INDEX`, also the call's id).

The arguments are passed on as the model wrote them, so a stream sends each character
once and the streamed text equals the final one.
"""
from __future__ import annotations

import json
from typing import Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (PartialCall, ToolParser,
                                                                       _partial_suffix_len)


class DelimitedToolParser(ToolParser):
    """Subclasses set the markers (`start_marker` opens the section) and may read the
    header differently (`read_header`)."""

    section_end: str = ""
    call_begin: str = ""
    call_end: str = ""
    args_sep: str = ""

    def read_header(self, header: str) -> tuple[str, Optional[str]]:
        """(function name, call id or None) from the text before `args_sep`."""
        return header.strip(), None

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        text = tool_text.split(self.section_end, 1)[0]
        calls: list[PartialCall] = []
        for chunk in text.split(self.call_begin)[1:]:
            body, closed, _ = chunk.partition(self.call_end)
            complete = bool(closed) or final
            if self.args_sep not in body:
                if complete:
                    raise ValueError(f"tool call without {self.args_sep!r}: {body!r}")
                break
            header, args = body.split(self.args_sep, 1)
            name, call_id = self.read_header(header)
            if complete:
                args = args.strip()
                if not isinstance(json.loads(args), dict):
                    raise ValueError("tool call arguments must be a JSON object")
            else:
                args = args[:len(args) - _partial_suffix_len(args, self.call_end)].strip()
            calls.append(PartialCall(name, complete=complete, arguments_text=args,
                                     call_id=call_id))
            if not complete:
                break
        if final and not calls:
            raise ValueError("no tool call in the tool-call section")
        return calls

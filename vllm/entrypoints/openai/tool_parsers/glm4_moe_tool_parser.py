"""GLM-4.5 / 4.6 format (`glm45`): each call in its own tags, the name first, then one
key element and one value element per argument:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are raw text typed by the tool's JSON schema, as in the XML-ish family (GLM's
template writes strings as they are and other values as JSON). GLM-4.6 may write the
first `<arg_key>` right after the name, without the newline.
"""
from __future__ import annotations

import re
from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall
from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser

_CALL_END = "</tool_call>"
_NAME_END = re.compile(r"\n|<arg_key>")


class Glm4MoeModelToolParser(XmlToolParser):
    start_marker = "<tool_call>"
    parameter_open = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>", re.S)
    parameter_close = "</arg_value>"

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls: list[PartialCall] = []
        for segment in tool_text.split(self.start_marker):
            body, closed, _ = segment.partition(_CALL_END)
            end = _NAME_END.search(body)
            if end is None and not closed:
                if final and body.strip():
                    raise ValueError("tool call is not closed")
                break  # the name is still arriving
            name = (body[:end.start()] if end else body).strip()
            if not name:
                if final:
                    raise ValueError("tool call without a function name")
                break
            args_text = body[end.start():] if end else ""
            if final and not closed:
                raise ValueError(f"tool call {name!r} is not closed")
            calls.append(PartialCall(name, self._arguments(name, args_text, bool(closed)),
                                     complete=bool(closed)))
            if not closed:
                break
        if final and not calls:
            raise ValueError("no tool call in the tool-call text")
        return calls

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """Each call `<tool_call>NAME`, its arguments as GLM's key/value elements."""
        return st.triggered([self.start_marker], [
            st.tag(f"{self.start_marker}{name}", st.arguments(schema, "glm_xml"), _CALL_END)
            for name, schema in tools])

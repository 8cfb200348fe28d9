"""Mistral format: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} objects
(tokenizers up to v7), or, from v11 on, one `[TOOL_CALLS]NAME[ARGS]{...}` per call
(v11 puts `[CALL_ID]ID` before `[ARGS]`; v13 and later leave the id out)."""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (PartialCall, ToolParser,
                                                                       mistral_tool_call_id)
from vllm.entrypoints.openai.tool_parsers.json_calls import call_from_object, load_json


class MistralToolParser(ToolParser):
    start_marker = "[TOOL_CALLS]"

    def make_tool_call_id(self) -> str:
        return mistral_tool_call_id()

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """`[TOOL_CALLS]` then a JSON list of calls; with a v11+ Mistral tokenizer
        (--tokenizer-mode mistral) one `[TOOL_CALLS]NAME[ARGS]{...}` per call."""
        version = str(getattr(self.tokenizer, "version", "v0"))
        if version[1:].isdigit() and int(version[1:]) >= 11:
            return st.triggered([self.start_marker], [
                st.tag(f"{self.start_marker}{name}{_ARGS}", st.arguments(schema), "")
                for name, schema in tools])
        return st.triggered([self.start_marker], [st.tag(
            self.start_marker, st.arguments(st.call_list_schema(tools)), "")])

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        text = tool_text.strip()
        if text and text[0] not in "[{":
            return _parse_named_calls(tool_text, final)
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


_ARGS, _CALL_ID = "[ARGS]", "[CALL_ID]"


def _parse_named_calls(tool_text: str, final: bool) -> list[PartialCall]:
    """v11+: `NAME[CALL_ID]ID[ARGS]{...}` calls separated by `[TOOL_CALLS]`; while
    streaming, a call's name and id are reported once `[ARGS]` closes them."""
    calls = []
    segments = tool_text.split(MistralToolParser.start_marker)
    for i, segment in enumerate(segments):
        complete = final or i < len(segments) - 1
        head, sep, args_text = segment.partition(_ARGS)
        name, _, call_id = head.partition(_CALL_ID)
        name = name.strip()
        if not sep:
            if complete:
                raise ValueError(f"a Mistral tool call without {_ARGS}: {segment!r}")
            break  # the name (and a v11 id) is known once [ARGS] follows
        if not name:
            raise ValueError("a Mistral tool call without a name")
        args = load_json(args_text.strip(), final=complete)
        if complete and not isinstance(args, dict):
            raise ValueError("tool call arguments must be a JSON object")
        calls.append(PartialCall(name=name, arguments=args if isinstance(args, dict) else None,
                                 complete=complete, call_id=call_id.strip() or None))
    return calls

"""Kimi-K2 format:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    {"arg": ...}<|tool_call_end|>...<|tool_calls_section_end|>

The header `functions.NAME:INDEX` is also the call's id (the template writes it back into
the next turn's tool messages, so it is kept as the model wrote it).
"""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.delimited_calls import DelimitedToolParser


class KimiK2ToolParser(DelimitedToolParser):
    start_marker = "<|tool_calls_section_begin|>"
    section_end = "<|tool_calls_section_end|>"
    call_begin = "<|tool_call_begin|>"
    call_end = "<|tool_call_end|>"
    args_sep = "<|tool_call_argument_begin|>"

    def read_header(self, header: str) -> tuple[str, Optional[str]]:
        call_id = header.strip()
        name = call_id.rsplit(":", 1)[0] if ":" in call_id else call_id
        if name.startswith("functions."):
            name = name[len("functions."):]
        return name, call_id

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """The calls section: each call `functions.NAME:INDEX`, then its JSON."""
        return st.triggered([self.start_marker], [st.section(self.start_marker, [
            st.tag(f"{self.call_begin}functions.{name}:", st.sequence(
                st.regex(r"\d+"), st.const(self.args_sep), st.arguments(schema)),
                self.call_end) for name, schema in tools], self.section_end)])

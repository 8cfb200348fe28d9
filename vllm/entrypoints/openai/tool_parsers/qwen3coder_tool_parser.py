"""Qwen3-Coder format (`qwen3_coder`):

    <tool_call>
    <function=NAME>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

one `<tool_call>` block per call, values raw and typed by the tool's schema.
"""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class Qwen3CoderToolParser(XmlToolParser):
    start_marker = "<tool_call>"

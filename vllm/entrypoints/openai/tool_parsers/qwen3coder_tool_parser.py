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

from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class Qwen3CoderToolParser(XmlToolParser):
    start_marker = "<tool_call>"

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """Each call one `<tool_call>` block, its parameters as the schema's XML."""
        return st.triggered(["<tool_call>\n<function="], [
            st.tag(f"<tool_call>\n<function={name}>\n", st.arguments(schema, "qwen_xml"),
                   "\n</function>\n</tool_call>") for name, schema in tools])

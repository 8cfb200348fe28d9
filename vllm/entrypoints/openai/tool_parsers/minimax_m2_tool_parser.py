"""MiniMax-M2 format:

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>
"""
from __future__ import annotations

import re
from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class MinimaxM2ToolParser(XmlToolParser):
    start_marker = "<minimax:tool_call>"
    function_open = re.compile(r'<invoke name="?([^">\n]+)"?>')
    function_close = "</invoke>"
    parameter_open = re.compile(r'<parameter name="?([^">\n]+)"?>')

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """One `<minimax:tool_call>` section of `<invoke name=...>` calls."""
        return st.triggered(["<minimax:tool_call>"], [st.section(
            "<minimax:tool_call>\n",
            [st.tag(f'<invoke name="{name}">\n', st.arguments(schema, "minimax_xml"),
                    "</invoke>\n") for name, schema in tools],
            "</minimax:tool_call>")])

"""MiniMax-M2 format:

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>
"""
from __future__ import annotations

import re

from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class MinimaxM2ToolParser(XmlToolParser):
    start_marker = "<minimax:tool_call>"
    function_open = re.compile(r'<invoke name="?([^">\n]+)"?>')
    function_close = "</invoke>"
    parameter_open = re.compile(r'<parameter name="?([^">\n]+)"?>')

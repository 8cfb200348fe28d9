"""Step-3 format: DeepSeek-style markers around StepTML elements:

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="NAME">
    <steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>
    <｜tool_calls_end｜>
"""
from __future__ import annotations

import re

from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class Step3ToolParser(XmlToolParser):
    start_marker = "<｜tool_calls_begin｜>"
    function_open = re.compile(r'<steptml:invoke name="([^"]+)">')
    function_close = "</steptml:invoke>"
    parameter_open = re.compile(r'<steptml:parameter name="([^"]+)">')
    parameter_close = "</steptml:parameter>"

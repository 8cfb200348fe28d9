"""DeepSeek-V3.1 format: the V3 markers without the `function` type and the ```json fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arg": ...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
"""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.delimited_calls import DelimitedToolParser


class DeepSeekV31ToolParser(DelimitedToolParser):
    start_marker = "<｜tool▁calls▁begin｜>"
    section_end = "<｜tool▁calls▁end｜>"
    call_begin = "<｜tool▁call▁begin｜>"
    call_end = "<｜tool▁call▁end｜>"
    args_sep = "<｜tool▁sep｜>"

"""DeepSeek-V3.1 format: the V3 markers without the `function` type and the ```json fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arg": ...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
"""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.delimited_calls import DelimitedToolParser


class DeepSeekV31ToolParser(DelimitedToolParser):
    start_marker = "<｜tool▁calls▁begin｜>"
    section_end = "<｜tool▁calls▁end｜>"
    call_begin = "<｜tool▁call▁begin｜>"
    call_end = "<｜tool▁call▁end｜>"
    args_sep = "<｜tool▁sep｜>"

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """The calls section: each call `NAME<sep>` then its JSON."""
        return st.triggered([self.start_marker], [st.section(self.start_marker, [
            st.tag(f"{self.call_begin}{name}{self.args_sep}", st.arguments(schema),
                   self.call_end) for name, schema in tools], self.section_end)])

"""Seed-OSS format: `<seed:tool_call><function=NAME><parameter=P>value</parameter></function>
</seed:tool_call>` (Qwen3-Coder's elements in Seed's tags)."""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class SeedOssToolParser(XmlToolParser):
    start_marker = "<seed:tool_call>"

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """Each call one `<seed:tool_call>` block, Qwen3-Coder's XML parameters inside."""
        return st.triggered(["<seed:tool_call>"], [
            st.tag(f"<seed:tool_call>\n<function={name}>\n", st.arguments(schema, "qwen_xml"),
                   "\n</function>\n</seed:tool_call>") for name, schema in tools])

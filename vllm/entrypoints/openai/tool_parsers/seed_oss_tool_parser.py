"""Seed-OSS format: `<seed:tool_call><function=NAME><parameter=P>value</parameter></function>
</seed:tool_call>` (Qwen3-Coder's elements in Seed's tags)."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.xml_calls import XmlToolParser


class SeedOssToolParser(XmlToolParser):
    start_marker = "<seed:tool_call>"

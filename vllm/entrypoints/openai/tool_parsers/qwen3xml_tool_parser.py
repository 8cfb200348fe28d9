"""`qwen3_xml`: vLLM's second parser for the Qwen3-Coder format (it reads the same
`<tool_call><function=NAME><parameter=P>...` text as `qwen3_coder`; here one reader serves
both names)."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.qwen3coder_tool_parser import Qwen3CoderToolParser


class Qwen3XMLToolParser(Qwen3CoderToolParser):
    pass

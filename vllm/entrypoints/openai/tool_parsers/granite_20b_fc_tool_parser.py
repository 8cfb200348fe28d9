"""Granite-20B-FunctionCalling format (`granite-20b-fc`): each call is
`<function_call> {"name": ..., "arguments": {...}}`, with no closing tag: a call ends where
the next `<function_call>` (or the output) does."""
from __future__ import annotations

import json
from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.tagged_json import TaggedJsonToolParser


class Granite20bFCToolParser(TaggedJsonToolParser):
    start_markers = ("<function_call>",)
    end_marker = ""

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """Each call `<function_call> {"name": NAME, "arguments": {...}}` (no end tag: the
        call's own closing brace ends it)."""
        return st.triggered([self.start_markers[0]], [st.tag(
            f'{self.start_markers[0]} {{"name": {json.dumps(name, ensure_ascii=False)}, '
            '"arguments": ', st.arguments(schema), "}") for name, schema in tools])

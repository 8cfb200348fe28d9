"""The "tags around JSON" family: calls written as JSON objects after a start tag.

Two layouts cover the models that write calls this way:

* one call per block, `START {"name": ..., "arguments": {...}} END` repeated (Hermes,
  Longcat, ERNIE, InternLM, Granite-20B-FC, whose blocks have no end tag);
* one section, `START [{...}, {...}] END`, holding a JSON list or several objects
  (Jamba, Hunyuan, Granite, Phi-4-mini, GigaChat, xLAM).

A parser file names its tags and layout; the reading, whole or partial, is here.
"""
from __future__ import annotations

import json
from typing import Optional

from vllm.entrypoints.openai.tool_parsers import structural_tags as st
from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (PartialCall, ToolParser,
                                                                       _partial_suffix_len)
from vllm.entrypoints.openai.tool_parsers.json_calls import (call_from_object, iter_json_values,
                                                             load_json)


class TaggedJsonToolParser(ToolParser):
    """Subclasses set `start_markers` (any of them opens the calls), `end_marker` and
    `layout` ("blocks" or "section")."""

    start_markers: tuple[str, ...] = ()
    end_marker: str = ""
    """Closes a block or the section; "" when nothing does (the next block or the end)."""
    layout: str = "blocks"
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    body_prefixes: tuple[str, ...] = ()
    """Text a model may write between the start tag and the JSON (skipped)."""
    strict_begin: Optional[str] = None
    """What a strict call's section starts with under tool_choice "auto" (default: the
    first start tag and body prefix)."""

    def strict_structure(self, name: str) -> Optional[tuple[str, str, str]]:
        """One block, `START\n{"name": NAME, "arguments": ` ... `}\nEND`, the layout
        the chat templates show the model."""
        if self.layout != "blocks" or not self.end_marker:
            return None
        start = self.start_markers[0]
        return (start, f'{start}\n{{"name": {json.dumps(name, ensure_ascii=False)}, '
                f'"{self.args_keys[0]}": ', f"}}\n{self.end_marker}")

    def strict_format(self, tools: st.Tools) -> Optional[dict]:
        """The section layout: after the start tag (and the body prefix a model writes),
        a JSON list of calls, each one of the tools (blocks: `strict_structure`)."""
        if self.layout != "section" or not self.start_markers:
            return None
        begin = self.strict_begin or (self.start_markers[0] + (
            self.body_prefixes[0] if self.body_prefixes else ""))
        return st.triggered([self.start_markers[0]], [st.tag(
            begin, st.arguments(st.call_list_schema(tools, self.args_keys[0])),
            self.end_marker)])

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        found = [(text.find(m), m) for m in self.start_markers if m in text]
        if found:
            at, marker = min(found)
            return text[:at], text[at + len(marker):]
        if final:
            return text, None
        held = max((_partial_suffix_len(text, m) for m in self.start_markers), default=0)
        return text[:len(text) - held], None

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        if self.layout == "section":
            body, closed, _ = (tool_text.partition(self.end_marker) if self.end_marker
                               else (tool_text, "", ""))
            return self._section_calls(self._strip_body(body, final), final or bool(closed))
        return self._block_calls(tool_text, final)

    # ------------------------------------------------------------------ layouts
    def _block_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls: list[PartialCall] = []
        start = self.start_markers[0]  # the blocks layout has one start tag
        blocks = (start + tool_text).split(start)[1:]
        for i, block in enumerate(blocks):
            if self.end_marker:
                body, closed, _ = block.partition(self.end_marker)
                complete = bool(closed) or final
                if not complete:
                    body = body[:len(body) - _partial_suffix_len(body, self.end_marker)]
            else:
                body, complete = block, final or i < len(blocks) - 1
            body = self._strip_body(body, complete)
            if not body.strip() and not complete:
                break
            obj = load_json(body.strip(), final=complete)
            if obj is None:
                break
            calls.append(call_from_object(obj, complete, self.args_keys))
        return calls

    def _section_calls(self, body: str, complete: bool) -> list[PartialCall]:
        calls: list[PartialCall] = []
        for value, done in iter_json_values(body):
            if value is None:
                break
            if complete and not done:
                raise ValueError(f"tool call JSON is cut off or malformed: {body!r}")
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                item_done = done or i < len(items) - 1
                if not isinstance(item, dict):
                    if item_done:
                        raise ValueError("each tool call must be a JSON object")
                    break
                calls.append(call_from_object(item, item_done, self.args_keys))
        return calls

    def _strip_body(self, body: str, complete: bool) -> str:
        head = body.lstrip()
        for prefix in self.body_prefixes:
            if head.startswith(prefix):
                return head[len(prefix):]
            if not complete and prefix.startswith(head):
                return ""
        return body


def stripped_of(text: str, markers: tuple[str, ...], final: bool) -> str:
    """`text` without the closing `markers` some models add, and (while streaming) without a
    tail that may be one of them arriving."""
    for m in markers:
        text = text.replace(m, "")
    if not final:
        held = max((_partial_suffix_len(text, m) for m in markers), default=0)
        text = text[:len(text) - held]
    return text



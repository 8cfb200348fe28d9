"""The "XML-ish function/parameter tags" family: each call is a function element holding
one element per parameter, the values written raw (not JSON):

    <function=NAME><parameter=city>Paris</parameter>...</function>          (Qwen3-Coder, Seed-OSS)
    <invoke name="NAME"><parameter name="city">Paris</parameter></invoke>    (MiniMax-M2)
    <steptml:invoke name="NAME"><steptml:parameter name="city">...</...>     (Step-3)

A raw value is typed by the tool's JSON schema (`"3"` is 3 for an integer parameter, a
JSON text for an object or array); a string parameter keeps its text verbatim, which is
why these models write code arguments this way. While streaming, each parameter joins
the arguments once its closing tag has arrived.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser


class XmlToolParser(ToolParser):
    """Subclasses set `start_marker` (opens the calls) and the element patterns."""

    function_open = re.compile(r"<function=([^>\n]+)>")
    function_close = "</function>"
    parameter_open = re.compile(r"<parameter=([^>\n]+)>")
    parameter_close = "</parameter>"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.tools: list[Any] = []

    def adjust_request(self, request: Any) -> Any:
        self.tools = list(getattr(request, "tools", None) or [])
        return super().adjust_request(request)

    def extract_tool_calls(self, model_output: str, request: Any = None) -> Any:
        if request is not None and getattr(request, "tools", None):
            self.tools = list(request.tools)
        return super().extract_tool_calls(model_output, request)

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        calls: list[PartialCall] = []
        opens = list(self.function_open.finditer(tool_text))
        for i, match in enumerate(opens):
            end = opens[i + 1].start() if i + 1 < len(opens) else len(tool_text)
            body, closed, _ = tool_text[match.end():end].partition(self.function_close)
            if final and not closed:
                raise ValueError(f"function {match.group(1)!r} is not closed")
            name = match.group(1).strip().strip('"')
            args = self._arguments(name, body, complete=bool(closed))
            calls.append(PartialCall(name, args, complete=bool(closed)))
            if not closed:
                break
        if final and not calls:
            raise ValueError("no function element in the tool-call text")
        return calls

    def _arguments(self, name: str, body: str, complete: bool) -> dict[str, Any]:
        """The parameters in a function's body; an unclosed last one counts only when the
        function itself is closed (the models sometimes drop that one closing tag)."""
        args: dict[str, Any] = {}
        opens = list(self.parameter_open.finditer(body))
        for i, match in enumerate(opens):
            end = opens[i + 1].start() if i + 1 < len(opens) else len(body)
            raw, closed, _ = body[match.end():end].partition(self.parameter_close)
            if not (closed or complete):
                break
            key = match.group(1).strip().strip('"')
            args[key] = convert_value(_trim(raw), self._schema(name, key))
        return args

    def _schema(self, function: str, parameter: str) -> Optional[dict[str, Any]]:
        for tool in self.tools:
            if tool.function.name == function:
                props = (tool.function.parameters or {}).get("properties") or {}
                schema = props.get(parameter)
                return schema if isinstance(schema, dict) else None
        return None


def _trim(raw: str) -> str:
    """One newline after the opening and before the closing tag is layout, not value."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def _types(schema: Optional[dict[str, Any]]) -> list[str]:
    if not schema:
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [x for s in schema[key] if isinstance(s, dict) for x in _types(s)]
    if "enum" in schema or "properties" in schema:
        return ["object"] if "properties" in schema else ["string"]
    return []


def convert_value(raw: str, schema: Optional[dict[str, Any]]) -> Any:
    """A raw parameter text typed by its schema; text that does not fit stays a string,
    and a parameter without a schema is a string (as vLLM)."""
    types = _types(schema)
    if not types or "string" in types:
        return raw
    if raw.strip().lower() == "null":
        return None
    text = raw.strip()
    for t in types:
        try:
            if t == "integer":
                return int(text)
            if t == "number":
                value = float(text)
                return int(value) if value.is_integer() and "." not in text and "e" not in \
                    text.lower() else value
            if t == "boolean" and text.lower() in ("true", "false"):
                return text.lower() == "true"
            if t in ("object", "array"):
                return _structured(text)
        except (ValueError, SyntaxError):
            continue
    return raw


def _structured(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)  # a Python literal (single quotes, True)

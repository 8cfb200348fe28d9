"""Pythonic format (Llama 3.2, ToolACE): `[get_weather(city="Paris"), now()]`, read with
`ast` (literal values only; nothing is evaluated)."""
from __future__ import annotations

import ast
from typing import Any, Optional

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall, ToolParser


class PythonicToolParser(ToolParser):

    def adjust_request(self, request: Any) -> Any:
        return request  # no special tokens in this format

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        head = text.lstrip()
        if head.startswith("["):
            return "", head
        if not final and not head:
            return "", None
        return text, None

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        text = tool_text.strip()
        closed = text if final else _close(text)
        try:
            tree = ast.parse(closed, mode="eval").body
        except SyntaxError:
            if final:
                raise
            return []
        if not isinstance(tree, ast.List):
            raise ValueError("pythonic tool calls must be a list of calls")
        calls = []
        for i, node in enumerate(tree.elts):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                raise ValueError("each pythonic tool call must be name(arg=value, ...)")
            last = i == len(tree.elts) - 1
            complete = final or not last or closed == text
            calls.append(PartialCall(node.func.id, _arguments(node, complete), complete))
        return calls


def _arguments(node: ast.Call, complete: bool) -> dict[str, Any]:
    if node.args:
        raise ValueError("pythonic tool calls take keyword arguments only")
    args = {}
    for i, kw in enumerate(node.keywords):
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            if complete:
                raise ValueError(f"argument {kw.arg!r} is not a literal") from None
            break  # a partial identifier such as `Tr` (for True): not known yet
        if not complete and i == len(node.keywords) - 1 and not isinstance(args[kw.arg], str):
            del args[kw.arg]  # a number or container may still grow
    return args


def _close(text: str) -> str:
    """A prefix of a Python list, with every open string and bracket closed."""
    stack: list[str] = []
    quote: Optional[str] = None
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            stack.append({"(": ")", "[": "]", "{": "}"}[ch])
        elif ch in ")]}" and stack:
            stack.pop()
    if escaped:
        text = text[:-1]  # a dangling backslash: its escape is not known yet
    tail = quote or ""
    if not quote and text.rstrip().endswith("="):
        tail = "None"  # `f(a=`: a placeholder, dropped by _arguments as not yet known
    return text + tail + "".join(reversed(stack))

"""Building blocks of xgrammar's structural tags (`{"type": "structural_tag", "format":
...}`), for holding `strict` tools to their schemas under tool_choice "auto" in formats
whose calls are not one fixed `begin JSON end` frame: arguments written as XML
parameters (Qwen3-Coder, Seed-OSS, MiniMax-M2), calls inside a section of special tokens
(DeepSeek, Kimi-K2), or a JSON list of calls (Mistral, Jamba, Granite, ...).

Each parser's `strict_format(tools)` returns a `triggered` format: free text, and from a
trigger on, one of the calls; the model may call again after it.
"""
from __future__ import annotations

from typing import Any, Sequence

Tools = Sequence[tuple[str, dict]]
"""(function name, arguments schema) of each tool offered."""


def arguments(schema: dict, style: str = "json") -> dict[str, Any]:
    """The arguments as `style`: "json", or xgrammar's XML parameter styles ("qwen_xml":
    `<parameter=k>v</parameter>`, "minimax_xml": `<parameter name="k">v</parameter>`)."""
    return {"type": "json_schema", "json_schema": schema, "style": style}


def tag(begin: str, content: dict, end: str) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def sequence(*elements: dict) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def regex(pattern: str) -> dict[str, Any]:
    return {"type": "regex", "pattern": pattern}


def const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def triggered(triggers: Sequence[str], tags: list[dict]) -> dict[str, Any]:
    """Free text; each trigger opens one of `tags` (any number of times)."""
    return {"type": "triggered_tags", "triggers": sorted(set(triggers)), "tags": tags,
            "at_least_one": False, "stop_after_first": False}


def section(begin: str, calls: list[dict], end: str, separator: str = "") -> dict[str, Any]:
    """`begin`, one or more of `calls` (separated by `separator`), `end`."""
    return tag(begin, {"type": "tags_with_separator", "tags": calls, "separator": separator,
                       "at_least_one": True, "stop_after_first": False}, end)


def call_list_schema(tools: Tools, args_key: str = "arguments") -> dict[str, Any]:
    """A JSON list of {"name": NAME, args_key: {...}} calls, each one of the tools."""
    return {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": name}, args_key: schema},
         "required": ["name", args_key]} for name, schema in tools]}}

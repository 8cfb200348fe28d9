"""Reading JSON tool calls, whole or partial (partial-json-parser while streaming)."""
from __future__ import annotations

import json
from typing import Any, Iterator

from partial_json_parser import Allow, loads as partial_loads

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import PartialCall

# Numbers are kept out until complete: "1." could still become "1.5".
_PARTIAL = Allow.ALL & ~Allow.NUM


def load_json(text: str, final: bool) -> Any:
    """json.loads, or a partial parse of a prefix (None when nothing is parseable yet)."""
    if final:
        return json.loads(text)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return partial_loads(text, _PARTIAL)
    except Exception:  # noqa: BLE001 - the library raises several types on bad prefixes
        return None


def iter_json_values(text: str) -> Iterator[tuple[Any, bool]]:
    """(value, complete) for each JSON value in `text`, separated by whitespace, commas or
    semicolons; the last one may be partial (complete False)."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos >= len(text):
            return
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            yield load_json(text[pos:], final=False), False
            return
        yield value, True
        pos = end


def call_from_object(obj: Any, complete: bool, args_keys=("arguments", "parameters")
                     ) -> PartialCall:
    """{"name": ..., "arguments" | "parameters": {...}} -> PartialCall."""
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if complete and not isinstance(name, str):
        raise ValueError("a tool call needs a string 'name'")
    # A partial name may still grow: only report it once its value is followed by more.
    if not complete and not _name_done(obj):
        name = None
    args = next((obj[k] for k in args_keys if k in obj), None)
    if isinstance(args, str) and complete:
        args = json.loads(args)  # some models write the arguments as a JSON string
    if complete and args is not None and not isinstance(args, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return PartialCall(name=name if isinstance(name, str) else None,
                       arguments=args if isinstance(args, dict) else None, complete=complete)


def _name_done(obj: dict) -> bool:
    keys = list(obj)
    return "name" in keys and keys.index("name") < len(keys) - 1

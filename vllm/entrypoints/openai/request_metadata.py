"""OpenAI's limits on a request's `metadata` (chat completions, responses).

OpenAI accepts at most 16 key-value pairs, keys strings of at most 64 characters and
values strings of at most 512, and refuses anything else with a 400 naming `metadata`.
The same limits here keep a client from parking megabytes in a field that is echoed
back and, on /v1/responses, kept in the store.
"""
from __future__ import annotations

from typing import Any, Optional

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def metadata_problem(metadata: Optional[dict[str, Any]]) -> Optional[str]:
    """Why `metadata` is refused (OpenAI's wording), or None when it is acceptable."""
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_PAIRS:
        return (f"Invalid 'metadata': too many properties. Expected an object with at most "
                f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} "
                "properties instead.")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            return (f"Invalid 'metadata': key {_shown(key)} is too long. Expected a key with "
                    f"maximum length {MAX_METADATA_KEY_CHARS}, but got a key with length "
                    f"{len(key)} instead.")
        if not isinstance(value, str):
            return (f"Invalid 'metadata.{_shown(key, quote=False)}': expected a string, but "
                    f"got {_json_kind(value)} instead.")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            return (f"Invalid 'metadata.{_shown(key, quote=False)}': string too long. "
                    f"Expected a string with maximum length {MAX_METADATA_VALUE_CHARS}, but "
                    f"got a string with length {len(value)} instead.")
    return None


def _shown(key: str, quote: bool = True) -> str:
    """The key as an error message quotes it: cut short, since it may be huge."""
    text = key if len(key) <= MAX_METADATA_KEY_CHARS else key[:MAX_METADATA_KEY_CHARS] + "..."
    return f"'{text}'" if quote else text


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    return "an object"

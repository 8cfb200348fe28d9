"""The fields of a `--*-config` flag: JSON text on the command line, a dict in Python.

vLLM's nested configs (--speculative-config, --kv-transfer-config, ...) all arrive
this way; one reader gives them the same errors: bad JSON, not an object, and unknown
keys named beside the known ones.
"""
from __future__ import annotations

import json
from typing import Any, Iterable


def config_fields(value: Any, name: str, known: Iterable[str], example: str) -> dict:
    """`value` (JSON text or a dict) as a dict of known fields; ValueError naming `name`
    (the config's field, e.g. "kv_transfer_config") otherwise."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag} must be JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, e.g. '{example}', "
                         f"got {type(value).__name__}.")
    known = sorted(set(known))
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; known: {known}.")
    return value


def config_from_cli(cls: type, value: Any, name: str, example: str) -> Any:
    """A `--*-config` dataclass from its flag's value: the instance itself, the
    defaults for None, else JSON text or a dict of known fields (`config_fields`)."""
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    return cls(**config_fields(value, name, cls.__dataclass_fields__, example))

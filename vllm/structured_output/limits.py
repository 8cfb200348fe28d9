"""How large and costly a request's grammar may be.

Compiling a grammar costs time and memory that grow with the schema, faster than
linearly for some shapes: a JSON schema with 20,000 pattern-constrained properties
grew a compile to 11 GB until the kernel killed the engine. Two bounds hold it:

- Up front, in the frontend (cheap, a 400 before any compiler runs): the spec's size in
  bytes, and for JSON schemas the number of properties, enum values and patterns and
  the nesting depth. The defaults sit at OpenAI's structured-output limits where those
  exist (5,000 properties) and well above what real tool and response schemas use.
- While compiling, in the engine (vllm/structured_output/compile_pool.py): a time
  limit and a memory limit per compile, enforced in a killable helper process.

Every limit is an environment variable (vllm/envs.py) named in the error it causes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm.structured_output.backend_types import GrammarSpec


@dataclass(frozen=True)
class GrammarLimits:
    max_spec_bytes: int
    max_properties: int
    max_enum_values: int
    max_patterns: int
    max_nesting: int
    compile_timeout_s: float
    compile_max_memory_mb: int

    @classmethod
    def from_env(cls) -> "GrammarLimits":
        import vllm.envs as envs
        return cls(max_spec_bytes=envs.VLLM_STRUCTURED_OUTPUT_MAX_SPEC_BYTES,
                   max_properties=envs.VLLM_STRUCTURED_OUTPUT_MAX_PROPERTIES,
                   max_enum_values=envs.VLLM_STRUCTURED_OUTPUT_MAX_ENUM_VALUES,
                   max_patterns=envs.VLLM_STRUCTURED_OUTPUT_MAX_PATTERNS,
                   max_nesting=envs.VLLM_STRUCTURED_OUTPUT_MAX_NESTING,
                   compile_timeout_s=envs.VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S,
                   compile_max_memory_mb=envs.VLLM_STRUCTURED_OUTPUT_COMPILE_MAX_MEMORY_MB)


@dataclass
class SchemaCounts:
    """What a JSON schema holds that makes its grammar large."""
    properties: int = 0
    enum_values: int = 0
    patterns: int = 0
    nesting: int = 0


def count_schema(schema: Any) -> SchemaCounts:
    """Walk the schema without recursion (a schema nested 10^5 deep must not overflow
    this process's stack): every dict and list counts one nesting level."""
    counts = SchemaCounts()
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            counts.nesting = max(counts.nesting, depth)
            _count_keywords(node, counts)
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            counts.nesting = max(counts.nesting, depth)
            stack.extend((value, depth + 1) for value in node)
    return counts


def _count_keywords(node: dict[str, Any], counts: SchemaCounts) -> None:
    properties = node.get("properties")
    if isinstance(properties, dict):
        counts.properties += len(properties)
    pattern_properties = node.get("patternProperties")
    if isinstance(pattern_properties, dict):
        counts.properties += len(pattern_properties)
        counts.patterns += len(pattern_properties)
    if isinstance(node.get("pattern"), str):
        counts.patterns += 1
    enum = node.get("enum")
    if isinstance(enum, list):
        counts.enum_values += len(enum)


def check_spec_limits(spec: GrammarSpec, limits: GrammarLimits) -> None:
    """ValueError naming the first limit the spec exceeds (and its variable)."""
    size = len(spec.spec.encode("utf-8", "surrogatepass"))
    if size > limits.max_spec_bytes:
        what = {"json": "schema", "regex": "regex"}.get(spec.kind, "grammar")
        raise ValueError(f"the {what} is {size} bytes, more than the limit of "
                         f"{limits.max_spec_bytes} bytes "
                         "(VLLM_STRUCTURED_OUTPUT_MAX_SPEC_BYTES).")
    if spec.kind != "json":
        return
    counts = count_schema(json.loads(spec.spec))
    for value, limit, what, name in (
            (counts.nesting, limits.max_nesting, "levels of nesting", "MAX_NESTING"),
            (counts.properties, limits.max_properties, "properties", "MAX_PROPERTIES"),
            (counts.enum_values, limits.max_enum_values, "enum values", "MAX_ENUM_VALUES"),
            (counts.patterns, limits.max_patterns, "patterns", "MAX_PATTERNS")):
        if value > limit:
            raise ValueError(_too_large(f"has {value} {what}", limit, what, name))


def _too_large(actual: str, limit: int, unit: str, name: str) -> str:
    return (f"the schema {actual}, more than the limit of {limit} {unit} "
            f"(VLLM_STRUCTURED_OUTPUT_{name}).")

"""The two sides of a grammar backend: compile a grammar once, match it per request.

A `GrammarSpec` is what a request asks for, normalized so that equal constraints have
equal specs (it is the compile cache key). A backend compiles a spec into an opaque
compiled grammar (thread-safe, shared by every request with the same spec) and makes
a fresh `StructuredOutputGrammar` (the per-request matcher state) from it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from vllm.sampling_params import StructuredOutputsParams

# xgrammar prefixes its C++ errors with a timestamp and a source location.
_NATIVE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


MAX_WHITESPACE = 16
"""Longest run of optional whitespace a JSON constraint allows between two tokens by
default: enough for a newline and four levels of indentation, and a bound, so that a
sampled (temperature 1) output cannot spend its max_tokens on spaces and newlines and
come back cut inside a string. `disable_any_whitespace` allows none; `whitespace_pattern`
(guidance backend) sets the pattern itself."""


@dataclass(frozen=True)
class GrammarSpec:
    """kind: json | regex | grammar_ebnf | grammar_lark | structural_tag; spec: normalized
    text.

    JSON only: `any_whitespace` (optional whitespace allowed at all), `whitespace_pattern`
    (a regex for it, llguidance only); otherwise runs are bounded by `MAX_WHITESPACE`."""
    kind: str
    spec: str
    any_whitespace: bool = True
    whitespace_pattern: Optional[str] = None


def grammar_spec(params: StructuredOutputsParams, disable_any_whitespace: bool = False,
                 disable_additional_properties: bool = False) -> GrammarSpec:
    """The normalized spec of a request's structured output constraint.

    A choice becomes a grammar of quoted alternatives and json_object the schema of any
    object, so every backend needs only four kinds.
    """
    any_ws = not (disable_any_whitespace or params.disable_any_whitespace)
    kind = params.kind
    if kind == "json":
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("structured_outputs.json must be a JSON schema object, got "
                             f"{type(schema).__name__}.")
        if disable_additional_properties or params.disable_additional_properties:
            schema = _close_objects(schema)
        # In the schema's own key order: the grammar emits properties in that order
        # (a schema that puts "reasoning" before "answer" means it), as in vLLM.
        return GrammarSpec("json", json.dumps(schema), any_ws, params.whitespace_pattern)
    if kind == "json_object":
        return GrammarSpec("json", json.dumps({"type": "object"}), any_ws,
                           params.whitespace_pattern)
    if kind == "regex":
        return GrammarSpec("regex", params.regex)
    if kind == "structural_tag":
        return GrammarSpec("structural_tag", params.structural_tag)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
        return GrammarSpec("grammar_ebnf", f"root ::= {alternatives}")
    grammar = params.grammar
    return GrammarSpec("grammar_ebnf" if is_ebnf(grammar) else "grammar_lark", grammar)


def is_ebnf(grammar: str) -> bool:
    """GBNF/EBNF rules are written `name ::= ...`; Lark rules `name: ...`."""
    return "::=" in grammar


def _close_objects(schema: Any) -> Any:
    """A copy of the schema whose objects allow no unlisted properties."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _close_objects(v) for k, v in schema.items()}
    if out.get("type") == "object" or "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def clean_error(exc: BaseException) -> str:
    """A backend's error message without native source locations, on one line."""
    text = str(exc).strip()
    text = _NATIVE_PREFIX.sub("", text)
    return " ".join(text.split())


class StructuredOutputGrammar(Protocol):
    """One request's matcher: which tokens may come next, and the tokens accepted so far."""

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False (state unchanged past the bad one) if rejected."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token bits into `bitmask[row]` (int32, 32 tokens a word)."""

    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (rejected speculative tokens)."""


class StructuredOutputBackend(Protocol):
    """Compiles specs (in worker threads) and makes per-request matchers."""

    name: str

    def compile(self, spec: GrammarSpec) -> Any:
        ...

    def new_grammar(self, compiled: Any) -> StructuredOutputGrammar:
        ...

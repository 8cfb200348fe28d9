"""llguidance: the second backend (JSON schema, regex, Lark and GBNF grammars)."""
from __future__ import annotations

import json
import logging
from typing import Any

import torch

from vllm.structured_output.backend_types import MAX_WHITESPACE, GrammarSpec, clean_error

logger = logging.getLogger(__name__)


def _json_options(spec: GrammarSpec) -> dict[str, Any]:
    """llguidance's JSON options: no optional whitespace, the request's pattern, or runs
    of at most MAX_WHITESPACE whitespace characters."""
    if not spec.any_whitespace:
        return {"whitespace_flexible": False}
    pattern = spec.whitespace_pattern or rf"[\x20\x0A\x0D\x09]{{0,{MAX_WHITESPACE}}}"
    return {"whitespace_flexible": True, "whitespace_pattern": pattern}


def _grammar_text(spec: GrammarSpec) -> str:
    """The spec as an llguidance grammar (its own JSON format)."""
    import llguidance
    if spec.kind == "json":
        schema = json.loads(spec.spec)
        options = _json_options(spec)
        if isinstance(schema, dict):
            schema = {**schema, "x-guidance": {**options, **schema.get("x-guidance", {})}}
        return llguidance.LLMatcher.grammar_from_json_schema(schema)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.spec)
    if spec.kind == "structural_tag":
        raise ValueError("structural tags need the xgrammar backend (--structured-outputs-"
                         "config backend auto or xgrammar).")
    if spec.kind == "grammar_ebnf":
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(spec.spec))
        except Exception as e:  # noqa: BLE001 - conversion errors are the user's grammar
            raise ValueError(f"invalid grammar: {clean_error(e)}") from None
    return llguidance.LLMatcher.grammar_from_lark(spec.spec)


def validate_guidance(spec: GrammarSpec) -> None:
    """Check the spec without the model's tokenizer; ValueError naming what is wrong."""
    import llguidance
    text = _grammar_text(spec)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, None)
    if is_error:
        what = {"json": "invalid JSON schema", "regex": "invalid regex"}.get(
            spec.kind, "invalid grammar")
        raise ValueError(f"{what}: {clean_error(' '.join(messages))}")


class GuidanceGrammar:

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept_tokens(self, token_ids: list[int]) -> bool:
        for token_id in token_ids:
            if not self.matcher.consume_token(token_id) or self.matcher.is_error():
                return False
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        from llguidance.torch import fill_next_token_bitmask
        fill_next_token_bitmask(self.matcher, bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


class GuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import llguidance.hf
        self.vocab_size = vocab_size
        if getattr(tokenizer, "is_mistral", False):  # --tokenizer-mode mistral
            self.ll_tokenizer = _mistral_ll_tokenizer(tokenizer, vocab_size, stop_token_ids)
            return
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids[0] if stop_token_ids
            else None)

    def compile(self, spec: GrammarSpec) -> Any:
        """llguidance compiles lazily per matcher: check the grammar, keep its text."""
        import llguidance
        text = _grammar_text(spec)
        error = llguidance.LLMatcher.validate_grammar(text, self.ll_tokenizer)
        if error:
            raise ValueError(f"invalid grammar: {clean_error(error)}")
        return text

    def new_grammar(self, compiled: Any) -> GuidanceGrammar:
        import llguidance
        matcher = llguidance.LLMatcher(self.ll_tokenizer, compiled)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {clean_error(matcher.get_error())}")
        return GuidanceGrammar(matcher)


def _mistral_ll_tokenizer(tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> Any:
    """llguidance's tokenizer over a mistral-common one: each id's bytes (padded to the
    model's vocabulary with empty tokens), its special ids and its encoder."""
    import llguidance

    class _Vocab:
        eos_token_id = stop_token_ids[0] if stop_token_ids else tokenizer.eos_token_id
        bos_token_id = tokenizer.bos_token_id
        special_token_ids = list(tokenizer.all_special_ids)
        tokens = (tokenizer.token_bytes() if tokenizer.is_tekken else [
            _spm_bytes(p) for p in tokenizer.convert_ids_to_tokens(range(len(tokenizer)))])
        tokens += [b""] * max(0, vocab_size - len(tokens))

        def __call__(self, text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab()), n_vocab=vocab_size)


def _spm_bytes(piece: str) -> bytes:
    """A sentencepiece piece's bytes: `<0xNN>` byte fallback, `\u2581` a space."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")

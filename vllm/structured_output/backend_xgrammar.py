"""xgrammar: the default backend (JSON schema, regex, GBNF/EBNF grammars)."""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from vllm.structured_output.backend_types import MAX_WHITESPACE, GrammarSpec, clean_error

logger = logging.getLogger(__name__)


def _json_options(spec: GrammarSpec) -> dict[str, Any]:
    """Whitespace between JSON tokens: none, or runs of at most MAX_WHITESPACE."""
    if not spec.any_whitespace:
        return {"any_whitespace": False}
    return {"any_whitespace": True, "max_whitespace_cnt": MAX_WHITESPACE}


def validate_xgrammar(spec: GrammarSpec) -> None:
    """Parse the spec without a tokenizer; ValueError naming what is wrong."""
    import xgrammar as xgr
    if spec.whitespace_pattern is not None:
        raise ValueError("whitespace_pattern needs the guidance backend (xgrammar has no "
                         "whitespace pattern; --structured-outputs-config backend auto or "
                         "guidance).")
    try:
        if spec.kind == "json":
            xgr.Grammar.from_json_schema(spec.spec, **_json_options(spec))
        elif spec.kind == "regex":
            xgr.Grammar.from_regex(spec.spec)
        elif spec.kind == "grammar_ebnf":
            xgr.Grammar.from_ebnf(spec.spec)
        elif spec.kind == "structural_tag":
            xgr.Grammar.from_structural_tag(*_structural_tag(spec))
        else:
            raise ValueError("xgrammar reads GBNF/EBNF grammars (`root ::= ...`), not Lark; "
                             "use the guidance backend for Lark grammars.")
    except RuntimeError as e:
        raise ValueError(_describe(spec.kind, e)) from None


def _structural_tag(spec: GrammarSpec) -> tuple[Any, ...]:
    """xgrammar's arguments for a structural_tag spec: (tags, triggers) of the
    begin/schema/end form, or the JSON text of xgrammar's own {"type": "structural_tag",
    "format": ...} form."""
    import json

    import xgrammar as xgr
    tag = json.loads(spec.spec)
    if tag.get("type") == "structural_tag":
        return (spec.spec,)
    items = [xgr.StructuralTagItem(begin=s["begin"], end=s["end"],
                                   schema=json.dumps(s["schema"]))
             for s in tag["structures"]]
    return items, list(tag["triggers"])


def _describe(kind: str, exc: BaseException) -> str:
    what = {"json": "invalid JSON schema", "regex": "invalid regex",
            "structural_tag": "invalid structural tag",
            "grammar_ebnf": "invalid grammar"}.get(kind, "invalid constraint")
    return f"{what}: {clean_error(exc)}"


class XgrammarGrammar:

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept_tokens(self, token_ids: list[int]) -> bool:
        for token_id in token_ids:
            if not self.matcher.accept_token(token_id):
                return False
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 max_threads: int = 1) -> None:
        import xgrammar as xgr
        if getattr(tokenizer, "is_mistral", False):  # --tokenizer-mode mistral
            # Tekken: each id's raw bytes; sentencepiece: pieces with <0x..> byte fallback.
            vocab_type = xgr.VocabType.RAW if tokenizer.is_tekken else \
                xgr.VocabType.BYTE_FALLBACK
            vocab = tokenizer.token_bytes() if tokenizer.is_tekken else \
                tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
            info = xgr.TokenizerInfo(vocab, vocab_type, vocab_size=vocab_size,
                                     stop_token_ids=stop_token_ids or None)
        else:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=stop_token_ids or None)
        self._init(info, max_threads)

    @classmethod
    def from_tokenizer_info_json(cls, info_json: str, max_threads: int = 1
                                 ) -> "XgrammarBackend":
        """The backend from `tokenizer_info_json()` of another one (a compile helper's:
        indexing the vocabulary again would take seconds)."""
        import xgrammar as xgr
        backend = cls.__new__(cls)
        backend._init(xgr.TokenizerInfo.deserialize_json(info_json), max_threads)
        return backend

    def _init(self, info: Any, max_threads: int) -> None:
        import xgrammar as xgr
        self._xgr = xgr
        self.info = info
        self.vocab_size = info.vocab_size
        # The compiler's own cache is off: the manager caches compiled grammars by spec.
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads,
                                            cache_enabled=False)

    def tokenizer_info_json(self) -> str:
        return self.info.serialize_json()

    def compile(self, spec: GrammarSpec) -> Any:
        try:
            if spec.kind == "json":
                return self.compiler.compile_json_schema(spec.spec, **_json_options(spec))
            if spec.kind == "regex":
                return self.compiler.compile_regex(spec.spec)
            if spec.kind == "grammar_ebnf":
                return self.compiler.compile_grammar(spec.spec)
            if spec.kind == "structural_tag":
                return self.compiler.compile_structural_tag(*_structural_tag(spec))
        except RuntimeError as e:
            raise ValueError(_describe(spec.kind, e)) from None
        raise ValueError(f"xgrammar cannot compile a {spec.kind} constraint.")

    def new_grammar(self, compiled: Any, max_rollback_tokens: Optional[int] = None
                    ) -> XgrammarGrammar:
        return XgrammarGrammar(self._xgr.GrammarMatcher(
            compiled, max_rollback_tokens=-1 if max_rollback_tokens is None
            else max_rollback_tokens))

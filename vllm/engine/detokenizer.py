"""Incremental detokenization: new token ids -> the newly stable text, in O(1) per token.

Re-decoding the whole output each step costs O(length) per token. Instead we decode a
small window with the prefix/read-offset technique: `prefix_offset..read_offset` are
tokens already turned into text (kept as context, so a leading space or a byte-level
merge decodes as in the full text), `read_offset..` the tokens not yet emitted. Each
step decodes both windows and emits the difference, unless the text ends in U+FFFD:
that is a multi-byte character whose remaining bytes are in tokens still to come, so
it is held back until complete. Window starts always fall on character boundaries, so
the concatenated deltas equal the full decode of the output.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Optional, Sequence

logger = logging.getLogger(__name__)

INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
"""Prompt tokens kept as context for the first output token."""
_REPLACEMENT_CHAR = "\ufffd"
_TRIM_THRESHOLD = 64
"""Drop emitted tokens from the window buffer once this many are behind prefix_offset."""

DecodeFn = Callable[[Sequence[int]], str]


def make_decode_fn(tokenizer: Any, skip_special_tokens: bool,
                   spaces_between_special_tokens: bool) -> DecodeFn:
    """A function ids -> text that decodes exactly as `tokenizer.decode` without cleanup.

    Fast (Rust) tokenizers are called directly, skipping the Python wrapper; like
    vLLM's fast detokenizer, they do not insert spaces between special tokens.
    Other tokenizers go through `decode` with both options.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "decode"):
        def decode_fast(ids: Sequence[int]) -> str:
            return backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return decode_fast

    def decode_slow(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens,
                                spaces_between_special_tokens=spaces_between_special_tokens,
                                clean_up_tokenization_spaces=False)
    return decode_slow


class IncrementalDetokenizer:
    """Turns one request's output tokens into text as they arrive.

    `update(new_token_ids)` returns the text made stable by these tokens and appends it
    to `output_text`; `flush()` releases held-back bytes at the end of the request.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: Optional[Sequence[int]],
                 skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self._decode = make_decode_fn(tokenizer, skip_special_tokens,
                                      spaces_between_special_tokens)
        context = list(prompt_token_ids or [])[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:]
        self._tokens: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.output_text = ""
        self.num_output_tokens = 0

    def update(self, new_token_ids: Sequence[int]) -> str:
        """Feed newly generated tokens; return the text they completed (maybe "")."""
        delta = []
        for token_id in new_token_ids:
            self._tokens.append(token_id)
            self.num_output_tokens += 1
            delta.append(self._decode_next())
        text = "".join(delta)
        self.output_text += text
        self._trim()
        return text

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character decodes as U+FFFD)."""
        prefix_text, new_text = self._decode_windows()
        text = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset = len(self._tokens)
        self.output_text += text
        return text

    def decode_logprob_token(self, token_id: int) -> str:
        """Text of one token on its own, as vLLM reports in logprobs (`decoded_token`)."""
        return decode_token_text(self.tokenizer, token_id)

    def _decode_next(self) -> str:
        prefix_text, new_text = self._decode_windows()
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            # Nothing visible yet (a skipped special token) or a character still
            # missing bytes: keep the window open.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        return new_text[len(prefix_text):]

    def _decode_windows(self) -> tuple[str, str]:
        prefix_text = self._decode(self._tokens[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset:])
        return prefix_text, new_text

    def _trim(self) -> None:
        if self._prefix_offset >= _TRIM_THRESHOLD:
            del self._tokens[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0


_token_text_caches: "weakref.WeakKeyDictionary[Any, dict[int, str]]" = (
    weakref.WeakKeyDictionary())


def decode_token_text(tokenizer: Any, token_id: int) -> str:
    """`tokenizer.decode([token_id])`, cached per tokenizer (logprobs ask for many ids).

    Special tokens keep their text; a lone piece of a multi-byte character is U+FFFD.
    """
    try:
        cache = _token_text_caches.setdefault(tokenizer, {})
    except TypeError:  # tokenizer not weak-referenceable: decode uncached
        cache = {}
    text = cache.get(token_id)
    if text is None:
        text = tokenizer.decode([token_id])
        cache[token_id] = text
    return text

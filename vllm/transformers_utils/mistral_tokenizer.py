"""`--tokenizer-mode mistral`: Mistral's own tokenizer files through `mistral-common`.

Mistral ships its models with a `tekken.json` (a byte-level BPE, "Tekken") or a
sentencepiece `tokenizer.model.v*` file, and its chat format is defined by
mistral-common's code, not by a Jinja template. `MistralTokenizer` wraps mistral-common's
tokenizer behind the part of the transformers tokenizer interface this server uses
(`encode`, `__call__`, `decode`, `convert_ids_to_tokens`, `get_vocab`, the special ids),
and renders chats with `encode_chat`: token ids straight from mistral-common (control
tokens such as `[INST]` or `[TOOL_CALLS]` are ids there, never text to re-encode, so a
user's message that spells `[INST]` stays text).

mistral-common is a runtime requirement (requirements/common.txt), as in vLLM; it is
imported only in this mode.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
from typing import Any, Optional, Sequence, Union

logger = logging.getLogger(__name__)

_SPM_FILE = re.compile(r"^tokenizer\.model\.v(\d+)(m\d+)?$")


def find_tokenizer_file(path: str) -> str:
    """The Mistral tokenizer file of a model directory (or the file itself): `tekken.json`
    first, else the sentencepiece `tokenizer.model.v*` of the highest version."""
    if os.path.isfile(path):
        return path
    tekken = sorted(glob.glob(os.path.join(path, "*tekken*.json")))
    if tekken:
        return tekken[0]
    spm = [name for name in os.listdir(path) if _SPM_FILE.match(name)] if os.path.isdir(
        path) else []
    if spm:
        spm.sort(key=lambda n: (int(_SPM_FILE.match(n).group(1)), n))
        return os.path.join(path, spm[-1])
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
        return os.path.join(path, "tokenizer.model")
    raise ValueError(f"--tokenizer-mode mistral: no Mistral tokenizer file in {path} "
                     "(expected tekken.json or tokenizer.model.v*).")


def _mistral_common() -> Any:
    try:
        import mistral_common  # noqa: F401
    except ImportError as e:  # the requirement is missing from this environment
        raise ValueError("--tokenizer-mode mistral needs the 'mistral-common' package "
                         "(pip install mistral-common).") from e
    return mistral_common


class MistralTokenizer:
    """mistral-common's tokenizer with the transformers methods the server calls."""

    is_mistral = True
    is_fast = False
    chat_template = None
    """No Jinja template: mistral-common renders the chat (`encode_chat`)."""
    padding_side = "left"

    def __init__(self, path: str) -> None:
        _mistral_common()
        from mistral_common.protocol.instruct.validator import ValidationMode
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as _MT
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        self.file = find_tokenizer_file(path)
        self.mistral = _MT.from_file(self.file, mode=ValidationMode.test)
        self.instruct = self.mistral.instruct_tokenizer
        self.tokenizer = self.instruct.tokenizer
        self._policy = SpecialTokenPolicy
        self.is_tekken = isinstance(self.tokenizer, Tekkenizer)
        self.version = str(self.tokenizer.version.value)
        self.name_or_path = path
        self.bos_token_id = self.tokenizer.bos_id
        self.eos_token_id = self.tokenizer.eos_id
        pad = getattr(self.tokenizer, "pad_id", -1)
        self.pad_token_id = pad if isinstance(pad, int) and pad >= 0 else None
        self.all_special_ids = sorted(int(i) for i in self.tokenizer.special_ids)
        self._special = set(self.all_special_ids)
        self.vocab_size = self.tokenizer.n_words
        self._pieces = [self._piece(i) for i in range(self.vocab_size)]
        self._vocab: Optional[dict[str, int]] = None

    # ------------------------------------------------------------ vocabulary
    def _piece(self, token_id: int) -> str:
        return self.tokenizer.id_to_piece(token_id)

    def token_bytes(self) -> list[bytes]:
        """Each id's bytes (control tokens: their text, e.g. b"[TOOL_CALLS]"), for the
        grammar backends' vocabularies."""
        if self.is_tekken:
            keep = self._policy.KEEP
            return [self.tokenizer.id_to_byte_piece(i, keep) for i in range(self.vocab_size)]
        return [p.encode("utf-8") for p in self._pieces]

    def get_vocab(self) -> dict[str, int]:
        if self._vocab is None:
            vocab: dict[str, int] = {}
            for i, piece in enumerate(self._pieces):
                vocab.setdefault(piece, i)
            self._vocab = vocab
        return dict(self._vocab)

    def __len__(self) -> int:
        return self.vocab_size

    def __deepcopy__(self, memo: dict) -> "MistralTokenizer":
        # Encoding and decoding keep no per-call state: threads share one instance.
        return self

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]],
                              skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._pieces[ids]
        return [self._pieces[i] for i in ids
                if not (skip_special_tokens and i in self._special)]

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]) -> Any:
        vocab = self._vocab if self._vocab is not None else self.get_vocab()
        if isinstance(tokens, str):
            return vocab.get(tokens)
        return [vocab.get(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        return self.decode(self.convert_tokens_to_ids(list(tokens)), skip_special_tokens=False)

    # ------------------------------------------------------------- encoding
    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        """Text as text: control-token spellings in it are not control tokens."""
        return list(self.tokenizer.encode(text, bos=add_special_tokens, eos=False))

    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True,
                 **kwargs: Any) -> dict[str, Any]:
        truncation = kwargs.get("truncation")
        max_length = kwargs.get("max_length")

        def one(t: str) -> list[int]:
            ids = self.encode(t, add_special_tokens)
            if truncation and max_length is not None:
                ids = ids[:max_length]
            return ids
        if isinstance(text, str):
            return {"input_ids": one(text)}
        return {"input_ids": [one(t) for t in text]}

    def decode(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = False,
               **_: Any) -> str:
        ids = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        policy = self._policy.IGNORE if skip_special_tokens else self._policy.KEEP
        return self.tokenizer.decode(ids, special_token_policy=policy)

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = False,
                     **kwargs: Any) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    # ----------------------------------------------------------------- chat
    def encode_chat(self, conversation: list[dict[str, Any]],
                    tools: Optional[list[dict[str, Any]]] = None,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> tuple[list[int], str]:
        """(token ids, text) of a chat in the model's own format (mistral-common's
        request validation and instruct tokenizer); ValueError on a chat the format
        cannot express (the server's 400)."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        messages = [_openai_message(m) for m in conversation]
        try:
            request = ChatCompletionRequest.from_openai(
                messages, tools=tools or None, continue_final_message=continue_final_message)
            encoded = self.mistral.encode_chat_completion(request)
        except (MistralCommonException, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"mistral-common cannot encode this chat: {e}") from e
        ids = list(encoded.tokens)
        return ids, self.decode(ids)

    def apply_chat_template(self, conversation: list[dict[str, Any]],
                            tools: Optional[list[dict[str, Any]]] = None,
                            tokenize: bool = True, add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **kwargs: Any) -> Any:
        """transformers' call, answered by mistral-common (a `chat_template` is ignored,
        as vLLM does for Mistral tokenizers)."""
        if kwargs.get("chat_template"):
            logger.warning("--tokenizer-mode mistral: the chat template is ignored; "
                           "mistral-common renders the chat.")
        ids, text = self.encode_chat(conversation, tools, add_generation_prompt,
                                     continue_final_message)
        return ids if tokenize else text


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message of the server's conversation in the OpenAI shape mistral-common reads:
    content parts joined to text, tool-call arguments as JSON text."""
    out = {k: v for k, v in message.items() if v is not None}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = "".join(p.get("text", "") if isinstance(p, dict) else str(p)
                                 for p in content)
    calls = out.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            fn = dict(call.get("function") or {})
            if not isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.dumps(fn.get("arguments") or {})
            call["function"] = fn
            call.setdefault("type", "function")
            fixed.append(call)
        out["tool_calls"] = fixed
    if out.get("role") == "assistant" and "content" not in out and not calls:
        out["content"] = ""
    return out


def is_mistral_tokenizer(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "is_mistral", False))

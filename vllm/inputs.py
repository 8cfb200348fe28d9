"""Prompt types of the public API (vLLM's `vllm.inputs`): what `LLM.generate`,
`LLM.embed`, ... and the engine's `add_request` accept for one prompt.

A prompt is a string, a `TextPrompt` ({"prompt": str}) or a `TokensPrompt`
({"prompt_token_ids": [...]}, optionally with the text it came from). vLLM's
`EmbedsPrompt` (precomputed input embeddings) is refused with a ValueError naming the
field. `multi_modal_data` ({"image": ...}) is taken by multimodal models
(Processor.process_prompt) and refused for the others.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from typing_extensions import NotRequired, TypedDict

if TYPE_CHECKING:
    import torch


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""
    prompt: str
    multi_modal_data: NotRequired[Any]
    """{"image": PIL image or list} for multimodal models (vllm/multimodal)."""
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt given as token ids (`prompt`: the text they came from, if known)."""
    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    token_type_ids: NotRequired[list[int]]
    multi_modal_data: NotRequired[Any]
    cache_salt: NotRequired[str]


class EmbedsPrompt(TypedDict):
    """Input embeddings instead of tokens (refused: see the module docstring)."""
    prompt_embeds: "torch.Tensor"
    prompt: NotRequired[str]


DecoderOnlyPrompt = Union[str, TextPrompt, TokensPrompt, EmbedsPrompt]
SingletonPrompt = DecoderOnlyPrompt
PromptType = DecoderOnlyPrompt
"""Any one prompt accepted by the LLM APIs."""

_REFUSED_KEYS = {
    "prompt_embeds": "prompt embeddings (EmbedsPrompt) are not supported: no served model "
                     "takes input embeddings",
    "encoder_prompt": "encoder-decoder prompts are not supported: no encoder-decoder "
                      "model is served here",
}


def check_prompt_keys(prompt: dict[str, Any]) -> None:
    """ValueError naming the first field of a prompt dict this engine cannot honour."""
    salt = prompt.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError("cache_salt must be a non-empty string when given.")
    for key, reason in _REFUSED_KEYS.items():
        if key in prompt and prompt[key] is not None:
            raise ValueError(f"{key}: {reason}.")
    types = prompt.get("token_type_ids")
    if types is not None and any(types):
        raise ValueError("token_type_ids: pass a cross-encoder pair to LLM.score (it sets "
                         "the token types); per-token types are not taken here.")

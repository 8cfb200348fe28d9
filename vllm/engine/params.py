"""The one owner of a request's parameters.

Frontends (the OpenAI routes, `LLM`) pass what the caller gave; `RequestParamsPolicy`
applies the model's generation-config defaults (--generation-config,
--override-generation-config), checks the prompt and the params against the model, and
resolves max_tokens. The engine's input processor runs it for every request; the
resolved max_tokens is stored once, in `Request.max_tokens`, which the scheduler and
the metrics read.

Two kinds of params, as in vLLM:
- built in Python (`SamplingParams(...)`, offline `LLM`): taken as given; a max_tokens
  beyond the room left by the prompt is clamped to it (the request then finishes with
  "length" at max_model_len);
- a client's (`SamplingParams.from_client`, the server): fields it left unset take the
  model's defaults, the generation config's max_new_tokens caps max_tokens, and a
  max_tokens that cannot fit is refused (`MaxTokensTooLargeError`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.config import ModelConfig
from vllm.sampling_params import SamplingParams


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a single output token."""

    def __init__(self, prompt_len: int, max_model_len: int) -> None:
        self.prompt_len = prompt_len
        self.max_model_len = max_model_len
        super().__init__(
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
            f"length of {max_model_len}. Make sure that `max_model_len` is no smaller than "
            "the number of text tokens plus one.")


class PriorityNotEnabledError(ValueError):
    """A request priority other than 0 without --scheduling-policy priority."""

    def __init__(self, priority: int) -> None:
        self.priority = priority
        super().__init__(f"Got priority {priority} but Priority scheduling is not enabled.")


class MaxTokensTooLargeError(ValueError):
    """A client's prompt + max_tokens exceeds max_model_len."""

    def __init__(self, prompt_len: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
            "completion.")


@dataclass
class RequestParamsPolicy:
    """The model facts a request's parameters are checked and completed against."""
    max_model_len: int
    vocab_size: int
    max_logprobs: int
    defaults: dict[str, Any] = field(default_factory=dict)
    """Default sampling parameters from the generation config (get_diff_sampling_param)."""
    generation_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_model_config(cls, model_config: ModelConfig) -> "RequestParamsPolicy":
        return cls(max_model_len=model_config.max_model_len,
                   vocab_size=model_config.vocab_size,
                   max_logprobs=model_config.max_logprobs,
                   defaults=model_config.get_diff_sampling_param(),
                   generation_config=model_config.try_get_generation_config())

    # ----------------------------------------------------------- defaults
    def default_sampling_params(self) -> SamplingParams:
        """vLLM's defaults overridden by the model's generation config: what
        `LLM.generate` uses without params (`LLM.get_default_sampling_params`)."""
        return SamplingParams(**self.defaults)

    def apply_defaults(self, params: SamplingParams,
                       eos_token_id: Optional[int]) -> SamplingParams:
        """A copy of `params` with the model's defaults in the fields a client left unset
        and the model's end-of-sequence tokens recorded."""
        unset = params.client_unset_fields
        fill = {k: v for k, v in self.defaults.items()
                if unset is not None and k in unset and k != "max_tokens"}
        # replace() re-runs the checks, so a default temperature of 0 still turns the
        # truncation knobs off.
        params = dataclasses.replace(params, **fill) if fill else params.clone()
        params._client_unset = unset
        params.update_from_generation_config(self.generation_config, eos_token_id)
        return params

    # ------------------------------------------------------------- checks
    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("The decoder prompt cannot be empty.")
        bad = next((t for t in prompt_token_ids if t < 0 or t >= self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"Token id {bad} is out of vocabulary (vocab size "
                             f"{self.vocab_size}).")
        self.check_prompt_length(n)

    def check_prompt_length(self, prompt_len: int) -> None:
        """PromptTooLongError unless the prompt leaves room for one output token."""
        if prompt_len >= self.max_model_len:
            raise PromptTooLongError(prompt_len, self.max_model_len)

    def resolve_max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        """The most tokens the request may generate: its max_tokens, within the room the
        prompt leaves (None: all of it); for a client's request also within the
        generation config's max_new_tokens, and refused when it cannot fit."""
        room = self.max_model_len - prompt_len
        requested = params.max_tokens
        if params.client_unset_fields is None:
            return room if requested is None else min(requested, room)
        if requested is not None and requested > room:
            raise MaxTokensTooLargeError(prompt_len, requested, self.max_model_len)
        cap = self.defaults.get("max_tokens")
        return min(v for v in (room, requested, cap) if v is not None)

    def process(self, prompt_token_ids: list[int], params: SamplingParams,
                eos_token_id: Optional[int]) -> tuple[SamplingParams, int]:
        """(params completed with the model's defaults, the resolved max_tokens), or a
        ValueError naming what is wrong."""
        params = self.apply_defaults(params, eos_token_id)
        self.check_prompt(prompt_token_ids)
        params.verify_against(self.vocab_size, self.max_logprobs)
        max_tokens = self.resolve_max_tokens(len(prompt_token_ids), params)
        if params.client_unset_fields is not None and params.min_tokens > max_tokens:
            # A client's min_tokens is checked against the max_tokens it will get (an
            # offline request's clamped max_tokens just ends it at max_model_len).
            raise ValueError(f"min_tokens must be less than or equal to max_tokens="
                             f"{max_tokens}, got {params.min_tokens}.")
        return params, max_tokens


def truncation_size(truncate_prompt_tokens: Optional[int], max_model_len: int,
                    max_tokens: Optional[int] = None) -> Optional[int]:
    """How many prompt tokens truncate_prompt_tokens keeps (None: no truncation).

    -1 keeps as many as leave room for `max_tokens` (max_model_len - max_tokens; all of
    max_model_len when max_tokens is not given, as in vLLM). 0 would leave nothing to
    complete (vLLM then renders no prompt at all), and more than max_model_len cannot
    be honoured: both are refused with a ValueError naming the field.
    """
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        room = max_model_len - (max_tokens or 0)
        return max(room, 1)
    if truncate_prompt_tokens < 1:
        raise ValueError(f"truncate_prompt_tokens must be -1 (keep the last max_model_len "
                         f"- max_tokens tokens) or at least 1, got {truncate_prompt_tokens}.")
    if truncate_prompt_tokens > max_model_len:
        raise ValueError(f"truncate_prompt_tokens={truncate_prompt_tokens} cannot be greater "
                         f"than max_model_len={max_model_len}; choose a smaller truncation "
                         "size.")
    return truncate_prompt_tokens

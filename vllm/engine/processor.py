"""Input processing: prompts to token ids, validated against the model's limits."""
from __future__ import annotations

from typing import Any, Optional, Union

from vllm.config import ModelConfig, StructuredOutputsConfig
from vllm.sampling_params import SamplingParams

PromptType = Union[str, dict[str, Any]]


class Processor:

    def __init__(self, model_config: ModelConfig, tokenizer,
                 structured_outputs_config: Optional[StructuredOutputsConfig] = None) -> None:
        self.model_config = model_config
        self.structured_outputs_config = structured_outputs_config or StructuredOutputsConfig()
        self.tokenizer = tokenizer
        self.generation_config = model_config.try_get_generation_config()
        self.eos_token_id: Optional[int] = tokenizer.eos_token_id
        if self.eos_token_id is None:
            eos = self.generation_config.get("eos_token_id")
            self.eos_token_id = eos[0] if isinstance(eos, list) else eos

    def tokenize_prompt(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        """(prompt text or None, token ids) for a str, {"prompt"} or {"prompt_token_ids"}."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, (list, tuple)) or not all(
                        isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise ValueError("prompt_token_ids must be a list of integers.")
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt and isinstance(prompt["prompt"], str):
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        raise ValueError(f"Invalid prompt {type(prompt).__name__}: expected a string, "
                         "{'prompt': str} or {'prompt_token_ids': list[int]}.")

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check the prompt and params; return the effective max_tokens."""
        n = len(prompt_token_ids)
        max_len = self.model_config.max_model_len
        if n == 0:
            raise ValueError("The decoder prompt cannot be empty.")
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise ValueError(f"Token id {bad} is out of vocabulary (vocab size {vocab}).")
        if n >= max_len:
            raise ValueError(
                f"The decoder prompt (length {n}) is longer than the maximum model length of "
                f"{max_len}. Make sure that `max_model_len` is no smaller than the number of "
                "text tokens plus one.")
        params.verify_against(vocab, self.model_config.max_logprobs)
        room = max_len - n
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def structured_output_request(self, params: SamplingParams):
        """The request's checked structured-output constraint (None without one).

        Parses the schema / regex / grammar here, in the frontend, so a bad one fails
        the request with a ValueError naming the field instead of reaching the engine.
        """
        if params.structured_outputs is None:
            return None
        from vllm.structured_output import validate_structured_outputs
        return validate_structured_outputs(params.structured_outputs,
                                           self.structured_outputs_config)

    def prepare_params(self, params: SamplingParams) -> SamplingParams:
        params = params.clone()
        params.update_from_generation_config(self.generation_config, self.eos_token_id)
        return params

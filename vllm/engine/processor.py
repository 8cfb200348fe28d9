"""Input processing: prompts to token ids; params completed and checked against the model
(vllm/engine/params.py)."""
from __future__ import annotations

from typing import Optional

from vllm.config import ModelConfig, StructuredOutputsConfig
from vllm.engine.params import RequestParamsPolicy
from vllm.inputs import PromptType, check_prompt_keys
from vllm.sampling_params import SamplingParams

__all__ = ["Processor", "PromptType"]


class Processor:

    def __init__(self, model_config: ModelConfig, tokenizer,
                 structured_outputs_config: Optional[StructuredOutputsConfig] = None) -> None:
        self.model_config = model_config
        self.structured_outputs_config = structured_outputs_config or StructuredOutputsConfig()
        self.tokenizer = tokenizer
        self.params_policy = RequestParamsPolicy.from_model_config(model_config)
        self.mm_processor = None
        """Images -> features (vllm/multimodal/processing.py), for multimodal models."""
        if getattr(model_config, "is_multimodal_model", False):
            from vllm.multimodal.processing import MultiModalProcessor
            self.mm_processor = MultiModalProcessor(model_config)
        self.eos_token_id: Optional[int] = tokenizer.eos_token_id
        if self.eos_token_id is None:
            eos = model_config.try_get_generation_config().get("eos_token_id")
            self.eos_token_id = eos[0] if isinstance(eos, list) else eos

    def process_prompt(self, prompt: PromptType
                       ) -> tuple[Optional[str], list[int], Optional[list]]:
        """(prompt text or None, token ids, multimodal features or None).

        A prompt with `multi_modal_data` goes through the model's processor, which
        expands its image placeholders; a token prompt is decoded to text for it.
        """
        mm_data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if mm_data is None:
            return (*self.tokenize_prompt(prompt), None)
        if self.mm_processor is None:
            raise ValueError("multi_modal_data: multimodal inputs are not supported by "
                             f"this model ({', '.join(self.model_config.architectures)}).")
        text = prompt.get("prompt")
        if not isinstance(text, str):
            ids = prompt.get("prompt_token_ids")
            if ids is None:
                raise ValueError("A prompt with multi_modal_data needs 'prompt' text or "
                                 "'prompt_token_ids'.")
            text = self.tokenizer.decode(list(ids))
        ids, features = self.mm_processor.process(text, mm_data)
        return text, ids, features or None

    def tokenize_prompt(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        """(prompt text or None, token ids) for a str, {"prompt"} or {"prompt_token_ids"}."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            check_prompt_keys(prompt)
            if prompt.get("multi_modal_data") is not None:
                raise ValueError("multi_modal_data: multimodal inputs are taken by "
                                 "generation requests only (not pooling or beam search).")
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

    def process_params(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> tuple[SamplingParams, int]:
        """(params with the model's defaults applied, the resolved max_tokens): the one
        place a request's parameters are completed and checked (vllm/engine/params.py)."""
        return self.params_policy.process(prompt_token_ids, params, self.eos_token_id)

    def default_sampling_params(self) -> SamplingParams:
        """vLLM's defaults overridden by the model's generation config."""
        return self.params_policy.default_sampling_params()

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

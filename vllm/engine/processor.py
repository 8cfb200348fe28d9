"""Input processing: prompts to token ids; params completed and checked against the model
(vllm/engine/params.py)."""
from __future__ import annotations

from typing import Any, Optional

from vllm.config import ModelConfig, StructuredOutputsConfig
from vllm.engine.params import RequestParamsPolicy, truncation_size
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
        from vllm.sample.logits_processors.load import load_custom_logitsprocs
        self.custom_logitsprocs = load_custom_logitsprocs(
            getattr(model_config, "logits_processors", None))
        """Custom logits-processor classes, whose `validate_params` checks each request."""
        self.mm_processor = None
        """Images -> features (vllm/multimodal/processing.py), for multimodal models."""
        if getattr(model_config, "is_multimodal_model", False):
            from vllm.multimodal.processing import MultiModalProcessor, mm_limit
            # --limit-mm-per-prompt '{"image": 0}': the language model alone, no images
            if mm_limit(getattr(model_config, "limit_mm_per_prompt", None), "image") > 0:
                self.mm_processor = MultiModalProcessor(model_config)
        self.eos_token_id: Optional[int] = getattr(tokenizer, "eos_token_id", None)
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
        check_prompt_keys(prompt)
        if self.mm_processor is None and getattr(self.model_config, "is_multimodal_model",
                                                 False):
            raise ValueError("multi_modal_data: --limit-mm-per-prompt allows no images "
                             "(the model serves text only).")
        if self.mm_processor is None:
            raise ValueError("multi_modal_data: multimodal inputs are not supported by "
                             f"this model ({', '.join(self.model_config.architectures)}).")
        text = prompt.get("prompt")
        if not isinstance(text, str):
            ids = prompt.get("prompt_token_ids")
            if ids is None:
                raise ValueError("A prompt with multi_modal_data needs 'prompt' text or "
                                 "'prompt_token_ids'.")
            text = self._need_tokenizer().decode(list(ids))
        ids, features = self.mm_processor.process(text, mm_data)
        return text, ids, features or None

    def tokenize_prompt(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        """(prompt text or None, token ids) for a str, {"prompt"} or {"prompt_token_ids"}."""
        if isinstance(prompt, str):
            return prompt, self._need_tokenizer().encode(prompt)
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
                return prompt["prompt"], self._need_tokenizer().encode(prompt["prompt"])
        raise ValueError(f"Invalid prompt {type(prompt).__name__}: expected a string, "
                         "{'prompt': str} or {'prompt_token_ids': list[int]}.")

    def tokenize_with(self, prompt: PromptType, kwargs: dict[str, Any]) -> PromptType:
        """A text prompt as {"prompt", "prompt_token_ids"}, tokenized with the caller's
        tokenizer arguments (vLLM's tokenization_kwargs, e.g. truncation=True,
        max_length=N); a token prompt unchanged (there is nothing to tokenize)."""
        text = prompt if isinstance(prompt, str) else (
            prompt.get("prompt") if isinstance(prompt, dict) and
            "prompt_token_ids" not in prompt else None)
        if not isinstance(text, str):
            return prompt
        try:
            ids = self._need_tokenizer()(text, **kwargs)["input_ids"]
        except TypeError as e:
            raise ValueError(f"tokenization_kwargs: {e}") from e
        out = dict(prompt) if isinstance(prompt, dict) else {}
        out.update(prompt=text, prompt_token_ids=list(ids))
        return out

    def truncate_prompt(self, prompt_ids: list[int], params: SamplingParams,
                        mm_features: Optional[list]) -> list[int]:
        """The prompt's last `params.truncate_prompt_tokens` tokens (-1: as many as leave
        room for max_tokens), as vLLM keeps them; the ids unchanged without it or when
        they are short enough. A prompt with images is not cut (the expanded image
        placeholders would be cut apart)."""
        keep = truncation_size(params.truncate_prompt_tokens, self.model_config.max_model_len,
                               params.max_tokens)
        if keep is None or len(prompt_ids) <= keep:
            return prompt_ids
        if mm_features:
            raise ValueError("truncate_prompt_tokens cannot cut a prompt with images.")
        return prompt_ids[-keep:]

    def process_params(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> tuple[SamplingParams, int]:
        """(params with the model's defaults applied, the resolved max_tokens): the one
        place a request's parameters are completed and checked (vllm/engine/params.py)."""
        params, max_tokens = self.params_policy.process(prompt_token_ids, params,
                                                        self.eos_token_id)
        if self.tokenizer is None:
            self._without_tokenizer(params)
        elif params.bad_words:
            params.update_from_tokenizer(self.tokenizer)
        if self.custom_logitsprocs:
            from vllm.sample.logits_processors.load import validate_params
            validate_params(self.custom_logitsprocs, params)
        return params, max_tokens

    def _need_tokenizer(self) -> Any:
        """The tokenizer, or vLLM's error when skip_tokenizer_init left it unloaded."""
        if self.tokenizer is None:
            raise ValueError("You cannot pass text prompts when `skip_tokenizer_init=True`: "
                             "pass {'prompt_token_ids': [...]} instead.")
        return self.tokenizer

    @staticmethod
    def _without_tokenizer(params: SamplingParams) -> None:
        """skip_tokenizer_init: outputs are token ids with empty text (detokenize off,
        as vLLM); what needs text (stop strings, bad words, grammars) is refused rather
        than silently ignored."""
        for name in ("stop", "bad_words", "structured_outputs"):
            if getattr(params, name):
                raise ValueError(f"{name} needs the tokenizer, which skip_tokenizer_init=True "
                                 "does not load (use stop_token_ids / allowed_token_ids).")
        params.detokenize = False

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

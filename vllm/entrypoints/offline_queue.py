"""`LLM.enqueue` / `enqueue_chat` / `wait_for_completion` (vLLM's names): add requests
now, run them later, e.g. to queue prompts from several places before one batched run.
Queued requests wait in the engine; `wait_for_completion` steps it until every queued
request finished and returns their outputs in queuing order."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from vllm.engine.processor import PromptType
from vllm.entrypoints.offline_inputs import ChatOptions, check_priority, cumulative
from vllm.lora.request import LoRARequest
from vllm.outputs import PoolingRequestOutput, RequestOutput
from vllm.sampling_params import SamplingParams


class OfflineQueueMixin:
    """Needs `LLM`'s `_add_requests`, `_run_engine`, `_normalize_*` and chat helpers."""

    def enqueue(self, prompts: Union[PromptType, Sequence[PromptType]],
                sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                lora_request: Union[Sequence[LoRARequest], LoRARequest, None] = None,
                priority: Optional[Union[int, Sequence[int]]] = None,
                use_tqdm: bool = True,
                tokenization_kwargs: Optional[dict[str, Any]] = None) -> list[str]:
        """Queue prompts for generation without running them; their request ids."""
        if self.llm_engine.model_config.runner_type != "generate":
            raise ValueError("LLM.enqueue() is only supported for generative models.")
        prompt_list = self._normalize_prompts(prompts, None)
        if tokenization_kwargs:
            prompt_list = [self._tokenize(p, tokenization_kwargs) for p in prompt_list]
        priorities = check_priority(priority, len(prompt_list))
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = [cumulative(p) for p in
                  self._normalize_params(sampling_params, len(prompt_list))]
        loras = self._normalize_loras(lora_request, len(prompt_list))
        ids = self._add_requests(prompt_list, params, loras, priorities)
        self._queued.extend(ids)
        return ids

    def enqueue_chat(self, messages: Union[list[dict[str, Any]], list[list[dict[str, Any]]]],
                     sampling_params: Union[SamplingParams, Sequence[SamplingParams],
                                            None] = None,
                     lora_request: Optional[LoRARequest] = None,
                     chat_template: Optional[str] = None,
                     add_generation_prompt: bool = True,
                     continue_final_message: bool = False,
                     chat_template_kwargs: Optional[dict[str, Any]] = None,
                     use_tqdm: bool = True,
                     chat_template_content_format: str = "auto",
                     tools: Optional[list[dict[str, Any]]] = None) -> list[str]:
        """Queue chat conversations (rendered as LLM.chat does) for generation."""
        prompts = self._chat_prompts(messages, ChatOptions(
            chat_template, chat_template_content_format, add_generation_prompt,
            continue_final_message, tools, chat_template_kwargs or {}, None))
        return self.enqueue(prompts, sampling_params, lora_request=lora_request)

    def wait_for_completion(self, output_type: Any = None, *, use_tqdm: bool = True
                            ) -> list[Any]:
        """Run every queued request to the end; their outputs in queuing order (only
        those of `output_type`, default RequestOutput and PoolingRequestOutput)."""
        ids, self._queued = self._queued, []
        outputs = self._run_engine(ids, use_tqdm)
        kinds = output_type or (RequestOutput, PoolingRequestOutput)
        return [o for o in outputs if isinstance(o, kinds)]

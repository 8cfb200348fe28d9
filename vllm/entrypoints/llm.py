"""The offline API: `LLM(...).generate(prompts, sampling_params)` and `LLM.chat`."""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Optional, Sequence, Union

from tqdm.auto import tqdm

from vllm.beam_search import BeamSearchOutput, run_beam_search
from vllm.config import DEFAULT_MODEL
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.engine.output_processor import RequestFailure
from vllm.engine.processor import PromptType
from vllm.entrypoints.offline_inputs import ChatOptions, check_priority, cumulative
from vllm.entrypoints.offline_queue import OfflineQueueMixin
from vllm.entrypoints.offline_stats import OfflineStats
from vllm.entrypoints.pooling_offline import PoolingOfflineMixin
from vllm.entrypoints.weight_update_offline import WeightUpdateOfflineMixin
from vllm.metrics.reader import Metric
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)

ChatMessages = list[dict[str, Any]]


class LLM(PoolingOfflineMixin, OfflineQueueMixin, WeightUpdateOfflineMixin):
    """An LLM for offline batched generation, with vLLM's constructor arguments.

    Any EngineArgs field may be passed as a keyword (max_num_seqs, block_size,
    enable_prefix_caching, kv_cache_memory_bytes, ...).
    """

    def __init__(self, model: str = DEFAULT_MODEL, tokenizer: Optional[str] = None,
                 dtype: str = "auto", seed: int = 0, max_model_len: Optional[int] = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.92,
                 enforce_eager: bool = False, **kwargs: Any) -> None:
        known = {f for f in EngineArgs.__dataclass_fields__}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"Unknown LLM argument(s): {', '.join(unknown)}")
        if kwargs.get("data_parallel_size", 1) != 1:
            raise ValueError(
                f"data_parallel_size={kwargs['data_parallel_size']}: the offline LLM runs one "
                "engine (allowed: 1); serve with `vllm serve --data-parallel-size N` for "
                "replicas behind one server.")
        kwargs.setdefault("disable_log_stats", True)
        engine_args = EngineArgs(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed,
                                 max_model_len=max_model_len,
                                 tensor_parallel_size=tensor_parallel_size,
                                 gpu_memory_utilization=gpu_memory_utilization,
                                 enforce_eager=enforce_eager, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self.request_counter = itertools.count()
        self._queued: list[str] = []
        """Request ids of enqueue() not yet collected by wait_for_completion()."""
        self._stashed: dict[str, Any] = {}
        """Outputs of queued requests that finished while another call ran the engine."""
        self._stats = (None if engine_args.disable_log_stats
                       else OfflineStats(self.llm_engine.model_config,
                                         self.llm_engine.vllm_config.cache_config,
                                         self.llm_engine.vllm_config.speculative_config))

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLM":
        return cls(**vars(engine_args))

    @property
    def model_config(self):
        """The engine's ModelConfig (vLLM's attribute)."""
        return self.llm_engine.model_config

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        return self.llm_engine.get_supported_tasks()

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """`func(model)` on every rank's model (the torch module); one result per rank.
        The function travels by value (cloudpickle) when the engine runs elsewhere."""
        return self.llm_engine.apply_model(func)

    def get_world_size(self, include_dp: bool = True) -> int:
        """tensor x pipeline parallel ranks (the offline LLM runs one replica, so the
        data-parallel size is 1 either way)."""
        return self.llm_engine.vllm_config.parallel_config.world_size

    def get_metrics(self) -> list[Metric]:
        """The engine's Prometheus metrics as Counter / Gauge / Histogram objects
        (vllm.metrics.reader); needs LLM(..., disable_log_stats=False)."""
        if self._stats is None:
            raise ValueError("Stat logging disabled: create the LLM with "
                             "disable_log_stats=False to collect metrics.")
        return self._stats.snapshot()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's defaults, overridden by the model's generation config (as chosen by
        generation_config / override_generation_config): what generate() and chat() use
        when no sampling params are given. The engine's input processor owns them."""
        return self.llm_engine.processor.default_sampling_params()

    # ------------------------------------------------------------- admin
    def collective_rpc(self, method: Union[str, Callable[..., Any]],
                       timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        """Run a worker method (by name), or `method(worker, *args, **kwargs)`, on every
        rank of the engine; one result per rank."""
        return self.llm_engine.collective_rpc(method, timeout=timeout, args=args,
                                              kwargs=kwargs)

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Give the memory back while idle (needs enable_sleep_mode=True): level 1 frees
        the KV cache and offloads the weights to host memory, level 2 discards both.
        Generation is refused until `wake_up()`."""
        self.llm_engine.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore the weights and the KV cache (or only `tags`: "weights", "kv_cache")."""
        self.llm_engine.wake_up(tags)

    def start_profile(self) -> None:
        """Start the torch profiler on every worker (needs VLLM_TORCH_PROFILER_DIR)."""
        self.llm_engine.start_profile()

    def stop_profile(self) -> None:
        self.llm_engine.stop_profile()

    # ------------------------------------------------------------ generate
    def generate(self, prompts: Union[PromptType, Sequence[PromptType], None] = None,
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: Union[bool, Callable[..., Any]] = True,
                 prompt_token_ids: Optional[list] = None,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]],
                                     None] = None, *,
                 priority: Optional[Sequence[int]] = None,
                 tokenization_kwargs: Optional[dict[str, Any]] = None) -> list[RequestOutput]:
        """vLLM's generate: one finished RequestOutput per prompt, in order.

        `lora_request`: one adapter for all prompts, or one (or None) per prompt.
        `priority`: one per prompt, lower first (needs --scheduling-policy priority
        unless all 0). `tokenization_kwargs` go to the tokenizer call on text prompts (e.g.
        {"truncation": True, "max_length": 512}). `use_tqdm` may be a tqdm-like class
        that builds the progress bar. Each request's final output is complete
        whatever `output_kind` its params name (DELTA is for streaming consumers).
        """
        prompt_list = self._normalize_prompts(prompts, prompt_token_ids)
        if tokenization_kwargs:
            prompt_list = [self._tokenize(p, tokenization_kwargs) for p in prompt_list]
        priorities = check_priority(priority, len(prompt_list))
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = [cumulative(p) for p in
                       self._normalize_params(sampling_params, len(prompt_list))]
        lora_list = self._normalize_loras(lora_request, len(prompt_list))
        request_ids = self._add_requests(prompt_list, params_list, lora_list, priorities)
        return self._run_engine(request_ids, use_tqdm)

    def beam_search(self, prompts: Union[PromptType, Sequence[PromptType]],
                    params: BeamSearchParams, lora_request: Optional[LoRARequest] = None,
                    use_tqdm: bool = False,
                    concurrency_limit: Optional[int] = None) -> list[BeamSearchOutput]:
        """Beam search (vllm/beam_search.py): per prompt, the `params.beam_width` best
        sequences, best first. Steps run as batches of 1-token requests whose beams
        share their prefix blocks through the prefix cache; `concurrency_limit` prompts
        at a time (default: all), to bound the beams in flight."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}.")
        if concurrency_limit is not None and (
                isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int)
                or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be a positive integer, got "
                             f"{concurrency_limit!r}.")
        processor = self.llm_engine.processor
        token_lists = [processor.tokenize_prompt(p)[1]
                       for p in self._normalize_prompts(prompts, None)]
        tokenizer = self.get_tokenizer()

        def generate(batch: list[list[int]], step: SamplingParams) -> list[RequestOutput]:
            return self.generate([{"prompt_token_ids": t} for t in batch], step,
                                 use_tqdm=False, lora_request=lora_request)

        chunk = concurrency_limit or max(1, len(token_lists))
        outputs: list[BeamSearchOutput] = []
        for start in range(0, len(token_lists), chunk):
            outputs += run_beam_search(
                token_lists[start:start + chunk], params, processor.eos_token_id, generate,
                lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        return outputs

    @staticmethod
    def _normalize_loras(lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]],
                                             None], num: int) -> list[Optional[LoRARequest]]:
        """One adapter for every prompt, or a list with one (or None) per prompt."""
        if lora_request is None or isinstance(lora_request, LoRARequest):
            return [lora_request] * num
        loras = list(lora_request)
        if len(loras) != num:
            raise ValueError(f"The lengths of prompts ({num}) and lora_request "
                             f"({len(loras)}) must be the same.")
        return loras

    @staticmethod
    def _normalize_prompts(prompts, prompt_token_ids) -> list[PromptType]:
        if prompt_token_ids is not None:  # legacy keyword
            ids = prompt_token_ids
            if ids and isinstance(ids[0], int):
                ids = [ids]
            return [{"prompt_token_ids": list(t)} for t in ids]
        if prompts is None:
            raise ValueError("prompts must be given.")
        if isinstance(prompts, (str, dict)):
            return [prompts]
        return list(prompts)

    @staticmethod
    def _normalize_params(sampling_params, num: int) -> list[SamplingParams]:
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num
        params = list(sampling_params)
        if len(params) != num:
            raise ValueError(f"The lengths of prompts ({num}) and sampling_params "
                             f"({len(params)}) must be the same.")
        return params

    def _add_requests(self, prompts: list[PromptType], params: list[SamplingParams],
                      loras: Optional[list[Optional[LoRARequest]]] = None,
                      priorities: Optional[list[int]] = None) -> list[str]:
        """Add all or nothing: a bad prompt aborts the ones already added, then raises."""
        added: list[str] = []
        loras = loras or [None] * len(prompts)
        priorities = priorities or [0] * len(prompts)
        try:
            for prompt, p, lora, prio in zip(prompts, params, loras, priorities):
                request_id = str(next(self.request_counter))
                queued = self.llm_engine.add_request(request_id, prompt, p, lora_request=lora,
                                                     priority=prio)
                added.append(request_id)
                if self._stats is not None:
                    self._stats.on_request_added(request_id, p, queued)
        except Exception:
            self.llm_engine.abort_request(added)
            raise
        return added

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        # Queued requests (enqueue) that finished during an earlier run wait here.
        finished = {r: self._stashed.pop(r) for r in request_ids if r in self._stashed}
        make_bar = use_tqdm if callable(use_tqdm) else tqdm
        bar = make_bar(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True,
                       disable=not use_tqdm)
        in_toks = out_toks = 0
        try:
            while engine.has_unfinished_requests():
                step_outputs = engine.step()
                for output in step_outputs:
                    if isinstance(output, RequestFailure):
                        raise ValueError(f"Request {output.request_id}: {output.error}")
                if self._stats is not None:
                    self._stats.on_step(step_outputs, engine.get_stats())
                for output in step_outputs:
                    if output.finished:
                        finished[output.request_id] = output
                        in_toks += len(output.prompt_token_ids)
                        if isinstance(output, RequestOutput):  # pooling: no output tokens
                            out_toks += sum(len(o.token_ids) for o in output.outputs)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"est. speed input: {in_toks / elapsed:.2f} toks/s,"
                                            f" output: {out_toks / elapsed:.2f} toks/s")
                        bar.update(1)
        except BaseException:
            engine.abort_request([r for r in request_ids if r not in finished])
            raise
        finally:
            bar.close()
        wanted = set(request_ids)
        self._stashed.update({r: o for r, o in finished.items() if r not in wanted})
        return [finished[r] for r in request_ids if r in finished]

    # ---------------------------------------------------------------- chat
    def chat(self, messages: Union[ChatMessages, list[ChatMessages]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: Union[bool, Callable[..., Any]] = True,
             lora_request: Optional[LoRARequest] = None,
             chat_template: Optional[str] = None,
             chat_template_content_format: str = "auto",
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: Optional[list[dict[str, Any]]] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None,
             mm_processor_kwargs: Optional[dict[str, Any]] = None,
             tokenization_kwargs: Optional[dict[str, Any]] = None) -> list[RequestOutput]:
        """Chat completions offline, with vLLM's arguments in vLLM's order. Content may
        be a string or OpenAI-style parts: {"type": "text", "text": ...}, and with a
        multimodal model {"type": "image_url", "image_url": {"url": ...}} (data:,
        http(s):, file: under allowed_local_media_path) or {"type": "image_pil",
        "image_pil": PIL image}. `tools` (OpenAI function definitions) go to the
        template; `tokenization_kwargs` to the tokenizer call on the rendered text."""
        if mm_processor_kwargs:
            raise ValueError("mm_processor_kwargs: per-request multimodal processor "
                             "arguments are not supported by this engine.")
        prompts = self._chat_prompts(messages, ChatOptions(
            chat_template, chat_template_content_format, add_generation_prompt,
            continue_final_message, tools, chat_template_kwargs or {}, tokenization_kwargs))
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)

    def _chat_prompts(self, messages: Union[ChatMessages, list[ChatMessages]],
                      options: ChatOptions) -> list[dict[str, Any]]:
        """One engine prompt per conversation (`messages` is one, or a list of them)."""
        if options.add_generation_prompt and options.continue_final_message:
            raise ValueError("continue_final_message and add_generation_prompt cannot both "
                             "be true.")
        conversations = (messages if messages and isinstance(messages[0], (list, tuple))
                         else [messages])
        return [self._chat_prompt(list(conv), options) for conv in conversations]

    def _chat_prompt(self, conversation: ChatMessages, options: ChatOptions
                     ) -> dict[str, Any]:
        """The engine prompt of one conversation: token ids, or for a multimodal model
        whose messages hold images, the rendered text and the images (loaded here). The
        server's message parsing and template call, its 400s raised as ValueError."""
        from vllm.entrypoints.openai import chat_utils
        from vllm.entrypoints.openai.errors import OpenAIError
        mm = self.llm_engine.processor.mm_processor
        tokenizer = self.get_tokenizer()
        try:
            fmt = chat_utils.resolve_content_format(
                options.content_format,
                options.chat_template or getattr(tokenizer, "chat_template", None),
                multimodal=mm is not None)
            conversation, refs = chat_utils.conversation_and_images(
                conversation, mm.image_placeholder if mm is not None else None, fmt)
            if getattr(tokenizer, "is_mistral", False):  # tokenizer_mode="mistral"
                ids, text = chat_utils.render_mistral_chat(
                    tokenizer, conversation, chat_template=options.chat_template,
                    add_generation_prompt=options.add_generation_prompt,
                    continue_final_message=options.continue_final_message,
                    chat_template_kwargs=options.chat_template_kwargs, tools=options.tools)
                return {"prompt": text, "prompt_token_ids": ids}
            text = chat_utils.apply_chat_template(
                tokenizer, conversation, chat_template=options.chat_template,
                add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message,
                chat_template_kwargs=options.chat_template_kwargs, tools=options.tools)
        except OpenAIError as e:  # the server's 400 is the offline API's ValueError
            raise ValueError(str(e)) from e
        if refs:
            from vllm.multimodal.media import load_image_url
            root = self.llm_engine.model_config.allowed_local_media_path
            images = [load_image_url(r, root) if isinstance(r, str) else r for r in refs]
            return {"prompt": text, "multi_modal_data": {"image": images}}
        ids = tokenizer(text, add_special_tokens=False,
                        **(options.tokenization_kwargs or {}))["input_ids"]
        return {"prompt": text, "prompt_token_ids": list(ids)}

"""LLMEngine: the synchronous frontend over the engine core.

add_request tokenizes and validates, fans n > 1 out into n core requests, and
hands them to the EngineCore; step() runs one core step and turns its token
outputs into RequestOutputs (text, logprobs, stop strings).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from vllm.config import VllmConfig
from vllm.core.scheduler import SchedulerStats
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.core_client import make_engine_core, use_multiprocessing
from vllm.engine.output_processor import OutputProcessor, ParentRequest
from vllm.engine.params import PriorityNotEnabledError
from vllm.tracing import init_tracer
from vllm.engine.processor import Processor, PromptType
from vllm.kv_transfer.params import check_kv_transfer_params
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestMetrics, RequestOutput
from vllm.request import Request, RequestStatus
from vllm.pooling_params import PoolingParams, check_pooling_prompt
from vllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:

    def __init__(self, vllm_config: VllmConfig, log_stats: bool = True,
                 multiprocess: bool = False, wait_for_core: bool = True,
                 core_address: Optional[str] = None) -> None:
        """`wait_for_core=False` (a core in its own process): return once the tokenizer
        is loaded, while the core may still initialize; call `wait_for_core()` before
        the first request (a server builds its app meanwhile). `core_address`: a shared
        engine core already running there (several API servers, data parallel over
        nodes: vllm/engine/core_server.py) instead of a core of this engine's own."""
        from vllm.transformers_utils.tokenizer import get_tokenizer
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.log_stats = log_stats
        mc = self.model_config
        logger.info("Initializing engine: model=%s, dtype=%s, max_model_len=%d, device=%s, "
                    "block_size=%d, prefix_caching=%s, chunked_prefill=%s", mc.model,
                    str(mc.torch_dtype).removeprefix("torch."), mc.max_model_len,
                    vllm_config.device_config.device, vllm_config.cache_config.block_size,
                    vllm_config.cache_config.enable_prefix_caching,
                    vllm_config.scheduler_config.enable_chunked_prefill)
        # A core process is started first: it initializes while the tokenizer loads here.
        core = make_engine_core(vllm_config, multiprocess=True, wait_ready=False,
                                address=core_address) \
            if multiprocess or core_address is not None else None
        try:
            # skip_tokenizer_init: token ids in, token ids out, as vLLM (no tokenizer).
            self.tokenizer = None if mc.skip_tokenizer_init else get_tokenizer(
                mc.tokenizer_path, tokenizer_mode=mc.tokenizer_mode)
            self.processor = Processor(mc, self.tokenizer,
                                       vllm_config.structured_outputs_config)
            self.output_processor = OutputProcessor(self.tokenizer, init_tracer(
                vllm_config.observability_config, mc.served_model_name[0]))
            if core is None:
                core = make_engine_core(vllm_config, multiprocess=False)
            elif wait_for_core:
                core.wait_ready()
        except BaseException:
            if core is not None:
                core.shutdown()
            raise
        self.engine_core = core
        """The EngineCore itself, or a client of one in its own process (core_client.py)."""

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess: Optional[bool] = None,
                         wait_for_core: bool = True) -> "LLMEngine":
        """`multiprocess` None: VLLM_ENABLE_V1_MULTIPROCESSING, else in-process."""
        if multiprocess is None:
            multiprocess = use_multiprocessing(default=False)
        from vllm.engine import core_launch
        # The config an early-forked core initializes from, when built from these args.
        config = core_launch.config_for(engine_args) if multiprocess else None
        return cls(config if config is not None else engine_args.create_engine_config(),
                   log_stats=not engine_args.disable_log_stats, multiprocess=multiprocess,
                   wait_for_core=wait_for_core)

    def wait_for_core(self) -> None:
        """Wait until the engine core is initialized (at once when it is, or runs in this
        process); raises its start-up error after stopping it."""
        wait_ready = getattr(self.engine_core, "wait_ready", None)
        if wait_ready is not None:
            wait_ready()

    def wakeup(self) -> None:
        """Make a `step()` waiting for an out-of-process core return now (thread-safe):
        the caller has requests or aborts to send first."""
        wakeup = getattr(self.engine_core, "wakeup", None)
        if wakeup is not None:
            wakeup()

    def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("Unable to get tokenizer because skip_tokenizer_init is True.")
        return self.tokenizer

    def get_model_config(self):
        return self.model_config

    # ------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: Optional[float] = None,
                    lora_request: Optional[LoRARequest] = None,
                    tokenization_kwargs: Optional[dict[str, Any]] = None,
                    trace_headers: Optional[Mapping[str, str]] = None,
                    priority: int = 0) -> list[Request]:
        """Validate and queue one request; ValueError for bad input (nothing is queued).

        vLLM's signature: `tokenization_kwargs` go to the tokenizer call on a text prompt;
        `priority` (lower runs first) needs --scheduling-policy priority unless it is 0,
        as in vLLM; `trace_headers` (the client's traceparent / tracestate) make the
        request's span a child of the client's trace. Returns the core requests queued (n of them), whose `max_tokens` is
        the resolved one (what the metrics report)."""
        if priority != 0 and self.vllm_config.scheduler_config.policy != "priority":
            raise PriorityNotEnabledError(priority)
        self.engine_core.check_awake()
        if tokenization_kwargs:
            prompt = self.processor.tokenize_with(prompt, tokenization_kwargs)
        if request_id in self.output_processor.parents:
            raise ValueError(f"Request id {request_id} is already in use.")
        if isinstance(params, PoolingParams):
            return [self._add_pooling_request(request_id, prompt, params, arrival_time,
                                              lora_request, priority)]
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams or PoolingParams instance.")
        if self.model_config.runner_type == "pooling":
            raise ValueError("This model runs as a pooling model (--runner pooling): it "
                             "takes PoolingParams (LLM.embed / classify / score / encode, "
                             "the embeddings and score APIs), not SamplingParams.")
        if lora_request is not None:
            lora_request = self._check_lora_request(lora_request)
        check_kv_transfer_params(params, self.vllm_config.kv_transfer_config)
        prompt_text, prompt_ids, mm_features = self.processor.process_prompt(prompt)
        check_whole_images(mm_features, self.vllm_config.scheduler_config)
        prompt_ids = self.processor.truncate_prompt(prompt_ids, params, mm_features)
        params, max_tokens = self.processor.process_params(prompt_ids, params)
        so_request = self.processor.structured_output_request(params)
        arrival = arrival_time if arrival_time is not None else time.time()
        parent = ParentRequest(request_id=request_id, prompt=prompt_text,
                               prompt_token_ids=prompt_ids, params=params,
                               metrics=RequestMetrics(arrival_time=arrival),
                               trace_headers=dict(trace_headers) if trace_headers else None)
        child_ids, child_params = self._fan_out(request_id, params)
        self.output_processor.add_request(parent, child_ids, child_params)
        requests = [Request(
            request_id=cid, prompt_token_ids=prompt_ids, sampling_params=cparams,
            eos_token_id=self.processor.eos_token_id, arrival_time=arrival,
            max_tokens=max_tokens, lora_request=lora_request, mm_features=mm_features,
            priority=priority,
            cache_salt=prompt.get("cache_salt") if isinstance(prompt, dict) else None,
            structured_output_request=(dataclasses.replace(so_request)
                                       if so_request is not None else None))
            for cid, cparams in zip(child_ids, child_params)]
        for request in requests:
            self.engine_core.add_request(request)
        return requests

    def _add_pooling_request(self, request_id: str, prompt: PromptType,
                             params: PoolingParams, arrival_time: Optional[float],
                             lora_request: Optional[LoRARequest],
                             priority: int = 0) -> Request:
        """Queue one pooling request: one step over the whole prompt, one vector out."""
        mc = self.model_config
        if mc.runner_type != "pooling":
            raise ValueError("PoolingParams need a pooling model: this one generates. Try "
                             "--runner pooling (--convert embed) to use it as one.")
        if lora_request is not None:
            lora_request = self._check_lora_request(lora_request)
        params = params.clone()
        task = params.task or mc.pooling_task
        if task != mc.pooling_task:
            raise ValueError(f"Unsupported task: {task!r} Supported tasks: "
                             f"{[mc.pooling_task]}")
        params.verify(task, mc)
        _, prompt_ids = self.processor.tokenize_prompt(prompt)
        check_pooling_prompt(prompt_ids, mc.max_model_len)
        request = Request(request_id=request_id, prompt_token_ids=prompt_ids,
                          sampling_params=SamplingParams(max_tokens=1),
                          eos_token_id=self.processor.eos_token_id,
                          arrival_time=arrival_time if arrival_time is not None else time.time(),
                          max_tokens=1, lora_request=lora_request, pooling_params=params,
                          priority=priority)
        self.output_processor.add_pooling_request(request_id, prompt_ids)
        self.engine_core.add_request(request)
        return request

    # --------------------------------------------------------------- LoRA
    def _check_lora_request(self, lora_request: LoRARequest) -> LoRARequest:
        """The first request naming an adapter has the workers load and check it, so a
        bad adapter is a ValueError here, not a failed step. Returns the adapter as
        loaded (its generation), which the request carries."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError("lora_request must be a vllm.lora.request.LoRARequest.")
        if self.vllm_config.lora_config is None:
            raise ValueError("lora_request: LoRA is not enabled; start the engine with "
                             "enable_lora=True (--enable-lora).")
        known = self.engine_core.loaded_loras.get(lora_request.lora_int_id)
        if known is None or known.lora_path != lora_request.lora_path or \
                lora_request.load_inplace:
            self.add_lora(lora_request)
            known = self.engine_core.loaded_loras[lora_request.lora_int_id]
        return known

    @staticmethod
    def _fan_out(request_id: str, params: SamplingParams
                 ) -> tuple[list[str], list[SamplingParams]]:
        """n > 1: n children, seeds offset by index so they differ but reproduce."""
        if params.n == 1:
            return [request_id], [params]
        ids, children = [], []
        for i in range(params.n):
            child = params.clone()
            child.n = 1
            if params.seed is not None:
                child.seed = (params.seed + i + 2**63) % 2**64 - 2**63  # stays int64
            ids.append(f"{i}_{request_id}")
            children.append(child)
        return ids, children

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        child_ids = self.output_processor.abort_requests(ids)
        self.engine_core.abort_requests(child_ids)

    # ---------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        core_outputs = self.engine_core.step()
        outputs, stopped = self.output_processor.process_outputs(core_outputs)
        if stopped:
            self.engine_core.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.engine_core.get_stats()

    @property
    def model_executor(self):
        """The executor (vLLM's name: vLLM-Gaudi's calibration scripts end with
        `llm.llm_engine.model_executor.shutdown()`)."""
        return self.engine_core.executor

    # ------------------------------------------------- admin operations
    # Each is one utility call (vllm/engine/utility.py); these are vLLM's spellings.
    def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "add_lora":  # every adapter load passes here (the servers' too)
            args = (self._stamp_lora(args[0]), *args[1:])
        return self.engine_core.call_utility(name, *args, **kwargs)

    def _stamp_lora(self, lora_request: LoRARequest) -> LoRARequest:
        """The request as loaded: a reload of a known id (load_inplace, or new files)
        gets the next generation, which the prefix-cache key carries (no block computed
        with the old weights is reused) and which makes the workers read the files again;
        load_inplace itself is spent here, so requests naming the adapter later do not
        reload it."""
        if not isinstance(lora_request, LoRARequest):
            return lora_request
        known = self.engine_core.loaded_loras.get(lora_request.lora_int_id)
        generation = 0
        if known is not None:
            reload = lora_request.load_inplace or known.lora_path != lora_request.lora_path
            generation = known.generation + 1 if reload else known.generation
        return dataclasses.replace(lora_request, load_inplace=False, generation=generation)

    def collective_rpc(self, method: Union[str, Callable[..., Any]],
                       timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        """Run a worker method (name), or `method(worker, *args, **kwargs)`, on every
        rank; one result per rank."""
        return self.call_utility("collective_rpc", method, timeout=timeout, args=args,
                                 kwargs=kwargs)

    def get_supported_tasks(self) -> tuple[str, ...]:
        """vLLM's task names this model serves: ("generate",) for a generative model,
        (its pooling task,) for a pooling one ("embed" or "classify"; vLLM has no
        "encode" task any more, and PoolingParams refuses it)."""
        mc = self.model_config
        if mc.runner_type == "pooling":
            return (mc.pooling_task,)
        return ("generate",)

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """`func(model)` on every rank's model; one result per rank."""
        return self.collective_rpc("apply_model", args=(func,))

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load (and check) an adapter in the workers; ValueError if it cannot be used."""
        return self.call_utility("add_lora", lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.call_utility("remove_lora", lora_id)

    def list_loras(self) -> set[int]:
        return self.call_utility("list_loras")

    def get_compile_stats(self) -> Optional[dict]:
        """HPU graph compilations (during and after warmup, buckets); None on CPU."""
        return self.call_utility("get_compile_stats")

    def get_bucket_stats(self) -> Optional[dict]:
        """HPU bucket padding since warmup: padded vs real compute and waste per phase,
        passes per bucket, fallback-bucket passes, warmup seconds, buckets left cold,
        compiles after warmup; None on platforms without buckets."""
        return self.call_utility("get_bucket_stats")

    def reset_prefix_cache(self) -> bool:
        return self.call_utility("reset_prefix_cache")

    def check_health(self) -> None:
        """Raise RuntimeError when a worker of the engine (or its core process) died or
        failed; a flag check, no round trip, so any thread may call it."""
        self.engine_core.check_health()

    def finalize_calibration(self) -> list[Optional[str]]:
        """INC MEASURE (`--quantization inc`, QUANT_CONFIG mode MEASURE): write the
        statistics recorded so far (also done at shutdown); the json path per rank."""
        return self.call_utility("finalize_calibration")

    def reload_quant_scales(self, dump_stats_path: Optional[str] = None) -> int:
        """INC QUANTIZE: load the input scales of another measurement (default: the
        QUANT_CONFIG's dump_stats_path, re-read) into the running model, in place."""
        return self.call_utility("reload_quant_scales", dump_stats_path)

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache, offload (1) or discard (2) the weights; needs
        enable_sleep_mode=True and no running request."""
        self.call_utility("sleep", level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        self.call_utility("wake_up", tags)

    def is_sleeping(self) -> bool:
        return self.call_utility("is_sleeping")

    def start_profile(self) -> None:
        """Start the torch profiler on every worker (needs VLLM_TORCH_PROFILER_DIR)."""
        self.call_utility("start_profile")

    def stop_profile(self) -> None:
        """Stop it; each worker writes its trace under VLLM_TORCH_PROFILER_DIR."""
        self.call_utility("stop_profile")

    def shutdown(self) -> None:
        self.engine_core.shutdown()
        if self.output_processor.tracer is not None:
            self.output_processor.tracer.shutdown()  # export the spans still batched


def check_whole_images(mm_features: Optional[list], scheduler_config: Any) -> None:
    """With images scheduled whole (--disable-chunked-mm-input, forced for models whose
    image tokens attend both ways), an image must fit one step's token budget."""
    if not mm_features or not scheduler_config.disable_chunked_mm_input:
        return
    budget = scheduler_config.max_num_batched_tokens
    for feature in mm_features:
        if feature.length > budget:
            raise ValueError(f"multi_modal_data: an image fills {feature.length} tokens, "
                             f"more than max_num_batched_tokens ({budget}), and this "
                             "model's images are never split between steps.")

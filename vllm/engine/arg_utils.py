"""EngineArgs: every engine option under vLLM's name, and its argparse flags.

Help text for each flag comes from the field docstrings in vllm/config.py, so the
config classes stay the single source of truth.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import sys
from dataclasses import dataclass, fields
from typing import Any, Optional

from vllm import envs
from vllm.config import (ATTENTION_BACKEND_NAMES, CONVERT_CHOICES, DEFAULT_MODEL,
                         KV_CACHE_DTYPES, MAMBA_CACHE_MODES, MAMBA_DTYPES,
                         MODEL_IMPL_CHOICES, RUNNER_CHOICES,
                         AttentionConfig, CacheConfig,
                         CompilationConfig, DeviceConfig,
                         LoadConfig, LoRAConfig, ModelConfig, ObservabilityConfig,
                         ParallelConfig, ProfilerConfig,
                         SchedulerConfig, StructuredOutputsConfig, VllmConfig,
                         WeightTransferConfig)
from vllm.kv_transfer.config import KVTransferConfig, engine_kv_transfer_config
from vllm.spec_decode.config import SpeculativeConfig
from vllm.transformers_utils.config import create_model_config
from vllm.utils.argparse_utils import human_readable_int, parse_json_dict


def _field_docs(cls: type) -> dict[str, str]:
    """Read the string literal that follows each field in a dataclass's source."""
    node = _class_node(cls)
    if node is None:
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _class_node(cls: type) -> Optional[ast.ClassDef]:
    """`cls`'s definition in its module's syntax tree. Each module is parsed once:
    `inspect.getsource` per class re-tokenizes the module every time (a quarter of a
    second for the config classes, paid by every server start)."""
    tree = _module_tree(cls.__module__)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    return None


@functools.lru_cache(maxsize=None)
def _module_tree(module_name: str) -> Optional[ast.Module]:
    module = sys.modules.get(module_name)
    try:
        return ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return None


_DOCS: dict[str, str] = {}
# A field several configs hold (max_model_len, download_dir) is documented by the first,
# the one the flag fills; the others hold copies.
for _cls in (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, DeviceConfig,
             LoadConfig, LoRAConfig, StructuredOutputsConfig, CompilationConfig,
             ObservabilityConfig):
    for _name, _doc in _field_docs(_cls).items():
        _DOCS.setdefault(_name, _doc)
_DOCS["kv_cache_dtype"] = _DOCS.get("cache_dtype", "")
_DOCS["enable_lora"] = "Serve LoRA adapters (per request, several in one batch)."
_DOCS["attention_backend"] = _field_docs(AttentionConfig).get("backend", "")
_DOCS["scheduling_policy"] = _field_docs(SchedulerConfig).get("policy", "")


_SHORT_FLAGS = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp",
                "data_parallel_size": "-dp", "data_parallel_size_local": "-dpl",
                "data_parallel_start_rank": "-dpr", "data_parallel_rpc_port": "-dpp"}
"""vLLM's short spellings."""


@dataclass
class EngineArgs:
    model: str = DEFAULT_MODEL
    tokenizer: Optional[str] = None
    served_model_name: Optional[list[str]] = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: Optional[int] = None
    quantization: Optional[str] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    hf_overrides: Optional[dict] = None
    generation_config: str = "auto"
    override_generation_config: Optional[dict] = None
    max_logprobs: int = 20
    enforce_eager: bool = False
    enable_sleep_mode: bool = False
    runner: str = "auto"
    convert: str = "auto"
    model_impl: str = "auto"
    pooler_config: Optional[dict] = None
    limit_mm_per_prompt: Optional[dict] = None
    allowed_local_media_path: str = ""
    logits_processors: Optional[list] = None
    # cache
    block_size: Optional[int] = None
    gpu_memory_utilization: float = 0.92
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    cpu_offload_gb: float = 0
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_block_size: Optional[int] = None
    mamba_cache_mode: str = "none"
    kv_offloading_size: Optional[float] = None
    kv_offloading_backend: str = "native"
    # scheduler
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    disable_hybrid_kv_cache_manager: bool = False
    disable_chunked_mm_input: bool = False
    scheduling_policy: str = "fcfs"
    # parallel
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_size_local: Optional[int] = None
    data_parallel_start_rank: int = 0
    data_parallel_address: Optional[str] = None
    data_parallel_rpc_port: int = 29550
    data_parallel_backend: str = "mp"
    distributed_executor_backend: Optional[str] = None
    enable_expert_parallel: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    # device / load
    device: str = "auto"
    load_format: str = "auto"
    download_dir: Optional[str] = None
    # structured outputs
    structured_outputs_config: Optional[dict] = None
    reasoning_parser: str = ""
    reasoning_parser_plugin: str = ""
    # LoRA
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None
    lora_dtype: str = "auto"
    # features refused with a clear error until supported
    speculative_config: Optional[dict] = None
    # KV transfer (prefill/decode disaggregation)
    kv_transfer_config: Optional[Any] = None
    disable_log_stats: bool = False
    # in-place weight updates (RL)
    weight_transfer_config: Optional[Any] = None
    # CUDA graphs and kernels
    compilation_config: Optional[Any] = None
    cudagraph_capture_sizes: Optional[list[int]] = None
    max_cudagraph_capture_size: Optional[int] = None
    attention_backend: Optional[str] = None
    # Hub access
    tokenizer_revision: Optional[str] = None
    hf_token: Optional[str | bool] = None
    ignore_patterns: Optional[list[str]] = None
    config_format: str = "auto"
    max_parallel_loading_workers: Optional[int] = None
    # observability (tracing, optional metric families)
    show_hidden_metrics_for_version: Optional[str] = None
    otlp_traces_endpoint: Optional[str] = None
    collect_detailed_traces: Optional[list[str]] = None
    kv_cache_metrics: bool = False
    kv_cache_metrics_sample: float = 0.01
    enable_mfu_metrics: bool = False
    profiler_config: Optional[dict] = None

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = DEFAULT_MODEL
        if isinstance(self.served_model_name, str):
            self.served_model_name = [self.served_model_name]

    # ------------------------------------------------------------------ CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one --flag per field, named as in vLLM (underscores become dashes)."""
        group = parser.add_argument_group("Engine arguments")
        for f in fields(EngineArgs):
            flag = "--" + f.name.replace("_", "-")
            default = (f.default if f.default is not dataclasses.MISSING else None)
            help_text = _DOCS.get(f.name, "")
            if f.name == "model":
                group.add_argument(flag, type=str, default=default, help=help_text)
            elif f.name in _SHORT_FLAGS:
                group.add_argument(flag, _SHORT_FLAGS[f.name], type=int, default=default,
                                   help=help_text)
            elif f.name in ("max_model_len", "max_num_batched_tokens"):
                group.add_argument(flag, type=human_readable_int, default=default,
                                   help=help_text + " Accepts k/m (x1000) and K/M (x1024) "
                                   "suffixes, e.g. 4k or 32K.")
            elif f.name == "kv_cache_dtype":
                group.add_argument(flag, type=str, default=default,
                                   choices=list(KV_CACHE_DTYPES), help=help_text)
            elif f.name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_cache_mode"):
                choices = MAMBA_CACHE_MODES if f.name == "mamba_cache_mode" else MAMBA_DTYPES
                group.add_argument(flag, type=str, default=default, choices=list(choices),
                                   help=help_text)
            elif f.name == "config_format":
                group.add_argument(flag, type=str, default=default,
                                   choices=["auto", "hf", "mistral"], help=help_text)
            elif f.name == "tokenizer_mode":
                group.add_argument(flag, type=str, default=default,
                                   choices=["auto", "slow", "mistral"],
                                   help=help_text)
            elif f.name in ("runner", "convert", "model_impl"):
                choices = {"runner": RUNNER_CHOICES, "convert": CONVERT_CHOICES,
                           "model_impl": MODEL_IMPL_CHOICES}[f.name]
                group.add_argument(flag, type=str, default=default, help=help_text,
                                   choices=list(choices))
            elif f.name in ("hf_overrides", "override_generation_config", "pooler_config",
                            "limit_mm_per_prompt"):
                group.add_argument(flag, type=parse_json_dict, default=None, help=help_text)
            elif f.type in ("bool", bool):
                group.add_argument(flag, action=argparse.BooleanOptionalAction,
                                   default=default, help=help_text)
            elif f.name in ("served_model_name", "logits_processors"):
                group.add_argument(flag, type=str, nargs="+", default=None, help=help_text)
            elif f.name == "structured_outputs_config":
                group.add_argument(
                    flag, type=json.loads, default=None,
                    help="Structured outputs config as JSON, e.g. '{\"backend\": "
                         "\"xgrammar\"}'. Keys: " + "; ".join(
                             f"{k}: {v}" for k, v in _field_docs(
                                 StructuredOutputsConfig).items()))
            elif f.name == "weight_transfer_config":
                group.add_argument(
                    flag, type=parse_json_dict, default=None,
                    help="In-place weight updates as JSON, e.g. '{\"backend\": \"shm\"}'. "
                         "Keys: " + "; ".join(f"{k}: {v}" for k, v in _field_docs(
                             WeightTransferConfig).items()))
            elif f.name == "compilation_config":
                group.add_argument(
                    flag, "-O", type=json.loads, default=None,
                    help="CUDA graph settings as JSON, e.g. '{\"cudagraph_capture_sizes\": "
                         "[1, 2, 4, 8]}'. Keys: " + "; ".join(
                             f"{k}: {v}" for k, v in _field_docs(CompilationConfig).items()))
            elif f.name == "profiler_config":
                group.add_argument(
                    flag, type=parse_json_dict, default=None,
                    help="The torch profiler as JSON, e.g. '{\"profiler\": \"torch\", "
                         "\"torch_profiler_dir\": \"./traces\"}' (replaces "
                         "VLLM_TORCH_PROFILER_DIR). Keys: " + "; ".join(
                             f"{k}: {v}" for k, v in _field_docs(ProfilerConfig).items()))
            elif f.name == "hf_token":
                group.add_argument(flag, type=str, nargs="?", const=True, default=None,
                                   help=help_text)
            elif f.name in ("ignore_patterns", "collect_detailed_traces"):
                group.add_argument(flag, type=_comma_list, default=None, help=help_text)
            elif f.name == "max_parallel_loading_workers":
                group.add_argument(flag, type=int, default=None,
                                   help="Refused: each worker loads its own shard at once "
                                        "(memory-mapped safetensors), there are no loading "
                                        "batches to bound.")
            elif f.name == "data_parallel_address":
                group.add_argument(flag, "-dpa", type=str, default=None, help=help_text)
            elif f.name == "data_parallel_backend":
                group.add_argument(flag, "-dpb", type=str, default=default,
                                   choices=["mp", "ray"], help=help_text)
            elif f.name == "kv_offloading_backend":
                group.add_argument(flag, type=str, default=default, help=help_text,
                                   choices=["native", "lmcache"])
            elif f.name == "scheduling_policy":
                group.add_argument(flag, type=str, default=default, help=help_text,
                                   choices=["fcfs", "priority"])
            elif f.name == "cudagraph_capture_sizes":
                group.add_argument(flag, type=int, nargs="+", default=None, help=help_text)
            elif f.name == "attention_backend":
                group.add_argument(flag, type=str.upper, default=None,
                                   choices=list(ATTENTION_BACKEND_NAMES), help=help_text)
            elif f.name == "reasoning_parser":
                # Not argparse choices: a --reasoning-parser-plugin file may add names
                # (checked when the config is built, after the plugin ran).
                from vllm.reasoning import ReasoningParserManager
                group.add_argument(flag, type=str, default="",
                                   help=_DOCS.get("reasoning_parser", "") + " One of " +
                                   ", ".join(ReasoningParserManager.names()) + ", or a name "
                                   "registered by --reasoning-parser-plugin.")
            elif f.name == "speculative_config":
                group.add_argument(
                    flag, type=json.loads, default=None,
                    help="Speculative decoding config as JSON, e.g. '{\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 3}'. Keys: " + "; ".join(
                             f"{k}: {v}" for k, v in _field_docs(SpeculativeConfig).items()
                             if k != "draft_model_config"))
            elif f.name == "kv_transfer_config":
                group.add_argument(
                    flag, type=json.loads, default=None,
                    help="KV transfer config as JSON (prefill/decode disaggregation), e.g. "
                         "'{\"kv_connector\": \"P2pZmqConnector\", \"kv_role\": "
                         "\"kv_producer\"}'. Keys: " + "; ".join(
                             f"{k}: {v}" for k, v in _field_docs(KVTransferConfig).items()))
            else:
                group.add_argument(flag, type=_parse_type(f.type), default=default,
                                   help=help_text)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)
                      if hasattr(args, f.name)})

    # ------------------------------------------------------------- config
    def create_engine_config(self) -> VllmConfig:
        envs.warn_unknown_variables()  # once per process, at start-up (as vLLM)
        if self.max_parallel_loading_workers is not None:
            raise ValueError(
                "--max-parallel-loading-workers is not supported: every worker loads its "
                "own shard at once, from memory-mapped safetensors, so there are no "
                "loading batches to bound. Leave it out.")
        observability_config = ObservabilityConfig(
            show_hidden_metrics_for_version=self.show_hidden_metrics_for_version,
            otlp_traces_endpoint=self.otlp_traces_endpoint,
            collect_detailed_traces=self.collect_detailed_traces,
            kv_cache_metrics=self.kv_cache_metrics,
            kv_cache_metrics_sample=self.kv_cache_metrics_sample,
            enable_mfu_metrics=self.enable_mfu_metrics)
        if observability_config.collect_detailed_traces:
            modules = ",".join(observability_config.collect_detailed_traces)
            raise ValueError(
                f"--collect-detailed-traces {modules}: the per-module timings (model "
                "forward, worker execute) are not measured by this engine. Leave it out: "
                "the request spans of --otlp-traces-endpoint still carry the queue, TTFT, "
                "prefill, decode and end-to-end latencies.")
        model_config = create_model_config(
            model=self.model, tokenizer=self.tokenizer, dtype=self.dtype, seed=self.seed,
            max_model_len=self.max_model_len, served_model_name=self.served_model_name,
            enforce_eager=self.enforce_eager, max_logprobs=self.max_logprobs,
            quantization=self.quantization, revision=self.revision,
            trust_remote_code=self.trust_remote_code, tokenizer_mode=self.tokenizer_mode,
            skip_tokenizer_init=self.skip_tokenizer_init,
            hf_overrides=self.hf_overrides, download_dir=self.download_dir,
            generation_config=self.generation_config,
            override_generation_config=self.override_generation_config,
            enable_sleep_mode=self.enable_sleep_mode, runner=self.runner,
            convert=self.convert, model_impl=self.model_impl, pooler_config=self.pooler_config,
            limit_mm_per_prompt=self.limit_mm_per_prompt,
            allowed_local_media_path=self.allowed_local_media_path,
            logits_processors=self.logits_processors,
            tokenizer_revision=self.tokenizer_revision, hf_token=self.hf_token,
            ignore_patterns=self.ignore_patterns, config_format=self.config_format)
        cache_config = CacheConfig(
            block_size=self.block_size, gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            cpu_offload_gb=self.cpu_offload_gb,
            cache_dtype=self.kv_cache_dtype,
            calculate_kv_scales=self.calculate_kv_scales,
            mamba_cache_dtype=self.mamba_cache_dtype,
            mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
            mamba_block_size=self.mamba_block_size, mamba_cache_mode=self.mamba_cache_mode,
            kv_offloading_size=self.kv_offloading_size,
            kv_offloading_backend=self.kv_offloading_backend)
        parallel_config = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
            data_parallel_size_local=self.data_parallel_size_local,
            data_parallel_start_rank=self.data_parallel_start_rank,
            data_parallel_address=self.data_parallel_address,
            data_parallel_rpc_port=self.data_parallel_rpc_port,
            data_parallel_backend=self.data_parallel_backend,
            distributed_executor_backend=self.distributed_executor_backend,
            enable_expert_parallel=self.enable_expert_parallel,
            nnodes=self.nnodes, node_rank=self.node_rank, master_addr=self.master_addr,
            master_port=self.master_port)
        device_config = DeviceConfig(device=self.device)
        max_num_seqs, max_num_batched_tokens = self._batch_defaults(
            device_config.device, model_config.runner_type, parallel_config.world_size)
        from vllm.model_executor.models.registry import attends_images_both_ways
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            async_scheduling=self.async_scheduling, policy=self.scheduling_policy,
            disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            disable_chunked_mm_input=(self.disable_chunked_mm_input or
                                      attends_images_both_ways(model_config.architectures)))
        so_config = StructuredOutputsConfig.from_cli(self.structured_outputs_config)
        if self.reasoning_parser_plugin:
            so_config.reasoning_parser_plugin = self.reasoning_parser_plugin
        if self.reasoning_parser:
            so_config.reasoning_parser = self.reasoning_parser
        if self.reasoning_parser or self.reasoning_parser_plugin:
            so_config.__post_init__()
        return VllmConfig(model_config=model_config, cache_config=cache_config,
                          scheduler_config=scheduler_config, parallel_config=parallel_config,
                          device_config=device_config,
                          load_config=LoadConfig(load_format=self.load_format,
                                                 download_dir=self.download_dir,
                                                 ignore_patterns=self.ignore_patterns),
                          lora_config=self._lora_config(),
                          structured_outputs_config=so_config,
                          speculative_config=self._speculative_config(model_config),
                          weight_transfer_config=WeightTransferConfig.from_cli(
                              self.weight_transfer_config),
                          kv_transfer_config=engine_kv_transfer_config(
                              self.kv_transfer_config, self.kv_offloading_size),
                          compilation_config=self._compilation_config(),
                          attention_config=AttentionConfig(backend=self.attention_backend),
                          observability_config=observability_config,
                          profiler_config=ProfilerConfig.from_cli(self.profiler_config))

    # (max_num_seqs, max_num_batched_tokens) per device when the user sets neither: vLLM's
    # CPU defaults differ for the offline LLM and the server (UsageContext); elsewhere the
    # SchedulerConfig's own (256 sequences; 8192 tokens with chunked prefill).
    CPU_BATCH_DEFAULTS = (256, 4096)
    """Offline (`LLM`) on CPU, per rank, as vLLM: a prompt's GEMMs in 4096-row chunks
    also stay in cache better than 8192-row ones (benchmarks/README.md)."""

    def _batch_defaults(self, device: str, runner_type: str, world_size: int
                        ) -> tuple[Optional[int], Optional[int]]:
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        if device != "cpu":
            return (SchedulerConfig.max_num_seqs if seqs is None else seqs), tokens
        default_seqs, default_tokens = self.CPU_BATCH_DEFAULTS
        if seqs is None:
            seqs = default_seqs * world_size
        # Pooling runs whole prompts in one pass (VllmConfig._configure_pooling sizes it).
        if tokens is None and self.enable_chunked_prefill and runner_type != "pooling":
            tokens = max(default_tokens * world_size, seqs)
        return seqs, tokens

    def _compilation_config(self) -> CompilationConfig:
        """--compilation-config, with the --cudagraph-capture-sizes and
        --max-cudagraph-capture-size shortcuts on top (a key set both ways must agree)."""
        config = CompilationConfig.from_cli(self.compilation_config)
        for name in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
            value = getattr(self, name)
            if value is None:
                continue
            current = getattr(config, name)
            if name == "cudagraph_capture_sizes":
                value = sorted(set(value))
            if current is not None and current != value:
                raise ValueError(f"{name} is set both in compilation_config ({current}) and "
                                 f"as --{name.replace('_', '-')} ({value}); set it once.")
            setattr(config, name, value)
        config.__post_init__()
        return config

    def _speculative_config(self, target: Any) -> Optional[SpeculativeConfig]:
        """The parsed --speculative-config; a draft model's config is loaded here, with
        the target's dtype and a context no longer than the target's."""
        spec = SpeculativeConfig.from_cli(self.speculative_config)
        if spec is not None and spec.use_draft_model:
            draft = create_model_config(
                model=spec.model, dtype=str(target.torch_dtype).removeprefix("torch."),
                seed=self.seed, max_model_len=spec.max_model_len,
                quantization=spec.quantization, revision=spec.revision,
                tokenizer_mode=self.tokenizer_mode, enforce_eager=self.enforce_eager,
                download_dir=self.download_dir)
            # The draft's own context, at most the target's (as vLLM): past it, requests
            # are verified without drafts (DraftModelProposer._context_left).
            draft.max_model_len = min(draft.max_model_len, target.max_model_len)
            spec.draft_model_config = draft
        return spec

    def _lora_config(self) -> Optional[LoRAConfig]:
        if not self.enable_lora:
            return None
        return LoRAConfig(max_lora_rank=self.max_lora_rank, max_loras=self.max_loras,
                          max_cpu_loras=self.max_cpu_loras, lora_dtype=self.lora_dtype)


@dataclass
class AsyncEngineArgs(EngineArgs):
    disable_log_requests: bool = False
    enable_log_requests: bool = False
    """Log each received request (vLLM's current spelling; this server logs them unless
    --disable-log-requests, so the flag only wins over that one)."""
    enable_log_outputs: bool = False
    """Log each finished request's output text, token ids and finish reason."""

    @property
    def log_requests(self) -> bool:
        return self.enable_log_requests or not self.disable_log_requests

    CPU_BATCH_DEFAULTS = (128, 2048)
    """The server on CPU, per rank, as vLLM: smaller prompt chunks keep the running
    streams' decode steps short (time per output token) while prompts arrive."""


def _comma_list(value: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (vLLM's spelling of list flags such as --ignore-patterns)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _parse_type(annotation: Any):
    """Map a field annotation (a string under postponed evaluation) to an argparse type."""
    text = str(annotation)
    if "int" in text and "float" not in text:
        return int
    if "float" in text:
        return float
    return str

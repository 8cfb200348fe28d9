"""Every environment variable the engine reads, in one place.

Each entry is (type, default, doc). Values are read lazily on attribute access
(`vllm.envs.VLLM_CPU_KVCACHE_SPACE`), so tests can set variables with
monkeypatch after import and see the change.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

logger = logging.getLogger(__name__)


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _opt_bool(value: str) -> bool | None:
    """True / False, or None for an empty value or 'auto' (let the engine decide)."""
    if value.strip().lower() in ("", "auto"):
        return None
    return _bool(value)


def _opt_int(value: str) -> int | None:
    return int(value) if value.strip() else None


def _opt_float(value: str) -> float | None:
    return float(value) if value.strip() else None


# name -> (parser, default, documentation)
environment_variables: dict[str, tuple[Callable[[str], Any], Any, str]] = {
    # ---- build / platform ----
    "VLLM_TARGET_DEVICE": (str, "", "Target device recorded at build time (hpu, cpu, cuda); "
                           "overrides the recorded one when set at run time."),
    "VLLM_PLUGINS": (str, None, "Comma-separated names of plugins to load; unset loads all, "
                     "set but empty loads none (as vLLM)."),
    "VLLM_USE_FAKE_HPU": (_bool, False, "Run the HPU path on CPU with the vllm.hpu stand-ins."),
    "VLLM_FAKE_HPU_MEMORY_GB": (str, "16", "Device memory the fake HPU reports, in GiB: one "
                                "number for every device, or a comma-separated list with one "
                                "value per device index (e.g. '16,8')."),
    "VLLM_FAKE_HPU_DEVICE_COUNT": (int, 8, "Devices (modules) the fake HPU has, as on an "
                                   "8-module Gaudi node."),
    "VLLM_ATTENTION_BACKEND": (str, "", "Attention backend when --attention-backend is not "
                               "given (vLLM's names: TRITON_ATTN, TORCH_SDPA, CPU_ATTN, "
                               "HPU_ATTN); empty: the platform's default."),
    # ---- CPU ----
    "VLLM_CPU_KVCACHE_SPACE": (float, 0.0, "KV cache size on CPU in GiB; 0 means automatic "
                               "(4 GiB, at most what max_num_seqs full-length sequences need "
                               "and half of the available memory, split between ranks)."),
    "VLLM_CPU_OMP_THREADS_BIND": (str, "auto", "Cores each CPU rank binds to: 'auto' (ranks "
                                  "take equal shares of the allowed cores), 'all' / 'nobind' "
                                  "(no binding), or one list per rank such as '0-3|4-7'."),
    "VLLM_CPU_ADAPTIVE_THREADS": (_bool, True, "Size the CPU forward's thread team to the "
                                  "cores other processes leave free, re-checked every half "
                                  "second (vllm/cpu/threads.py); 0 keeps the "
                                  "configured count."),
    "VLLM_CPU_NATIVE_OPS": (_bool, True, "Use the native CPU kernels (vllm/cpu, built once "
                            "with the system C++ compiler); 0 keeps every op in torch."),
    "VLLM_BATCH_INVARIANT": (_bool, False, "Per-request results that do not depend on the "
                             "batch (vLLM's batch-invariant mode): one GEMM kernel for every "
                             "row count on CPU; slower where another kernel would win."),
    "VLLM_CPU_RETUNE": (_bool, False, "Time the CPU kernel choices (GEMM, prefill attention) "
                        "again at this start, ignoring the cached plans."),
    "VLLM_CPU_NATIVE_GEMM": (_opt_bool, None, "Kernel of the bf16 linear layers: unset or "
                             "'auto' times the native GEMM (AVX512-BF16 or AVX2), oneDNN, a "
                             "float32 copy and torch per weight shape and row count at "
                             "start-up (cached) and uses the fastest; 1 forces the native "
                             "GEMM, 0 forces oneDNN (the float32 copy where oneDNN has no "
                             "bf16 kernel)."),
    # ---- quantization ----
    "VLLM_FP8_WEIGHT_SCALE": (str, "tensor", "Scales of weights quantized by --quantization "
                              "fp8: 'tensor' (one per tensor, vLLM's default) or 'channel'."),
    "QUANT_CONFIG": (str, "", "Path of the INC (Intel Neural Compressor) FP8 json config read "
                     "by --quantization inc: mode MEASURE (calibration) or QUANTIZE."),
    "PT_HPU_H2D_TRIVIAL_SCALES_MODE": (int, 0, "INC with runtime scale patching: 0 multiplies "
                                       "by every scale; 1 drops scales equal to 1.0 in the "
                                       "fp8 casts; 2 also in the fp8 GEMM (more graphs)."),
    # ---- server ----
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": (_bool, False, "Serve POST /v1/load_lora_adapter and "
                                         "/v1/unload_lora_adapter (local development only)."),
    "VLLM_API_KEY": (str, "", "API key the OpenAI server requires under /v1 when set."),
    "OPENAI_API_KEY": (str, "", "API key `vllm bench serve` sends (as vLLM's benchmark; the "
                       "openai client reads it itself in `vllm chat` / `vllm complete`)."),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": (_bool, False, "Accept a --max-model-len beyond the "
                                      "model's context length (max_position_embeddings "
                                      "and rope scaling), with a warning."),
    "VLLM_HOST_IP": (str, "", "IP address of this node for distributed setups."),
    "VLLM_PORT": (_opt_int, None, "Base port for distributed communication."),
    "VLLM_LOGGING_LEVEL": (str, "INFO", "Level of the vllm logger."),
    "VLLM_CACHE_ROOT": (str, os.path.join(os.path.expanduser("~"), ".cache", "vllm"),
                        "Where converted models (GGUF -> safetensors) are cached."),
    "VLLM_SERVER_DEV_MODE": (_bool, False, "Serve the development routes: POST /sleep, "
                             "POST /wake_up, GET /is_sleeping, POST /reset_prefix_cache. "
                             "Never in production: anyone reaching the server can use them."),
    "VLLM_TORCH_PROFILER_DIR": (str, "", "Directory each worker writes its torch profiler "
                                "trace to (start_profile / stop_profile, and the server's "
                                "POST /start_profile, /stop_profile); unset: profiling off."),
    "VLLM_TORCH_PROFILER_RECORD_SHAPES": (_bool, False, "Record the input shapes of each op "
                                          "in torch profiler traces."),
    "VLLM_TORCH_PROFILER_WITH_STACK": (_bool, True, "Record Python stacks in torch profiler "
                                       "traces."),
    "VLLM_ENGINE_ITERATION_TIMEOUT_S": (int, 60, "Seconds a worker may take for one step."),
    "PROMETHEUS_MULTIPROC_DIR": (str, "", "prometheus_client's multiprocess directory (its "
                                 "own variable): `vllm serve --api-server-count N` makes "
                                 "a fresh one for its API servers and removes it at exit; "
                                 "one set by the user is used and left in place."),
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": (_bool, False, "Keep the OpenAI server up (answering "
                                        "503) after its engine died, instead of exiting."),
    "VLLM_MAX_COMPLETION_PROMPTS": (int, 1024, "Most prompts one request may hold (a list "
                                    "`prompt` of /v1/completions, a list `input` of the "
                                    "pooling routes, the pairs of /score and the documents "
                                    "of /rerank), each one engine request; a 400 above it."),
    # ---- structured outputs (vllm/structured_output/limits.py) ----
    "VLLM_STRUCTURED_OUTPUT_MAX_SPEC_BYTES": (int, 512 * 1024, "Largest JSON schema, regex "
                                              "or grammar a request may constrain its "
                                              "output with, in bytes (a 400 above it)."),
    "VLLM_STRUCTURED_OUTPUT_MAX_PROPERTIES": (int, 5000, "Most properties (all objects "
                                              "together) a JSON schema constraint may have "
                                              "(OpenAI's limit)."),
    "VLLM_STRUCTURED_OUTPUT_MAX_ENUM_VALUES": (int, 10000, "Most enum values (all enums "
                                               "together) a JSON schema constraint may have."),
    "VLLM_STRUCTURED_OUTPUT_MAX_PATTERNS": (int, 1000, "Most `pattern` / patternProperties "
                                            "regexes a JSON schema constraint may have."),
    "VLLM_STRUCTURED_OUTPUT_MAX_NESTING": (int, 64, "Deepest nesting of a JSON schema "
                                           "constraint (objects and arrays of the schema "
                                           "document itself)."),
    "VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S": (float, 10.0, "Seconds one grammar compile "
                                                 "may take (in its helper process) before "
                                                 "its request fails with a 400."),
    "VLLM_STRUCTURED_OUTPUT_COMPILE_MAX_MEMORY_MB": (int, 2048, "Memory one grammar compile "
                                                     "may add (MiB, the helper process's "
                                                     "resident growth) before its request "
                                                     "fails with a 400."),
    "VLLM_STRUCTURED_OUTPUT_COMPILE_WORKERS": (int, 2, "Grammar compiles that run at once, "
                                               "each in its own helper process (smallest "
                                               "spec first when more wait)."),
    "VLLM_CHAT_TEMPLATE_WORKERS": (int, 4, "Helper processes that render request-supplied "
                                   "chat templates at once, each under its own deadline."),
    "VLLM_IMAGE_FETCH_TIMEOUT": (float, 5.0, "Seconds to fetch one http(s) image URL of a "
                                 "chat request (vLLM's name)."),
    "VLLM_MEDIA_MAX_BYTES": (int, 20 * 2**20, "Largest image file or download accepted, in "
                             "bytes (a data URL's decoded size, an http(s) body, a file)."),
    "VLLM_MEDIA_MAX_PIXELS": (int, 40_000_000, "Largest image accepted, in pixels (width x "
                              "height), checked before its pixels are decoded."),
    "VLLM_CHAT_TEMPLATE_TIMEOUT_S": (float, 5.0, "Seconds a request-supplied chat template "
                                     "(--trust-request-chat-template) may take to render."),
    "VLLM_ENABLE_RESPONSES_API_STORE": (_bool, False, "Keep /v1/responses results (store: "
                                        "true) for GET /v1/responses/{id}, "
                                        "previous_response_id and background responses "
                                        "(as vLLM, off by default: a store:true request is "
                                        "answered but not kept)."),
    "VLLM_RESPONSES_API_STORE_MAX_BYTES": (int, 256 * 2**20, "Bound of the /v1/responses "
                                           "store in bytes (each entry counted as its JSON "
                                           "text); the oldest responses are evicted first, "
                                           "and one larger than the bound is not kept."),
    "VLLM_ENABLE_V1_MULTIPROCESSING": (_opt_bool, None, "Run the engine core in its own "
                                       "process (1) or in the frontend's (0); unset: its own "
                                       "for the server and AsyncLLMEngine, in-process for "
                                       "LLM."),
    "VLLM_WORKER_MULTIPROC_METHOD": (str, "fork", "How worker processes start: fork "
                                     "(default; spawn is used instead once CUDA, HPU or Ray "
                                     "runs in the engine process) or spawn."),
    # ---- read from other tools' conventions ----
    "RAY_ADDRESS": (str, "", "Address of a running Ray cluster for the ray executor; empty "
                    "starts a local one."),
    "CXX": (str, "g++", "C++ compiler that builds the native CPU kernels."),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": (str, "", "OpenTelemetry's: the protocol of the "
                                           "--otlp-traces-endpoint exporter; only "
                                           "http/protobuf (the default here) is supported."),
    # ---- HPU (see HPU.md) ----
    "PT_HPU_LAZY_MODE": (int, 0, "1: lazy mode (HPU graphs); 0: eager / torch.compile."),
    "PT_HPU_ENABLE_LAZY_COLLECTIVES": (_bool, False, "Required for TP with HPU graphs."),
    "PT_HPU_WEIGHT_SHARING": (_bool, True, "Gaudi bridge: share weights between host and "
                              "device tensors; the HPU plugin sets 0 unless given."),
    "RUNTIME_SCALE_PATCHING": (_opt_bool, None, "Gaudi FP8 (--quantization inc): 1 passes "
                               "scales as runtime tensors (one graph for all scales), 0 "
                               "bakes them into graphs as constants; unset: 1 in eager / "
                               "torch.compile mode (the HPU plugin also sets it), 0 in lazy "
                               "mode."),
    "VLLM_SKIP_WARMUP": (_bool, False, "Skip bucket warmup (first requests then compile; "
                         "HPU graphs are captured on first use)."),
    "VLLM_EXPONENTIAL_BUCKETING": (_bool, True, "Deprecated alias of VLLM_BUCKETING_STRATEGY"
                                   " (true: exp, false: lin)."),
    "VLLM_BUCKETING_STRATEGY": (str, "", "HPU bucket ranges: exp (default), lin, pad "
                                "(padding capped by *_PAD_PERCENT / *_PAD_MAX) or plan "
                                "(VLLM_BUCKET_PLAN)."),
    "VLLM_BUCKET_PLAN": (str, "", "Bucket plan file written by python -m "
                         "vllm.hpu.bucket_planner; implies VLLM_BUCKETING_STRATEGY=plan."),
    "VLLM_BUCKET_TRACE": (str, "", "Record the HPU runner's pass shapes to this file (a "
                          "trace for the bucket planner)."),
    "VLLM_PROMPT_PASS_OVERHEAD_TOKENS": (_opt_int, None, "Fixed cost of one HPU prompt pass "
                                         "in token slots, which the runner weighs against "
                                         "padding when it splits a step's prompts into "
                                         "passes; unset: the bucket plan's, else 128."),
    "VLLM_WARMUP_BUDGET_S": (float, 0.0, "HPU warmup time budget in seconds (0: none): "
                             "buckets are warmed in order of expected traffic and the "
                             "rest is left cold."),
    "VLLM_GRAPH_RESERVED_MEM": (_opt_float, None, "Share of usable memory kept for HPU "
                                "graphs; unset: measured from probe graphs at start-up."),
    "VLLM_GRAPH_PROMPT_RATIO": (_opt_float, None, "Share of graph memory given to prompt "
                                "graphs; unset: their measured share (0.3 when set by hand)."),
    "VLLM_GRAPH_PROMPT_STRATEGY": (str, "min_tokens", "Prompt capture order (min_tokens|max_bs)."),
    "VLLM_GRAPH_DECODE_STRATEGY": (str, "max_bs", "Decode capture order (max_bs|min_tokens)."),
    "VLLM_PROFILER_ENABLED": (_bool, False, "Write a high-level profile trace."),
    "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION": (_bool, False, "Log steps that compiled a graph."),
    "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION_ALL": (_bool, False, "Log every step's compiles."),
    "VLLM_HPU_LOG_STEP_CPU_FALLBACKS": (_bool, False, "Log steps with CPU fallbacks."),
    "VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL": (_bool, False, "Log every step's CPU fallbacks."),
    "VLLM_CONTIGUOUS_PA": (_bool, True, "Contiguous paged attention (used when prefix caching "
                           "is off)."),
    "VLLM_DEFRAG_THRESHOLD": (int, 32, "Defragment when max_used - num_used exceeds this."),
    "VLLM_HPU_FSDPA_GQA": (str, "native", "Grouped-query K/V for FusedSDPA: native (current "
                           "Gaudi software takes fewer KV heads) or repeat (expand K/V with "
                           "repeat_interleave, as older software needed)."),
}

for _kind in ("PROMPT", "DECODE"):
    for _dim in ("BS", "SEQ", "BLOCK"):
        for _part in ("MIN", "STEP", "MAX"):
            environment_variables[f"VLLM_{_kind}_{_dim}_BUCKET_{_part}"] = (
                _opt_int, None, f"{_kind.lower()} {_dim.lower()} bucket {_part.lower()}")
        environment_variables[f"VLLM_{_kind}_{_dim}_BUCKET_PAD_PERCENT"] = (
            _opt_int, None, f"pad strategy: most padding of a {_kind.lower()} {_dim.lower()} "
            "bucket, in percent of its value (default 25)")
        environment_variables[f"VLLM_{_kind}_{_dim}_BUCKET_PAD_MAX"] = (
            _opt_int, None, f"pad strategy: most padding of a {_kind.lower()} {_dim.lower()} "
            "bucket (default a quarter of its max)")


def __getattr__(name: str) -> Any:
    if name not in environment_variables:
        raise AttributeError(f"module 'vllm.envs' has no attribute {name!r}")
    parse, default, _ = environment_variables[name]
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError as e:
        raise ValueError(f"Invalid value {raw!r} for environment variable {name}: {e}") from e


def is_set(name: str) -> bool:
    """Whether the variable was given at all (to tell a default from an explicit value)."""
    if name not in environment_variables:
        raise AttributeError(f"module 'vllm.envs' has no attribute {name!r}")
    return name in os.environ


_unknown_checked = False


def warn_unknown_variables() -> list[str]:
    """Warn, once per process, about each VLLM_* variable set that nothing here reads,
    as vLLM does at start-up: a typo (VLLM_SKIP_WARMPU) or another backend's knob
    (vllm-fork's VLLM_PROMPT_USE_FUSEDSDPA) is otherwise silently ignored. Returns
    the names warned about (empty after the first call)."""
    global _unknown_checked
    if _unknown_checked:
        return []
    _unknown_checked = True
    unknown = sorted(n for n in os.environ
                     if n.startswith("VLLM_") and n not in environment_variables)
    for name in unknown:
        logger.warning("Unknown vLLM environment variable detected: %s (this engine does "
                       "not read it; see vllm/envs.py for the ones it does)", name)
    return unknown


def __dir__() -> list[str]:
    return list(environment_variables)

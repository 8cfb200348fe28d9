"""vllm-hpu: a vLLM-compatible LLM inference engine with an Intel Gaudi backend."""
import vllm.logger  # noqa: F401  (configures the "vllm" logger)
from vllm.version import __version__

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineArgs",
           "LLMEngine", "AsyncLLMEngine", "AsyncEngineArgs", "__version__"]

_LAZY = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "EngineArgs": "vllm.engine.arg_utils",
    "AsyncEngineArgs": "vllm.engine.arg_utils",
    "LLMEngine": "vllm.engine.llm_engine",
    "AsyncLLMEngine": "vllm.engine.async_llm_engine",
}


def __getattr__(name: str):
    """Import heavy modules (torch, transformers) only when first used."""
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")

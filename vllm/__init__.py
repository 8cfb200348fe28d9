"""vllm-hpu: a vLLM-compatible LLM inference engine with an Intel Gaudi backend."""
import vllm.logger  # noqa: F401  (configures the "vllm" logger)
from vllm.version import __version__, __version_tuple__

__all__ = ["__version__", "__version_tuple__", "LLM", "ModelRegistry", "PromptType",
           "TextPrompt", "TokensPrompt", "SamplingParams", "RequestOutput", "CompletionOutput",
           "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput", "EmbeddingRequestOutput",
           "ClassificationOutput", "ClassificationRequestOutput", "ScoringOutput",
           "ScoringRequestOutput", "LLMEngine", "EngineArgs", "AsyncLLMEngine",
           "AsyncEngineArgs", "initialize_ray_cluster", "PoolingParams"]

_LAZY = {
    **{name: "vllm.outputs" for name in (
        "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput", "EmbeddingRequestOutput",
        "ClassificationOutput", "ClassificationRequestOutput", "ScoringOutput",
        "ScoringRequestOutput")},
    "ModelRegistry": "vllm.model_executor.models.registry",
    "PromptType": "vllm.inputs",
    "TextPrompt": "vllm.inputs",
    "TokensPrompt": "vllm.inputs",
    "PoolingParams": "vllm.pooling_params",
    "initialize_ray_cluster": "vllm.executor.ray_utils",
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

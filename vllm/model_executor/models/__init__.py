"""Model implementations, found by HF architecture name through `ModelRegistry`."""
from vllm.model_executor.models.registry import ModelRegistry

__all__ = ["ModelRegistry"]

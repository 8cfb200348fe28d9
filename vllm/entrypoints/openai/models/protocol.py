"""vLLM 0.32's import path for the /v1/models response models and LoRAModulePath.

The classes live in `vllm.entrypoints.openai.protocol` and `serving_models`; this
module re-exports them under vLLM 0.32's name.
"""
from vllm.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission  # noqa: F401
from vllm.entrypoints.openai.serving_models import LoRAModulePath  # noqa: F401

__all__ = ["LoRAModulePath", "ModelCard", "ModelList", "ModelPermission"]

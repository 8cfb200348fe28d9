"""vLLM 0.32's import path for the models every OpenAI API shares: the error body,
usage and the base model.

They live in `vllm.entrypoints.openai.protocol`; vLLM 0.32 calls the usage details
`PromptTokenUsageInfo`, the same class as `PromptTokensDetails` here.
"""
from vllm.entrypoints.openai.protocol import (  # noqa: F401 - re-exports
    ErrorInfo, ErrorResponse, OpenAIBaseModel, PromptTokensDetails, UsageInfo)

PromptTokenUsageInfo = PromptTokensDetails

__all__ = ["ErrorInfo", "ErrorResponse", "OpenAIBaseModel", "PromptTokenUsageInfo",
           "PromptTokensDetails", "UsageInfo"]

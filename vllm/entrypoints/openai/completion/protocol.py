"""vLLM 0.32's import path for the completion request and response models.

The models live in `vllm.entrypoints.openai.protocol`; this module re-exports them so
code written against vLLM 0.32's per-API modules imports the same classes.
"""
from vllm.entrypoints.openai.protocol import (  # noqa: F401 - re-exports
    CompletionLogProbs, CompletionRequest, CompletionResponse, CompletionResponseChoice,
    CompletionResponseStreamChoice, CompletionStreamResponse, StreamOptions, UsageInfo)

__all__ = ["CompletionLogProbs", "CompletionRequest", "CompletionResponse",
           "CompletionResponseChoice", "CompletionResponseStreamChoice",
           "CompletionStreamResponse", "StreamOptions", "UsageInfo"]

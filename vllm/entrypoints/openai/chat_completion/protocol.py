"""vLLM 0.32's import path for the chat completion request and response models.

vLLM 0.32 split its OpenAI protocol module by API; code written against it imports from
here. The models live in `vllm.entrypoints.openai.protocol` (one module, as before the
split); this module only re-exports them so both paths name the same classes.
"""
from vllm.entrypoints.openai.protocol import (  # noqa: F401 - re-exports
    ChatCompletionLogProb, ChatCompletionLogProbs, ChatCompletionLogProbsContent,
    ChatCompletionNamedFunction, ChatCompletionNamedToolChoiceParam, ChatCompletionRequest,
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse, ChatCompletionToolsParam, ChatMessage, DeltaFunctionCall,
    DeltaMessage, DeltaToolCall, FunctionCall, FunctionDefinition, StreamOptions, ToolCall,
    UsageInfo)

__all__ = [
    "ChatCompletionLogProb", "ChatCompletionLogProbs", "ChatCompletionLogProbsContent",
    "ChatCompletionNamedFunction", "ChatCompletionNamedToolChoiceParam",
    "ChatCompletionRequest", "ChatCompletionResponse", "ChatCompletionResponseChoice",
    "ChatCompletionResponseStreamChoice", "ChatCompletionStreamResponse",
    "ChatCompletionToolsParam", "ChatMessage", "DeltaFunctionCall", "DeltaMessage",
    "DeltaToolCall", "FunctionCall", "FunctionDefinition", "StreamOptions", "ToolCall",
    "UsageInfo"]

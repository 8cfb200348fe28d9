"""vLLM 0.32's import path for the Responses API request model.

It lives in `vllm.entrypoints.openai.protocol_responses`; this module re-exports it.
"""
from vllm.entrypoints.openai.protocol_responses import ResponsesRequest  # noqa: F401

__all__ = ["ResponsesRequest"]

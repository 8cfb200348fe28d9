"""The Anthropic Messages API routes of the server (mounted by default, as in vLLM).

Every failure answers in Anthropic's error shape (`{"type": "error", "error": {"type",
"message"}}`) with the HTTP status the OpenAI routes would use, so the `anthropic` SDK
raises its own error classes (BadRequestError for invalid_request_error, ...).
"""
from __future__ import annotations

import json
from typing import Any, Callable

import pydantic
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from vllm.engine.protocol import EngineDeadError
from vllm.entrypoints.anthropic.protocol import (CountTokensRequest, MessagesRequest,
                                                 error_body)
from vllm.entrypoints.anthropic.serving_messages import AnthropicServingMessages
from vllm.entrypoints.openai.errors import (BadRequestError, OpenAIError,
                                            lone_surrogate_path, validation_error)
from vllm.entrypoints.openai.serving_engine import SSE_HEADERS


def install_anthropic_routes(app: FastAPI, state: Any,
                             with_cancellation: Callable[..., Any]) -> None:
    if getattr(state.engine.model_config, "runner_type", "generate") == "pooling":
        return
    messages = AnthropicServingMessages(state.chat)
    # Plain routes (not the app's JSON-checking route class): the body is read and
    # checked here, so that even a malformed one is answered in Anthropic's shape.
    router = APIRouter()

    @router.post("/v1/messages")
    @with_cancellation
    async def create_message(raw_request: Request) -> Any:
        try:
            request = await _parse(raw_request, MessagesRequest)
            result = await messages.create_message(request)
        except Exception as e:  # noqa: BLE001 - every failure in Anthropic's shape
            return anthropic_error(e)
        if hasattr(result, "__aiter__"):
            return StreamingResponse(result, media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return JSONResponse(result)

    @router.post("/v1/messages/count_tokens")
    @with_cancellation
    async def count_tokens(raw_request: Request) -> Any:
        try:
            request = await _parse(raw_request, CountTokensRequest)
            return JSONResponse(await messages.count_tokens(request))
        except Exception as e:  # noqa: BLE001 - every failure in Anthropic's shape
            return anthropic_error(e)

    app.include_router(router)


async def _parse(raw_request: Request, model: type[pydantic.BaseModel]) -> Any:
    try:
        body = json.loads(await raw_request.body())
    except ValueError as e:
        raise BadRequestError(f"The request body is not valid JSON: {e}.") from None
    bad = lone_surrogate_path(body)
    if bad is not None:
        raise BadRequestError(f"{bad or 'body'}: the string is not valid Unicode (a lone "
                              "surrogate).", param=bad or None)
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as e:
        raise validation_error(e.errors()) from None


def anthropic_error(exc: BaseException) -> JSONResponse:
    """The Anthropic error response for what a Messages route raised."""
    if isinstance(exc, OpenAIError):
        status, message = int(exc.status), exc.message
    elif isinstance(exc, EngineDeadError):
        status, message = 503, str(exc)
    elif isinstance(exc, ValueError):
        status, message = 400, str(exc)
    else:
        import logging
        logging.getLogger(__name__).exception("Messages request failed")
        status, message = 500, f"{type(exc).__name__}: {exc}"
    return JSONResponse(error_body(status, message), status_code=status)

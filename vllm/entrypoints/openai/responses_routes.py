"""The `/v1/responses` routes (generative models): create, retrieve, cancel."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from vllm.entrypoints.openai.protocol_responses import ResponsesRequest
from vllm.entrypoints.openai.serving_engine import SSE_HEADERS
from vllm.entrypoints.openai.serving_responses import OpenAIServingResponses


def install_responses_routes(app: FastAPI, state: Any,
                             with_cancellation: Callable[..., Any]) -> None:
    if getattr(state.engine.model_config, "runner_type", "generate") == "pooling":
        return
    responses = OpenAIServingResponses(state.chat)
    app.state.vllm_responses = responses

    @app.post("/v1/responses")
    @with_cancellation
    async def create_response(request: ResponsesRequest, raw_request: Request) -> Any:
        result = await responses.create_response(request)
        if hasattr(result, "__aiter__"):
            return StreamingResponse(result, media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return JSONResponse(result)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, raw_request: Request) -> Any:
        return JSONResponse(responses.retrieve(response_id))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, raw_request: Request) -> Any:
        return JSONResponse(await responses.cancel(response_id))

"""The pooling routes, installed when the served model is a pooling model (as vLLM
registers them by the model's tasks): `/v1/embeddings`, `/pooling`, `/classify`,
`/score`, `/v1/score`, `/rerank`, `/v1/rerank`, `/v2/rerank`."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.protocol_pooling import (ClassificationRequest, EmbeddingRequest,
                                                      PoolingRequest, RerankRequest,
                                                      ScoreRequest)
from vllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from vllm.entrypoints.openai.serving_score import OpenAIServingScores


def install_pooling_routes(app: FastAPI, state: Any,
                           with_cancellation: Callable[..., Any]) -> None:
    """Routes over `state` (the app's ServerState); a no-op for generative models."""
    if getattr(state.engine.model_config, "runner_type", "generate") != "pooling":
        return
    common = dict(tokenizer=state.tokenization.tokenizer,
                  tokenizer_pool=state.tokenizer_pool)
    pooling = OpenAIServingPooling(state.engine, state.models, chat=state.chat, **common)
    scores = OpenAIServingScores(state.engine, state.models, **common)
    app.state.vllm_pooling = (pooling, scores)  # also served by /invocations

    def as_json(result: Any) -> JSONResponse:
        return JSONResponse(result.model_dump())

    @app.post("/v1/embeddings")
    @with_cancellation
    async def create_embedding(request: EmbeddingRequest, raw_request: Request) -> Any:
        return as_json(await pooling.create_embedding(request))

    @app.post("/pooling")
    @with_cancellation
    async def create_pooling(request: PoolingRequest, raw_request: Request) -> Any:
        return as_json(await pooling.create_pooling(request))

    @app.post("/classify")
    @with_cancellation
    async def create_classify(request: ClassificationRequest, raw_request: Request) -> Any:
        return as_json(await pooling.create_classify(request))

    for path in ("/score", "/v1/score"):
        @app.post(path)
        @with_cancellation
        async def create_score(request: ScoreRequest, raw_request: Request) -> Any:
            return as_json(await scores.create_score(request))

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        @app.post(path)
        @with_cancellation
        async def create_rerank(request: RerankRequest, raw_request: Request) -> Any:
            return as_json(await scores.create_rerank(request))

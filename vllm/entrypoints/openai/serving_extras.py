"""vLLM's hosting and operations routes beside the APIs: SageMaker's `/ping` and
`/invocations`, `/load` (requests in flight on the model routes), and under
`VLLM_SERVER_DEV_MODE=1` `/server_info` and `/collective_rpc`.

`/invocations` takes any body one of the model routes takes and answers as that route
would: `messages` -> chat completions, `prompt` -> completions, and for pooling models
`input` -> embeddings or classification (by the model's task), `messages` -> chat-form
embeddings, `query` + `documents` -> rerank, `text_1` / `data_1` / `queries` -> score.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from vllm import envs
from vllm.engine.protocol import EngineDeadError
from vllm.entrypoints.openai.errors import (BadRequestError, ServiceUnavailableError,
                                            validation_error)
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.protocol_pooling import (ClassificationRequest, EmbeddingRequest,
                                                      RerankRequest, ScoreRequest)

MODEL_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
                "/v1/rerank", "/v2/rerank", "/invocations")
"""Routes whose requests occupy the engine: what `/load` counts."""


class ServerLoadMiddleware:
    """Counts requests in flight on MODEL_ROUTES (vLLM's `server_load_metrics`)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state
        state.server_load_metrics = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(MODEL_ROUTES):
            await self.app(scope, receive, send)
            return
        self.state.server_load_metrics += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.server_load_metrics -= 1


def install_extra_routes(app: FastAPI, respond: Callable[[Any], Any]) -> None:
    """`respond`: a handler's result -> its response (JSON, or an SSE stream)."""

    @app.get("/ping", response_class=Response)
    @app.post("/ping", response_class=Response)
    async def ping(raw_request: Request) -> Response:
        """SageMaker's health check: /health's answer."""
        try:
            await raw_request.app.state.vllm.engine.check_health()
        except EngineDeadError as e:
            err = ServiceUnavailableError(str(e))
            return JSONResponse(err.to_response().model_dump(), status_code=int(err.status))
        return Response(status_code=200)

    @app.get("/load")
    async def load(raw_request: Request) -> JSONResponse:
        return JSONResponse({"server_load": raw_request.app.state.server_load_metrics})

    @app.post("/invocations")
    async def invocations(raw_request: Request) -> Any:
        body = await raw_request.json()
        if not isinstance(body, dict):
            raise BadRequestError("The request body must be a JSON object.")
        return respond(await _invoke(raw_request.app.state, body))

    if envs.VLLM_SERVER_DEV_MODE:
        _install_dev_info_routes(app)


async def _invoke(state: Any, body: dict[str, Any]) -> Any:
    server = state.vllm
    pooling = getattr(state, "vllm_pooling", None)
    if pooling is not None and "messages" in body:  # a pooling model embeds a chat
        return await pooling[0].create_embedding(_parse(EmbeddingRequest, body))
    if "messages" in body:
        return await server.chat.create_chat_completion(_parse(ChatCompletionRequest, body))
    if "prompt" in body:
        return await server.completion.create_completion(_parse(CompletionRequest, body))
    if pooling is not None:
        handler, scores = pooling
        if "query" in body and "documents" in body:
            return await scores.create_rerank(_parse(RerankRequest, body))
        if any(k in body for k in ("text_1", "data_1", "queries")):
            return await scores.create_score(_parse(ScoreRequest, body))
        if "input" in body:
            if handler.model_config.pooling_task == "classify":
                return await handler.create_classify(_parse(ClassificationRequest, body))
            return await handler.create_embedding(_parse(EmbeddingRequest, body))
    expected = ["messages (chat)", "prompt (completions)"]
    if pooling is not None:
        expected += ["input (embeddings / classify)", "query + documents (rerank)",
                     "text_1 + text_2 (score)"]
    raise BadRequestError("Cannot find a suitable handler for the request: expected a body "
                          f"with {', '.join(expected)}.")


def _parse(model: type[pydantic.BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as e:
        raise validation_error(e.errors()) from None


def _install_dev_info_routes(app: FastAPI) -> None:

    @app.get("/server_info")
    async def server_info(raw_request: Request) -> JSONResponse:
        engine = raw_request.app.state.vllm.engine
        config = await engine.get_vllm_config()
        fmt = raw_request.query_params.get("config_format", "text")
        if fmt not in ("text", "json"):
            raise BadRequestError(f"config_format={fmt!r}; choose text or json.",
                                  param="config_format")
        return JSONResponse({
            "vllm_config": str(config) if fmt == "text" else _config_json(config),
            "vllm_env": {name: _jsonable(getattr(envs, name)) for name in dir(envs)
                         if name.startswith("VLLM_") and "KEY" not in name
                         and envs.is_set(name)}})

    @app.post("/collective_rpc")
    async def collective_rpc(raw_request: Request) -> Any:
        body = await raw_request.json()
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            raise BadRequestError("The body must be a JSON object with a 'method' (the name "
                                  "of a worker method).", param="method")
        results = await raw_request.app.state.vllm.engine.collective_rpc(
            body["method"], timeout=body.get("timeout"), args=tuple(body.get("args", [])),
            kwargs=body.get("kwargs", {}))
        return JSONResponse({"results": [r if r is None or isinstance(r, (dict, list))
                                         else str(r) for r in results]})


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _config_json(config: Any) -> Any:
    """A config dataclass as JSON-able values (anything else as its str)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: _config_json(getattr(config, f.name))
                for f in dataclasses.fields(config) if f.repr}
    if isinstance(config, (list, tuple)):
        return [_config_json(v) for v in config]
    if isinstance(config, dict):
        return {str(k): _config_json(v) for k, v in config.items()}
    try:
        json.dumps(config)
        return config
    except TypeError:
        return str(config)

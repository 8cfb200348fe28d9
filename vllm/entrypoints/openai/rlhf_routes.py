"""vLLM's RL routes (under VLLM_SERVER_DEV_MODE=1, as vLLM's dev RLHF router): pausing
generation and in-place weight updates of a running server.

    POST /pause?mode=abort|wait|keep&clear_cache=true    {"status": "paused"}
    POST /resume                                          {"status": "resumed"}
    GET  /is_paused                                       {"is_paused": bool}
    POST /init_weight_transfer_engine {"init_info": {}}   {"message": ...}
    POST /start_weight_update                             {"message": ...}
    POST /update_weights {"update_info": {...}}           {"message": ...}
    POST /finish_weight_update {"weight_version": "v1"}   {"message": ...}
    POST /update_weight_version {"new_version": "v2"}     {"success": true, ...}
    GET  /weight_info                                     {"weight_version": ...}
    GET  /get_world_size                                  {"world_size": N}

A refused call (bad input, wrong order) is a 400 with an OpenAI-style error body.
"""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.errors import BadRequestError


async def _body(raw_request: Request) -> dict:
    """The JSON object of the body; {} when there is none."""
    if not (await raw_request.body()).strip():
        return {}
    body = await raw_request.json()
    if not isinstance(body, dict):
        raise BadRequestError("The request body must be a JSON object.")
    return body


def _required(body: dict, key: str) -> Any:
    if key not in body:
        raise BadRequestError(f"Missing {key!r} in the request body.", param=key)
    return body[key]


def _flag(raw_request: Request, name: str, default: bool) -> bool:
    text = raw_request.query_params.get(name)
    if text is None:
        return default
    if text.lower() not in ("true", "false", "1", "0"):
        raise BadRequestError(f"{name}={text!r}: expected true or false.", param=name)
    return text.lower() in ("true", "1")


def install_rlhf_routes(app: FastAPI, engine_of: Callable[[Request], Any]) -> None:
    """`engine_of(request)`: the EngineClient serving the app."""

    @app.post("/pause")
    async def pause(raw_request: Request) -> JSONResponse:
        await engine_of(raw_request).pause_generation(
            mode=raw_request.query_params.get("mode", "abort"),
            clear_cache=_flag(raw_request, "clear_cache", True),
            wait_for_inflight_requests=_flag(raw_request, "wait_for_inflight_requests",
                                             False))
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume(raw_request: Request) -> JSONResponse:
        await engine_of(raw_request).resume_generation()
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused(raw_request: Request) -> JSONResponse:
        return JSONResponse({"is_paused": await engine_of(raw_request).is_paused()})

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(raw_request: Request) -> JSONResponse:
        body = await _body(raw_request)
        await engine_of(raw_request).init_weight_transfer_engine(
            {"init_info": _required(body, "init_info")})
        return JSONResponse({"message": "Weight transfer initialized"})

    @app.post("/start_weight_update")
    async def start_weight_update(raw_request: Request) -> JSONResponse:
        await engine_of(raw_request).start_weight_update()
        return JSONResponse({"message": "Weight update started"})

    @app.post("/update_weights")
    async def update_weights(raw_request: Request) -> JSONResponse:
        body = await _body(raw_request)
        await engine_of(raw_request).update_weights(
            {"update_info": _required(body, "update_info")})
        return JSONResponse({"message": "Weights updated"})

    @app.post("/finish_weight_update")
    async def finish_weight_update(raw_request: Request) -> JSONResponse:
        body = await _body(raw_request)
        await engine_of(raw_request).finish_weight_update(body.get("weight_version"))
        return JSONResponse({"message": "Weight update finished"})

    @app.post("/update_weight_version")
    async def update_weight_version(raw_request: Request) -> JSONResponse:
        version = _required(await _body(raw_request), "new_version")
        await engine_of(raw_request).update_weight_version(version)
        return JSONResponse({"success": True, "new_version": version})

    @app.get("/weight_info")
    async def weight_info(raw_request: Request) -> JSONResponse:
        return JSONResponse({"weight_version":
                             await engine_of(raw_request).get_weight_version()})

    @app.get("/get_world_size")
    async def get_world_size(raw_request: Request) -> JSONResponse:
        pc = engine_of(raw_request).vllm_config.parallel_config
        include_dp = _flag(raw_request, "include_dp", True)
        return JSONResponse({"world_size": pc.world_size * (pc.data_parallel_size
                                                            if include_dp else 1)})

"""The OpenAI-compatible HTTP server: app factory, routes, and `main()`.

`python -m vllm.entrypoints.openai.api_server --model M` (or `vllm serve M`) loads the
engine, then serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize,
/detokenize, /health, /version and /metrics with uvicorn.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import hmac
import logging
import os
import signal
import socket
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable, Optional

if __name__ == "__main__":
    # Run as the server: fork the engine core now, before the web stack below is
    # imported (vllm/entrypoints/openai/core_prestart.py).
    from vllm.entrypoints.openai.core_prestart import prestart_from_argv
    prestart_from_argv()

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

import vllm.envs as envs
from vllm.engine.protocol import EngineClient, EngineDeadError
from vllm.entrypoints.anthropic.routes import install_anthropic_routes
from vllm.entrypoints.launcher import serve_http
from vllm.entrypoints.openai.chat_utils import load_chat_template
from vllm.entrypoints.openai.cli_args import (make_arg_parser, needs_own_cores,
                                              validate_parsed_serve_args)
from vllm.entrypoints.openai.errors import (BadRequestError, OpenAIError,
                                            ServiceUnavailableError, error_type_for,
                                            lone_surrogate_path, make_error, validation_error)
from vllm.entrypoints.openai.pooling_routes import install_pooling_routes
from vllm.entrypoints.openai.responses_routes import install_responses_routes
from vllm.entrypoints.openai.rlhf_routes import install_rlhf_routes
from vllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                              DetokenizeRequest, LoadLoRAAdapterRequest,
                                              TokenizeRequest, UnloadLoRAAdapterRequest,
                                              VersionResponse)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.fingerprint import build_system_fingerprint
from vllm.entrypoints.openai.http_observability import (RequestIdHeaderMiddleware,
                                                        force_include_usage, instrument_http)
from vllm.entrypoints.openai.serving_engine import SSE_HEADERS, copy_tokenizer
from vllm.entrypoints.openai.serving_extras import ServerLoadMiddleware, install_extra_routes
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.entrypoints.openai.tokenizer_pool import TokenizerPool
from vllm.tracing import extract_trace_headers
from vllm.version import __version__

logger = logging.getLogger("vllm.entrypoints.openai.api_server")  # not __main__ under -m

MIN_BODY_LIMIT_BYTES = 2 << 20
BODY_BYTES_PER_PROMPT_CHAR = 8
"""Request bodies may be this many bytes per character of the longest possible prompt
(JSON escapes take up to 6 bytes a character; a few prompts or messages fit beside it)."""
OFF_LOOP_BODY_BYTES = 64 << 10
"""Bodies from this size on are checked for lone surrogates on a pool thread (smaller
ones take less than the hand-off)."""
GRACEFUL_SHUTDOWN_S = 5
"""After every request ended (see --shutdown-timeout), how long uvicorn waits for the
connections to close before cancelling them."""


# ------------------------------------------------------------------ app state
class ServerState:
    """Everything the routes need, built once per app from the engine and the flags."""

    def __init__(self, engine: EngineClient, args: argparse.Namespace,
                 tokenizer: Optional[Any] = None) -> None:
        """`tokenizer`: this server's copy of the engine's, if made already."""
        self.engine = engine
        model_config = engine.model_config
        if tokenizer is None:
            tokenizer = copy_tokenizer(engine.tokenizer)
        self.models = OpenAIServingModels(list(model_config.served_model_name),
                                          model_config.model, model_config.max_model_len,
                                          engine=engine,
                                          lora_modules=getattr(args, "lora_modules", None))
        self.tokenizer_pool = TokenizerPool(tokenizer)
        self.max_body_bytes = max(MIN_BODY_LIMIT_BYTES, BODY_BYTES_PER_PROMPT_CHAR *
                                  self.tokenizer_pool.max_prompt_chars(model_config.max_model_len))
        common = dict(tokenizer=tokenizer, tokenizer_pool=self.tokenizer_pool,
                      return_tokens_as_token_ids=bool(getattr(args, "return_tokens_as_token_ids",
                                                              False)),
                      enable_prompt_tokens_details=bool(
                          getattr(args, "enable_prompt_tokens_details", False)),
                      system_fingerprint=build_system_fingerprint(
                          engine.vllm_config, getattr(args, "fingerprint_mode", "full"),
                          getattr(args, "fingerprint_value", None)))
        if getattr(args, "tool_parser_plugin", ""):
            from vllm.entrypoints.openai.tool_parsers import ToolParserManager
            ToolParserManager.import_tool_parser(args.tool_parser_plugin)
        if getattr(args, "reasoning_parser_plugin", ""):
            from vllm.reasoning import ReasoningParserManager
            ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
        self.chat = OpenAIServingChat(
            engine, self.models, response_role=getattr(args, "response_role", "assistant"),
            chat_template=load_chat_template(getattr(args, "chat_template", None)),
            content_format=getattr(args, "chat_template_content_format", "auto"),
            trust_request_chat_template=bool(getattr(args, "trust_request_chat_template",
                                                     False)),
            enable_auto_tools=bool(getattr(args, "enable_auto_tool_choice", False)),
            tool_parser=getattr(args, "tool_call_parser", None),
            reasoning_parser=getattr(args, "reasoning_parser", None) or None,
            default_chat_template_kwargs=getattr(args, "default_chat_template_kwargs", None),
            tool_strict_level=getattr(args, "tool_strict_level", "auto"),
            **common)
        self.completion = OpenAIServingCompletion(engine, self.models, **common)
        self.tokenization = OpenAIServingTokenization(engine, self.models, chat=self.chat,
                                                      **common)

    def close(self) -> None:
        if self.chat.template_sandbox is not None:
            self.chat.template_sandbox.stop()
        self.tokenizer_pool.shutdown()


def _state(request: Request) -> ServerState:
    return request.app.state.vllm


# ---------------------------------------------------------------- middleware
class APIKeyMiddleware:
    """Require `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) under /v1,
    KEY one of the configured keys (plain ASGI: streaming stays intact). The Messages
    routes answer a refusal in Anthropic's error shape."""

    def __init__(self, app: Any, api_keys: list[str], root_path: str = "") -> None:
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]
        self.root_path = (root_path or "").rstrip("/")

    def _protected(self, path: str) -> bool:
        # Behind a proxy the path may or may not still carry the --root-path prefix.
        if self.root_path and path.startswith(self.root_path + "/"):
            path = path[len(self.root_path):]
        return path == "/v1" or path.startswith("/v1/")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and self._protected(scope.get("path", ""))):
            headers = dict(scope.get("headers") or [])
            given = [headers.get(b"authorization", b""),
                     b"Bearer " + headers.get(b"x-api-key", b"")]
            # Compare with every key (no early exit), so timing tells nothing.
            if not sum(hmac.compare_digest(g, key) for key in self.expected for g in given):
                body: Any = {"error": "Unauthorized"}
                if "/v1/messages" in scope.get("path", ""):
                    from vllm.entrypoints.anthropic.protocol import error_body
                    body = error_body(401, "invalid x-api-key")
                response = JSONResponse(body, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ------------------------------------------------------------- request bodies
class BodySizeLimitMiddleware:
    """413 for a request body larger than `max_body_bytes`, before any of it is parsed.

    The bound follows from max_model_len (see ServerState): a bigger body cannot hold a
    prompt the model accepts, and parsing and tokenizing it would cost every other request.
    A body without Content-Length is buffered up to the bound, then passed on.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                await self._reject(scope, receive, send, f"{int(declared)} bytes")
                return
            await self.app(scope, receive, send)
            return
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await self._reject(scope, receive, send, f"more than {self.max_body_bytes} bytes")
                return
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: dict, receive: Any, send: Any, size: str) -> None:
        body = make_error(f"The request body ({size}) is larger than the {self.max_body_bytes} "
                          "bytes this server accepts (derived from max_model_len).",
                          error_type_for(413), 413)
        await JSONResponse(body.model_dump(), status_code=413)(scope, receive, send)


class JSONBodyRoute(APIRoute):
    """A route whose POST body must be JSON text that is valid Unicode.

    FastAPI hands a body with a non-JSON Content-Type (curl's form default, text/plain) to
    validation as raw bytes, and keeps JSON strings holding lone surrogates ("\\ud800"),
    which fail later in the tokenizer. Both are the client's mistake: 400 here, up front.
    A body without Content-Type is read as JSON.
    """

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method == "POST":
                request = await _checked_json_request(request)
            return await handler(request)

        return checked


async def _checked_json_request(request: Request) -> Request:
    content_type = request.headers.get("content-type")
    if content_type is None:
        scope = dict(request.scope)
        scope["headers"] = [*scope.get("headers", []), (b"content-type", b"application/json")]
        request = Request(scope, request.receive)
    elif not _is_json_media_type(content_type):
        raise BadRequestError(f"Unsupported Content-Type {content_type!r}: the request body "
                              "must be JSON (Content-Type: application/json).")
    raw = await request.body()
    if not raw.strip():
        return request  # no body: validation names the missing fields (400)
    try:
        body = await request.json()  # cached on the request: FastAPI does not parse twice
    except UnicodeDecodeError as e:
        raise BadRequestError(f"The request body is not valid UTF-8: byte "
                              f"0x{raw[e.start]:02x} at position {e.start} cannot be decoded "
                              f"({e.reason}).") from None
    except RecursionError:
        raise BadRequestError("The request body is nested too deeply: JSON arrays and "
                              "objects may nest a few hundred levels at most.") from None
    except ValueError as e:  # json.JSONDecodeError
        raise BadRequestError(f"The request body is not valid JSON: {e}.") from None
    where = await _lone_surrogate_path(request, body, len(raw))
    if where is not None:
        raise BadRequestError(f"{where}: the text is not valid Unicode (it holds a lone "
                              "UTF-16 surrogate such as \\ud800).",
                              param=None if where == "body" else where)
    return request


async def _lone_surrogate_path(request: Request, body: Any, size: int) -> Optional[str]:
    """`lone_surrogate_path` of the body; for a large body on a pool thread, as the walk
    visits every string in Python (about 20 ms per MB, 20,000 tool properties included)
    and the event loop must keep answering meanwhile."""
    if size < OFF_LOOP_BODY_BYTES:
        return lone_surrogate_path(body)
    return await _state(request).tokenizer_pool.run(lone_surrogate_path, body)


def _is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


# -------------------------------------------------------------------- errors
def _error_json(err: OpenAIError) -> JSONResponse:
    return JSONResponse(err.to_response().model_dump(), status_code=int(err.status))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return _error_json(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_json(validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = make_error(str(exc.detail), error_type_for(exc.status_code), exc.status_code)
        return JSONResponse(body.model_dump(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return _error_json(ServiceUnavailableError(str(exc)))

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        return _error_json(OpenAIError(str(exc)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unexpected error while serving a request.")
        body = make_error(f"Internal server error: {type(exc).__name__}: {exc}",
                          "InternalServerError", 500)
        return JSONResponse(body.model_dump(), status_code=500)


# ------------------------------------------------------------- cancellation
async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def with_cancellation(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Cancel the handler when the client disconnects, which aborts its engine requests.

    Starlette does not cancel a running endpoint on disconnect; without this a client that
    gives up on a long non-streaming completion would still cost its full generation.
    """

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        raw_request: Request = kwargs["raw_request"]
        work = asyncio.ensure_future(handler(*args, **kwargs))
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            watcher.cancel()
        if work.done():
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return Response(status_code=499)  # client closed the request; nobody reads this

    return wrapper


def _respond(result: Any) -> Any:
    """A response model as JSON, or an SSE generator as a streaming response."""
    if hasattr(result, "__aiter__"):
        return StreamingResponse(result, media_type="text/event-stream", headers=SSE_HEADERS)
    return JSONResponse(result.model_dump())


# -------------------------------------------------------------------- routes
def _install_routes(app: FastAPI) -> None:
    @app.get("/health", response_class=Response)
    async def health(raw_request: Request) -> Response:
        try:
            await _state(raw_request).engine.check_health()
        except EngineDeadError as e:
            return _error_json(ServiceUnavailableError(str(e)))
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    @app.get("/metrics", response_class=Response)
    async def metrics(raw_request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        from vllm.engine.metrics import render_metrics
        from vllm.metrics import multiprocess
        if multiprocess.enabled():  # several API servers: every one's series
            from vllm.engine.metrics import process_registry
            from prometheus_client import generate_latest
            body = multiprocess.render_all() + generate_latest(process_registry())
        else:
            registry = _state(raw_request).engine.metrics_registry
            body = render_metrics(registry, raw_request.app.state.http_metrics_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def show_available_models(raw_request: Request) -> Any:
        return JSONResponse(_state(raw_request).models.show_available_models().model_dump())

    @app.post("/tokenize")
    @with_cancellation
    async def tokenize(request: TokenizeRequest, raw_request: Request) -> Any:
        result = await _state(raw_request).tokenization.create_tokenize(request)
        return JSONResponse(result.model_dump())

    @app.post("/detokenize")
    @with_cancellation
    async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Any:
        result = await _state(raw_request).tokenization.create_detokenize(request)
        return JSONResponse(result.model_dump())

    @app.post("/v1/completions")
    @with_cancellation
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Any:
        _header_request_id(request, raw_request)
        return _respond(await _state(raw_request).completion.create_completion(
            request, extract_trace_headers(raw_request.headers)))

    if envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
        _install_lora_routes(app)
    profiler_config = getattr(_app_engine(app).vllm_config, "profiler_config", None)
    if envs.VLLM_TORCH_PROFILER_DIR or (profiler_config is not None
                                        and profiler_config.enabled):
        _install_profiler_routes(app)
    if envs.VLLM_SERVER_DEV_MODE:
        _install_dev_routes(app)

    @app.post("/v1/chat/completions")
    @with_cancellation
    async def create_chat_completion(request: ChatCompletionRequest,
                                     raw_request: Request) -> Any:
        _header_request_id(request, raw_request)
        return _respond(await _state(raw_request).chat.create_chat_completion(
            request, extract_trace_headers(raw_request.headers)))


def _header_request_id(request: Any, raw_request: Request) -> None:
    """An X-Request-Id header names the request (over the body's request_id), as in
    vLLM: gateways set it to find a request in the logs and in the response id.
    Here too the server's --enable-force-include-usage reaches the request."""
    header = raw_request.headers.get("x-request-id")
    if header:
        request.request_id = header
    if raw_request.app.state.force_include_usage:
        force_include_usage(request)


def _app_engine(app: FastAPI) -> EngineClient:
    return app.state.vllm.engine


def _install_lora_routes(app: FastAPI) -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter (runtime LoRA updates)."""
    logger.warning("LoRA dynamic loading & unloading is enabled in the API server. This "
                   "should ONLY be used for local development!")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw_request: Request) -> Any:
        text = await _state(raw_request).models.load_lora_adapter(request)
        return Response(status_code=200, content=text)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest,
                                  raw_request: Request) -> Any:
        text = await _state(raw_request).models.unload_lora_adapter(request)
        return Response(status_code=200, content=text)


def _install_tokenizer_info_route(app: FastAPI) -> None:
    """GET /tokenizer_info (--enable-tokenizer-info-endpoint): off by default, as in vLLM,
    because it shows the chat template and the tokenizer's configuration."""

    @app.get("/tokenizer_info")
    async def tokenizer_info(raw_request: Request) -> Any:
        return JSONResponse(_state(raw_request).tokenization.get_tokenizer_info())


def _install_profiler_routes(app: FastAPI) -> None:
    """POST /start_profile and /stop_profile (VLLM_TORCH_PROFILER_DIR is set)."""
    logger.warning("Torch profiler is enabled in the API server. This should ONLY be used "
                   "for local development!")

    @app.post("/start_profile")
    async def start_profile(raw_request: Request) -> Response:
        await _state(raw_request).engine.start_profile()
        return Response(status_code=200)

    @app.post("/stop_profile")
    async def stop_profile(raw_request: Request) -> Response:
        await _state(raw_request).engine.stop_profile()
        return Response(status_code=200)


def _install_dev_routes(app: FastAPI) -> None:
    """vLLM's development routes (VLLM_SERVER_DEV_MODE=1): sleep mode, prefix cache,
    pausing and in-place weight updates (rlhf_routes.py)."""
    logger.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be "
                   "used in production!")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(raw_request: Request) -> Response:
        await _state(raw_request).engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.post("/sleep")
    async def sleep(raw_request: Request) -> Response:
        text = raw_request.query_params.get("level", "1")
        try:
            level = int(text)
        except ValueError:
            raise ValueError(f"level={text!r}: the sleep level is 1 or 2.") from None
        await _state(raw_request).engine.sleep(level)
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(raw_request: Request) -> Response:
        tags = raw_request.query_params.getlist("tags") or None
        await _state(raw_request).engine.wake_up(tags)
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping(raw_request: Request) -> JSONResponse:
        return JSONResponse({"is_sleeping": await _state(raw_request).engine.is_sleeping()})

    install_rlhf_routes(app, lambda raw_request: _state(raw_request).engine)


# ----------------------------------------------------------------------- app
def build_app(args: argparse.Namespace, engine: EngineClient,
              tokenizer: Optional[Any] = None) -> FastAPI:
    """The FastAPI app serving `engine`; one app per engine (own metrics registry).
    `tokenizer`: the server's own copy of the engine's tokenizer, if made already."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start_background_loop()
        if state.chat.template_sandbox is not None:
            state.chat.template_sandbox.start()  # loads while the first requests arrive
        await state.models.init_static_loras()
        started = getattr(args, "_process_start", None)
        if started is not None:
            logger.info("vLLM API server ready in %.2f s (since process start).",
                        time.time() - started)
        try:
            yield
        finally:
            engine.shutdown()
            state.close()

    state = ServerState(engine, args, tokenizer)
    docs = {} if not getattr(args, "disable_fastapi_docs", False) else dict(
        openapi_url=None, docs_url=None, redoc_url=None)
    app = FastAPI(title="vLLM OpenAI-compatible API", version=__version__,
                  root_path=getattr(args, "root_path", None) or "", lifespan=lifespan,
                  **docs)
    app.state.vllm = state
    app.state.force_include_usage = bool(getattr(args, "enable_force_include_usage", False))
    app.router.route_class = JSONBodyRoute
    _install_error_handlers(app)
    _install_routes(app)
    if getattr(args, "enable_tokenizer_info_endpoint", False):
        _install_tokenizer_info_route(app)
    install_pooling_routes(app, state, with_cancellation)
    install_responses_routes(app, state, with_cancellation)
    install_anthropic_routes(app, state, with_cancellation)
    install_extra_routes(app, _respond)
    app.state.server_load_metrics = 0
    if getattr(args, "enable_server_load_tracking", False):
        app.add_middleware(ServerLoadMiddleware, state=app.state)
    if getattr(args, "enable_request_id_headers", False):
        app.add_middleware(RequestIdHeaderMiddleware)
    app.state.http_metrics_registry = instrument_http(app)
    app.add_middleware(CORSMiddleware,
                       allow_origins=getattr(args, "allowed_origins", []),
                       allow_credentials=getattr(args, "allow_credentials", False),
                       allow_methods=getattr(args, "allowed_methods", ["*"]),
                       allow_headers=getattr(args, "allowed_headers", ["*"]))
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=state.max_body_bytes)
    api_keys = getattr(args, "api_key", None) or (
        [envs.VLLM_API_KEY] if envs.VLLM_API_KEY else [])
    if isinstance(api_keys, str):
        api_keys = [api_keys]
    if api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=list(api_keys),
                           root_path=getattr(args, "root_path", None) or "")
    return app


# ----------------------------------------------------------------- run/main
def create_server_socket(host: Optional[str], port: int) -> socket.socket:
    """Bind early so a busy port fails before the model is loaded."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "0.0.0.0", port))
    except OSError as e:
        sock.close()
        raise OSError(f"Cannot listen on {host or '0.0.0.0'}:{port}: {e.strerror}. Is another "
                      "server running there? Choose another --port.") from e
    return sock


def _raise_keyboard_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"terminated by signal {signum}")


def _log_startup(engine: EngineClient) -> None:
    from vllm.platforms import current_platform
    mc = engine.model_config
    device = getattr(getattr(engine.vllm_config, "device_config", None), "device", None)
    logger.info("Model: %s (served as %s), dtype %s, max_model_len %d, device: %s (%s).",
                mc.model, ", ".join(mc.served_model_name), mc.torch_dtype, mc.max_model_len,
                device or current_platform.device_type, current_platform.device_name)


def _freeze_startup_heap() -> None:
    """Leave the objects made at startup (torch, transformers, the tokenizer: millions)
    out of garbage collection, as vLLM does. Otherwise each oldest-generation collection,
    which any busy request's allocations can trigger, walks them all while holding the
    GIL: 150-300 ms during which the event loop and /health answer nothing."""
    gc.collect()
    gc.freeze()


def serve_engine(args: argparse.Namespace, sock: socket.socket, engine: EngineClient,
                 tokenizer: Optional[Any] = None) -> bool:
    """Serve `engine` on the listening `sock` until SIGINT/SIGTERM, then shut the engine
    down; True if it died meanwhile."""
    try:
        _log_startup(engine)
        app = build_app(args, engine, tokenizer=tokenizer)
        _freeze_startup_heap()
        scheme = "https" if args.ssl_certfile else "http"
        logger.info("Starting vLLM API server on %s://%s:%d", scheme,
                    args.host or "0.0.0.0", args.port)
        return asyncio.run(serve_http(
            app, sock, engine, shutdown_timeout_s=args.shutdown_timeout,
            graceful_close_s=GRACEFUL_SHUTDOWN_S, log_level=args.uvicorn_log_level,
            access_log=not args.disable_uvicorn_access_log, ssl_keyfile=args.ssl_keyfile,
            ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
            timeout_keep_alive=5))
    finally:
        engine.shutdown()


def run_server(args: argparse.Namespace) -> None:
    """Load the engine, then serve until SIGINT/SIGTERM (exit status 1 if the engine died)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import (build_async_engine, prestart_engine_core,
                                       release_engine_core)
    if needs_own_cores(args):
        raise ValueError("--api-server-count above 1, --headless, "
                         "--data-parallel-size-local and --data-parallel-backend ray start "
                         "engine cores of their own: run them with `vllm serve`.")
    args._process_start = _process_start_time()
    _apply_log_level(args)
    from vllm.entrypoints.cli.headless import run_headless_workers_if_asked
    run_headless_workers_if_asked(args)  # --nnodes N --headless: this node's workers only
    validate_parsed_serve_args(args)
    logger.info("vLLM API server version %s", __version__)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    # The core initializes while this process sets up (unless the module's start, run as
    # the server, forked it already): fork it while this process has one thread and
    # nothing bound, not even the listening socket.
    prestart_engine_core(getattr(args, "data_parallel_size", 1), engine_args)
    sock = create_server_socket(args.host, args.port)
    # Until uvicorn installs its own handlers, SIGTERM unwinds model loading cleanly.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    # The server's copy of the tokenizer is made while the core process initializes.
    spare: dict[str, Any] = {}
    try:
        engine = build_async_engine(
            engine_args, max_log_len=args.max_log_len,
            while_core_starts=lambda e: spare.update(tokenizer=copy_tokenizer(e.tokenizer)))
        release_engine_core()
        engine_died = serve_engine(args, sock, engine, tokenizer=spare.get("tokenizer"))
    finally:
        sock.close()
        # Everything is shut down: keep the interpreter's final garbage collection from
        # walking every torch/transformers object (seconds on a busy machine, past a
        # supervisor's grace period).
        gc.freeze()
    if engine_died:
        sys.exit(1)  # a supervisor restarts the server (see vllm/entrypoints/launcher.py)


def _apply_log_level(args: argparse.Namespace) -> None:
    """--log-level: the vllm loggers' level (over VLLM_LOGGING_LEVEL)."""
    if getattr(args, "log_level", None):
        logging.getLogger("vllm").setLevel(args.log_level.upper())


def _process_start_time() -> float:
    try:
        import psutil
        return psutil.Process(os.getpid()).create_time()
    except Exception:  # noqa: BLE001 - only used for the "ready in" log line
        return time.time()


def main(argv: Optional[list[str]] = None) -> None:
    parser = make_arg_parser()
    args = parser.parse_args(argv)
    try:
        run_server(args)
    except KeyboardInterrupt:
        logger.info("Server stopped.")
    except (ValueError, OSError, MemoryError) as e:  # flags, port, KV cache: no traceback
        logger.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()

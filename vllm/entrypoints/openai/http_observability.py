"""The server's HTTP-level observability: vLLM's HTTP metrics, X-Request-Id response
headers (--enable-request-id-headers) and forced usage in streams
(--enable-force-include-usage).

HTTP metrics come from prometheus-fastapi-instrumentator, as in vLLM:
`http_requests_total{handler,method,status}`, `http_request_duration_seconds`,
`http_request_duration_highr_seconds`, `http_request_size_bytes`,
`http_response_size_bytes`. Each app has its own registry (several servers may share a
process in tests), rendered by /metrics beside the engine's; the probes (/metrics,
/health, /load, /ping, /version, /server_info) are left out as vLLM leaves them out.
"""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

UNINSTRUMENTED_ROUTES = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]


def instrument_http(app: FastAPI) -> CollectorRegistry:
    """Add the HTTP metrics middleware to `app`; the registry /metrics renders."""
    from prometheus_fastapi_instrumentator import Instrumentator
    registry = CollectorRegistry()
    Instrumentator(excluded_handlers=UNINSTRUMENTED_ROUTES,
                   registry=registry).instrument(app)
    return registry


class RequestIdHeaderMiddleware:
    """Answer every HTTP request with an X-Request-Id header: the client's own, or a new
    one (vLLM's --enable-request-id-headers). Plain ASGI, so streams pass untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id")
        request_id = given or uuid.uuid4().hex.encode()

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def force_include_usage(request: Any) -> None:
    """A streamed request reports usage in its last chunk even when its stream_options
    do not ask (--enable-force-include-usage)."""
    if not getattr(request, "stream", False):
        return
    from vllm.entrypoints.openai.protocol import StreamOptions
    if request.stream_options is None:
        request.stream_options = StreamOptions(include_usage=True)
    else:
        request.stream_options.include_usage = True

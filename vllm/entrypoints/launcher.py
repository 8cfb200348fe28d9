"""serve_http: uvicorn with vLLM's shutdown and engine-death semantics.

SIGTERM/SIGINT: new requests get 503 at once; requests in flight may finish for up to
--shutdown-timeout seconds (default 0, as in vLLM); then the engine is shut down, which
ends every request still running with an error (a stream gets an error event and
`data: [DONE]`, a plain request a 503), and the server exits. A second SIGINT forces exit.

Engine death: when the engine dies (its loop crashed, a worker process died) the server
shuts down the same way and the process exits non-zero, so a supervisor restarts it,
unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set (then it stays up answering 503).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from types import FrameType
from typing import Any, Optional

import uvicorn

import vllm.envs as envs
from vllm.engine.protocol import EngineDeadError
from vllm.entrypoints.openai.errors import error_type_for, make_error

logger = logging.getLogger(__name__)

ENGINE_HEALTH_INTERVAL_S = 0.5
"""How often the server asks whether the engine is alive (a flag read, no round trip)."""
ABORT_GRACE_S = 5.0
"""After the engine shut down, how long ended streams may take to send their last bytes."""


class RequestTracker:
    """ASGI middleware counting the HTTP requests in flight; refuses new ones (503) once
    the server is draining."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0
        self.draining = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining:
            from fastapi.responses import JSONResponse
            body = make_error("The server is shutting down and accepts no new requests.",
                              error_type_for(503), 503)
            await JSONResponse(body.model_dump(), status_code=503,
                               headers={"Connection": "close"})(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0


class _Server(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains instead of cutting connections."""

    def __init__(self, config: uvicorn.Config, tracker: RequestTracker, engine: Any,
                 shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self.tracker = tracker
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s
        self.engine_died = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._draining: Optional[asyncio.Future] = None

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        if self._draining is not None or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal: uvicorn's own (forced exit)
            return
        self._captured_signals.append(sig)  # re-raised by uvicorn once serve() returns
        self._loop.call_soon_threadsafe(self.drain, self.shutdown_timeout_s)

    def drain(self, timeout_s: float) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain(timeout_s))

    async def _drain(self, timeout_s: float) -> None:
        self.tracker.draining = True
        running = self.tracker.in_flight
        if running and timeout_s > 0:
            logger.info("Shutting down: waiting up to %g s for %d request(s) in flight.",
                        timeout_s, running)
            await self.tracker.wait_idle(timeout_s)
        if self.tracker.in_flight:
            logger.info("Shutting down: aborting %d request(s) still running.",
                        self.tracker.in_flight)
        # Every stream still open ends with an error event and [DONE].
        await asyncio.to_thread(self.engine.shutdown)
        await self.tracker.wait_idle(ABORT_GRACE_S)
        self.should_exit = True

    async def watch_engine(self) -> None:
        """Exit (non-zero) when the engine dies, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH."""
        while not self.should_exit and self._draining is None:
            await asyncio.sleep(ENGINE_HEALTH_INTERVAL_S)
            try:
                await self.engine.check_health()
            except EngineDeadError as e:
                if not self.engine.errored:
                    continue  # stopping on purpose
                if envs.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH:
                    logger.error("%s VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set: the server stays "
                                 "up and answers 503.", e)
                    return
                logger.error("%s Shutting down the server (set "
                             "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 to keep it up).", e)
                self.engine_died = True
                self.drain(0.0)
                return

    async def serve(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self._loop = asyncio.get_running_loop()
        watcher = asyncio.ensure_future(self.watch_engine())
        try:
            await super().serve(sockets=sockets)
        finally:
            watcher.cancel()
            if self._draining is not None and not self._draining.done():
                self._draining.cancel()


async def serve_http(app: Any, sock: socket.socket, engine: Any, *,
                     shutdown_timeout_s: float = 0.0, graceful_close_s: float = 5.0,
                     **uvicorn_kwargs: Any) -> bool:
    """Serve `app` on `sock` until a signal or the engine's death; True if the engine died."""
    tracker = RequestTracker(app)
    config = uvicorn.Config(tracker, timeout_graceful_shutdown=graceful_close_s,
                            **uvicorn_kwargs)
    server = _Server(config, tracker, engine, shutdown_timeout_s)
    await server.serve(sockets=[sock])
    return server.engine_died

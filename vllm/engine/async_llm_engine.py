"""AsyncLLMEngine: the blocking LLMEngine driven by one background thread, for asyncio servers.

Why a thread: `LLMEngine.step()` is CPU-bound torch work; running it on the event loop
would stall every HTTP connection for the length of a step. The loop thread owns the
engine: coroutines never touch it directly. They post "add" and "abort" commands to a
thread-safe inbox that the thread drains between steps, and the thread hands each step's
outputs back to the event loop with one `call_soon_threadsafe` per step. When there is
no work the thread sleeps on an Event (no busy spin).

Inside, every request runs with `RequestOutputKind.DELTA`: the thread then sees exactly the
new tokens of each step (what the metrics need), and `RequestStream` rebuilds what the
caller asked for (DELTA, CUMULATIVE or FINAL_ONLY), merging deltas when the consumer lags.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable, Iterable, Mapping, Optional, Union

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.metrics import StatsTracker
from vllm.engine.output_processor import RequestFailure
from vllm.engine.pause import PauseGate, resolve_pause_mode
from vllm.engine.protocol import EngineClient, EngineDeadError

logger = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: Any
    params: Any
    arrival_time: float
    stream: "RequestStream"
    accepted: "asyncio.Future[None]"
    lora_request: Any = None
    priority: int = 0
    trace_headers: Optional[dict[str, str]] = None


@dataclass
class _Abort:
    request_ids: list[str]
    notify: bool  # True: end the streams (public abort); False: the consumer is gone.


@dataclass
class _Call:
    """Run `fn(engine)` on the loop thread between steps (admin operations)."""
    fn: Any
    done: "asyncio.Future[Any]"


@dataclass
class _Result:
    value: Any


_END = object()  # sentinel: the stream ends without a further output


class RequestStream:
    """Outputs of one request: fed on the event loop, consumed by one coroutine.

    `put` receives DELTA outputs (or an exception); `get` returns the next output in the
    caller's output kind, merging every delta that arrived since the last `get`.
    """

    def __init__(self, request_id: str, output_kind: Any) -> None:
        self.request_id = request_id
        self._kind = _kind_name(output_kind)
        self.output_kind_name = self._kind
        self._items: list[Any] = []
        self._ready = asyncio.Event()
        self._acc: Any = None  # merged output not yet handed out (or all, for CUMULATIVE)
        self._last: Any = None  # latest delta seen, the template of a final abort output
        self.finished = False

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Any:
        """Next output; raises StopAsyncIteration at the end, or the error the engine sent."""
        while True:
            if self.finished:
                raise StopAsyncIteration
            while not self._items:
                self._ready.clear()
                await self._ready.wait()
            result = self._absorb()
            if result is not None:
                return result

    def _absorb(self) -> Any:
        """Merge queued deltas; an error or end marker waits until pending news is out."""
        fresh = False
        while self._items:
            item = self._items[0]
            if isinstance(item, BaseException) or item is _END:
                if fresh and self._kind != "FINAL_ONLY":
                    return self._hand_out()
                self._items.clear()
                self.finished = True
                if item is _END:
                    return self._aborted_output()
                raise item
            self._items.pop(0)
            self._last = item
            self._acc = item if self._acc is None else merge_delta(self._acc, item)
            fresh = True
            if item.finished:
                self.finished = True
                self._items.clear()
                break
        if not fresh or (self._kind == "FINAL_ONLY" and not self._acc.finished):
            return None
        return self._hand_out()

    def _hand_out(self) -> Any:
        if self._kind == "CUMULATIVE":
            return snapshot(self._acc)
        out, self._acc = self._acc, None
        return out

    def _aborted_output(self) -> Any:
        """The last output of an aborted request: finish_reason "abort" on unfinished
        completions (nothing when the request never produced output)."""
        if self._acc is not None:
            return as_aborted(self._acc)
        if self._last is None or self._kind == "CUMULATIVE":
            raise StopAsyncIteration
        return as_aborted(self._last, empty=True)


class AsyncLLMEngine(EngineClient):
    """asyncio front of LLMEngine: `generate()` streams RequestOutputs of one request."""

    def __init__(self, engine: Any, *, log_requests: bool = True, log_stats: bool = True,
                 max_log_len: Optional[int] = None, start_engine_loop: bool = True,
                 log_outputs: bool = False) -> None:
        self.engine = engine
        self.model_config = engine.model_config
        self.vllm_config = getattr(engine, "vllm_config", None)
        self.log_requests = log_requests
        self.log_outputs = log_outputs
        self.max_log_len = max_log_len
        lora_config = getattr(self.vllm_config, "lora_config", None)
        spec_config = getattr(self.vllm_config, "speculative_config", None)
        self.stats = StatsTracker(self.model_config.served_model_name[0],
                                  self.model_config.max_model_len, log_stats=log_stats,
                                  max_loras=lora_config.max_loras if lora_config else None,
                                  cache_config=getattr(self.vllm_config, "cache_config", None),
                                  num_spec_tokens=(spec_config.num_speculative_tokens
                                                   if spec_config is not None else 0),
                                  engine_index=_engine_index(self.vllm_config),
                                  **_observability_args(self.vllm_config))
        # Several API servers on one shared core: only its primary records its series.
        self.stats.records_core_stats = getattr(getattr(engine, "engine_core", None),
                                                "records_core_stats", True)
        self._inbox: "queue.SimpleQueue[Union[_Add, _Abort]]" = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # orders "post to inbox" against "engine died"
        self._dead: Optional[EngineDeadError] = None
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}  # owned by the loop thread
        self._pending_ids: set[str] = set()  # ids posted but not yet finished (event loop)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._shutdown_done = False
        self._start_requested = start_engine_loop
        self._no_compile_stats = False
        self._unsettled_since: Optional[float] = None
        """Since when the idle loop has seen the core count requests it no longer has."""
        self._was_idle = False
        """The loop's last turn ran no step (its next idle turn need not poll workers)."""
        self._gate = PauseGate()
        self._held = False  # pause mode "keep": the loop thread runs no step (its own)

    # ------------------------------------------------------------ creation
    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                         max_log_len: Optional[int] = None,
                         while_core_starts: Optional[Callable[[Any], None]] = None
                         ) -> "AsyncLLMEngine":
        """`while_core_starts(llm_engine)`: the caller's own set-up (a server copies the
        tokenizer), run while the core process initializes, once the tokenizer is loaded."""
        from vllm.engine.core_client import use_multiprocessing
        from vllm.engine.llm_engine import LLMEngine
        # The core in its own process by default: its steps then overlap this
        # process's HTTP, tokenization and detokenization work.
        engine = LLMEngine.from_engine_args(engine_args,
                                            multiprocess=use_multiprocessing(default=True),
                                            wait_for_core=while_core_starts is None)
        if while_core_starts is not None:
            try:
                while_core_starts(engine)
                engine.wait_for_core()
            except BaseException:
                engine.engine_core.shutdown()
                raise
        return cls(engine,
                   log_requests=getattr(engine_args, "log_requests", True),
                   log_outputs=getattr(engine_args, "enable_log_outputs", False),
                   log_stats=not getattr(engine_args, "disable_log_stats", False),
                   max_log_len=max_log_len, start_engine_loop=start_engine_loop)

    # --------------------------------------------------------------- state
    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def errored(self) -> bool:
        return self._dead is not None and not self._stopping

    @property
    def is_stopped(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> Optional[EngineDeadError]:
        return self._dead

    async def check_health(self) -> None:
        """Raise EngineDeadError when the engine loop is no longer serving.

        Also asks the engine itself (a flag read: a worker process that died while the
        server was idle makes the engine dead now, not at the next request).
        """
        if self._dead is None:
            engine_check = getattr(self.engine, "check_health", None)
            try:
                if engine_check is not None:
                    engine_check()
            except Exception as exc:  # noqa: BLE001 - any failure means the engine is gone
                self._mark_dead(exc)
        if self._dead is not None:
            raise self._dead

    def _mark_dead(self, exc: BaseException) -> None:
        dead = EngineDeadError(f"The engine failed: {_sentence(exc)} It cannot serve more "
                               "requests; restart the server.")
        dead.__cause__ = exc
        with self._lock:
            if self._dead is None:
                self._dead = dead
        logger.error("%s", dead)
        self._wake_loop()

    @property
    def tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    async def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    @property
    def metrics_registry(self) -> Any:
        return self.stats.registry

    async def sleep(self, level: int = 1) -> None:
        await super().sleep(level)
        self.stats.on_sleep_state(level)

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        await super().wake_up(tags)
        if not await self.is_sleeping():  # a partial wake-up leaves it asleep
            self.stats.on_sleep_state(0)

    def start_background_loop(self) -> None:
        """Start the engine loop thread, bound to the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run_loop, name="vllm-engine-loop",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ requests
    async def add_request(self, request_id: str, prompt: Any, params: Any,
                          arrival_time: Optional[float] = None,
                          lora_request: Any = None, priority: int = 0,
                          trace_headers: Optional[Mapping[str, str]] = None) -> RequestStream:
        """Queue a request and wait until the engine accepted it.

        Raises ValueError (invalid request, from the engine's validation) or EngineDeadError
        here, before any output, so a server can still answer with a plain HTTP error.
        """
        if self._thread is None:
            if not self._start_requested:
                raise RuntimeError("The engine loop is not running; call "
                                   "start_background_loop() first.")
            self.start_background_loop()
        await self._gate.wait_open()  # paused for a weight update: wait for resume
        if request_id in self._pending_ids:
            raise ValueError(f"request_id {request_id!r} is already in use by a running "
                             "request.")
        stream = RequestStream(request_id, getattr(params, "output_kind", None))
        inner = _with_delta_kind(params)
        accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        command = _Add(request_id, prompt, inner,
                       time.time() if arrival_time is None else arrival_time, stream, accepted,
                       lora_request, priority,
                       dict(trace_headers) if trace_headers else None)
        self._post(command)
        self._pending_ids.add(request_id)
        try:
            await accepted
        except BaseException:
            self._pending_ids.discard(request_id)
            if not accepted.done() or accepted.cancelled():
                # Cancelled while waiting: the engine may accept it later; take it back.
                self._post_quietly(_Abort([request_id], notify=False))
            raise
        if self.log_requests:
            self._log_request(request_id, prompt, params)
        return stream

    async def iterate(self, stream: RequestStream) -> AsyncGenerator[Any, None]:
        """Yield a stream's outputs; abort the request if the consumer stops early."""
        texts: dict[int, str] = {}
        ids: dict[int, list[int]] = {}
        try:
            while True:
                try:
                    output = await stream.get()
                except StopAsyncIteration:
                    return
                if self.log_outputs:
                    self._log_output(stream, output, texts, ids)
                yield output
        finally:
            self._pending_ids.discard(stream.request_id)
            if not stream.finished:
                self._post_quietly(_Abort([stream.request_id], notify=False))
                if self.log_requests:
                    logger.info("Aborted request %s.", stream.request_id)

    # ------------------------------------------------------------ admin
    async def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run on the engine thread between two steps (the engine is not thread-safe)."""
        return await self._call(lambda engine: engine.call_utility(name, *args, **kwargs))

    async def _call(self, fn: Any) -> Any:
        if self._thread is None:
            self.start_background_loop()
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._post(_Call(fn, done))
        return await done

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests: their streams end (with finish_reason "abort" when they produced
        output) and their KV blocks are freed. Unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._pending_ids.difference_update(ids)
        self._post_quietly(_Abort(ids, notify=True))

    # ------------------------------------------------------------ pause
    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True,
                               wait_for_inflight_requests: bool = False) -> None:
        """Stop generating (vllm/engine/pause.py): new requests wait until resume, the
        running ones are aborted, waited for, or kept frozen (`mode`); then, unless
        kept, the prefix cache is cleared (`clear_cache`)."""
        mode = resolve_pause_mode(mode, wait_for_inflight_requests)
        if self._gate.paused:
            return
        self._gate.pause()
        if mode == "abort":
            await self.abort(list(self._pending_ids))
        elif mode == "wait":
            while self._pending_ids:
                if self._dead is not None:
                    raise self._dead
                await asyncio.sleep(0.01)
        else:
            await self._call(lambda engine: self._set_held(True))
        if clear_cache and mode != "keep":
            await self.reset_prefix_cache()

    async def resume_generation(self) -> None:
        """Serve again: waiting requests are admitted, frozen ones continue."""
        if self._held:
            await self._call(lambda engine: self._set_held(False))
        self._gate.resume()

    async def is_paused(self) -> bool:
        return self._gate.paused

    def _set_held(self, held: bool) -> None:
        """On the loop thread, between steps: whether steps may run."""
        self._held = held

    # ------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop thread after its current step, end every stream, free the engine."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        with self._lock:
            self._stopping = True
            if self._dead is None:
                self._dead = EngineDeadError("The engine is shutting down.")
        self._wake_loop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("Engine loop thread did not stop within %.0f s.", timeout)
        if thread is None or not thread.is_alive():
            self._fail_all(self._dead)
        try:
            self.engine.shutdown()
        except Exception:  # noqa: BLE001 - shutting down anyway; report and go on
            logger.exception("Error while shutting down the engine.")

    # ------------------------------------------------------- event loop side
    def _post(self, command: Union[_Add, _Abort]) -> None:
        with self._lock:
            if self._dead is not None:
                raise self._dead
            self._inbox.put(command)
        self._wake_loop()

    def _wake_loop(self) -> None:
        """Wake the loop thread, idle or waiting in a step for an out-of-process core."""
        self._wake.set()
        wakeup = getattr(self.engine, "wakeup", None)
        if wakeup is not None:
            wakeup()

    def _post_quietly(self, command: _Abort) -> None:
        try:
            self._post(command)
        except EngineDeadError:
            pass

    def _log_request(self, request_id: str, prompt: Any, params: Any) -> None:
        text, ids = _prompt_parts(prompt)
        if self.max_log_len is not None:
            text = text[:self.max_log_len] if text is not None else None
            ids = ids[:self.max_log_len] if ids is not None else None
        logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s.",
                    request_id, text, params, ids)

    def _log_output(self, stream: RequestStream, output: Any, texts: dict[int, str],
                    ids: dict[int, list[int]]) -> None:
        """--enable-log-outputs: collect a request's completions (deltas or whole, as
        its stream hands them out) and log them when it finishes."""
        delta = stream.output_kind_name == "DELTA"
        for c in getattr(output, "outputs", None) or []:
            if not hasattr(c, "token_ids"):
                continue  # a pooling output
            texts[c.index] = (texts.get(c.index, "") if delta else "") + c.text
            ids[c.index] = (ids.get(c.index, []) if delta else []) + list(c.token_ids)
            if c.finish_reason is not None:
                text, token_ids = texts[c.index], ids[c.index]
                if self.max_log_len is not None:
                    text, token_ids = text[:self.max_log_len], token_ids[:self.max_log_len]
                logger.info("Generated response %s (choice %d): output: %r, output_token_ids: "
                            "%s, finish_reason: %s.", stream.request_id, c.index, text,
                            token_ids, c.finish_reason)

    # -------------------------------------------------------- engine thread
    def _run_loop(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                self._drain_inbox()
                if self._stopping:
                    break
                if self.engine.has_unfinished_requests() and not self._held:
                    outputs = self.engine.step()
                    self._dispatch(outputs)
                    self._was_idle = False
                else:
                    # Going idle: poll the workers' counters now, or the last second of
                    # work (its compiles, its bucket padding) would wait for the next step.
                    wait = self._idle_stats_wait()  # reads the core's latest stats first
                    self._publish_stats(force=not self._was_idle)
                    self._was_idle = True
                    self._wake.wait(wait)
        except BaseException as exc:  # noqa: BLE001 - any crash kills the engine, reported
            logger.exception("The engine loop stopped with an error.")
            dead = EngineDeadError(
                f"The engine loop died with {type(exc).__name__}: {_sentence(exc)} It "
                "cannot serve more requests; restart the server (see the server log for the "
                "traceback).")
            dead.__cause__ = exc
            with self._lock:
                self._dead = dead
            self._fail_all(dead)
            return
        self._fail_all(self._dead or EngineDeadError("The engine is shutting down."))

    _SETTLE_POLL_S = 0.05
    _SETTLE_LIMIT_S = 5.0

    def _idle_stats_wait(self) -> Optional[float]:
        """How long the idle loop may sleep: until woken (None), or a moment while the
        core's stats still count requests this frontend no longer has (an abort just
        sent reaches the core after the loop learned of it; without another look
        /metrics would show the aborted request running until the next one arrives).
        It looks again for a few seconds at most."""
        get_stats = getattr(self.engine, "get_stats", None)
        stats = get_stats() if get_stats is not None else None
        if (stats is None or self.engine.has_unfinished_requests()  # held: nothing to settle
                or (stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0)):
            self._unsettled_since = None
            return None
        now = time.monotonic()
        if self._unsettled_since is None:
            self._unsettled_since = now
        if now - self._unsettled_since > self._SETTLE_LIMIT_S:
            return None
        return self._SETTLE_POLL_S

    def _drain_inbox(self) -> None:
        deliveries: list[tuple[Any, Any]] = []
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                self._handle_add(command, deliveries)
            elif isinstance(command, _Call):
                self._handle_call(command, deliveries)
            else:
                self._handle_abort(command, deliveries)
        if deliveries:
            self._deliver(deliveries)

    def _handle_add(self, cmd: _Add, deliveries: list) -> None:
        if cmd.request_id in self._streams:
            error: Optional[BaseException] = ValueError(
                f"request_id {cmd.request_id!r} is already in use by a running request.")
        else:
            try:
                kwargs = {} if cmd.lora_request is None else {"lora_request": cmd.lora_request}
                if cmd.priority:
                    kwargs["priority"] = cmd.priority
                if cmd.trace_headers:
                    kwargs["trace_headers"] = cmd.trace_headers
                queued = self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params,
                                                 arrival_time=cmd.arrival_time, **kwargs)
                error = None
            except Exception as exc:  # noqa: BLE001 - handed to the requester, engine lives
                error = exc
        if error is None:
            self._streams[cmd.request_id] = cmd.stream
            # The resolved max_tokens lives in the core request (one place).
            max_tokens = queued[0].max_tokens if queued else None
            self.stats.on_request_added(cmd.request_id, cmd.params, max_tokens)
        deliveries.append((cmd.accepted, error))

    def _handle_call(self, cmd: _Call, deliveries: list) -> None:
        try:
            result: Any = _Result(cmd.fn(self.engine))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, the engine lives
            result = exc
        deliveries.append((cmd.done, result))

    def _handle_abort(self, cmd: _Abort, deliveries: list) -> None:
        known = [rid for rid in cmd.request_ids if rid in self._streams]
        for rid in known:
            stream = self._streams.pop(rid)
            self.stats.on_request_aborted(rid)
            if cmd.notify:
                deliveries.append((stream, _END))
        if known:
            self.engine.abort_request(known)
            self._publish_stats()

    def _dispatch(self, outputs: list[Any]) -> None:
        deliveries: list[tuple[Any, Any]] = []
        live = [out for out in outputs if out.request_id in self._streams]
        failed = [out for out in live if isinstance(out, RequestFailure)]
        if failed:
            live = [out for out in live if not isinstance(out, RequestFailure)]
            for out in failed:
                self.stats.on_request_failed(out.request_id)
                deliveries.append((self._streams.pop(out.request_id), ValueError(out.error)))
        self.stats.on_step(live)
        for out in live:
            stream = self._streams[out.request_id]
            if out.finished:
                del self._streams[out.request_id]
            deliveries.append((stream, out))
        self._publish_stats()
        if deliveries:
            self._deliver(deliveries)

    _COMPILE_STATS_INTERVAL_S = 1.0

    def _publish_stats(self, force: bool = False) -> None:
        get_stats = getattr(self.engine, "get_stats", None)
        if get_stats is not None:
            self.stats.on_scheduler_stats(get_stats())
        # Compile counts may need a round trip to the workers: at most once a second.
        get_compile_stats = getattr(self.engine, "get_compile_stats", None)
        now = time.monotonic()
        if get_compile_stats is not None and not self._no_compile_stats and \
                (force or now - getattr(self, "_compile_stats_at", 0.0) >=
                 self._COMPILE_STATS_INTERVAL_S):
            self._compile_stats_at = now
            compile_stats = get_compile_stats()
            # None: the platform compiles no graphs (CPU); it will not start to.
            self._no_compile_stats = compile_stats is None
            self.stats.on_compile_stats(compile_stats)

    def _deliver(self, deliveries: list[tuple[Any, Any]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_deliver_on_loop, deliveries)
        except RuntimeError:
            pass  # the event loop closed under us: nobody is listening any more

    def _fail_all(self, error: BaseException) -> None:
        """End every stream and every not-yet-accepted request with `error`."""
        deliveries: list[tuple[Any, Any]] = [(s, error) for s in self._streams.values()]
        for request_id in self._streams:
            self.stats.on_request_failed(request_id)
        self._streams.clear()
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                deliveries.append((command.accepted, error))
            elif isinstance(command, _Call):
                deliveries.append((command.done, error))
        if deliveries:
            self._deliver(deliveries)


def _deliver_on_loop(deliveries: list[tuple[Any, Any]]) -> None:
    for target, item in deliveries:
        if isinstance(target, asyncio.Future):
            if target.done():
                continue
            if item is None:
                target.set_result(None)
            elif isinstance(item, _Result):
                target.set_result(item.value)
            else:
                target.set_exception(item)
        else:
            target.put(item)


# ------------------------------------------------------------------ outputs
def _kind_name(kind: Any) -> str:
    name = getattr(kind, "name", None) or (str(kind) if kind is not None else "CUMULATIVE")
    return name.upper()


def _with_delta_kind(params: Any) -> Any:
    """A copy of the sampling params asking the engine for DELTA outputs."""
    from vllm.sampling_params import RequestOutputKind
    inner = copy.copy(params)
    inner.output_kind = RequestOutputKind.DELTA
    return inner


def merge_delta(acc: Any, new: Any) -> Any:
    """Append the DELTA output `new` to `acc` (a merged output owned by the stream)."""
    merged = copy.copy(acc)
    by_index = {c.index: c for c in acc.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is None:
            by_index[c.index] = c
            continue
        joined = copy.copy(old)
        joined.text = (old.text or "") + (c.text or "")
        joined.token_ids = list(old.token_ids) + list(c.token_ids)
        if c.logprobs is not None or old.logprobs is not None:
            joined.logprobs = list(old.logprobs or []) + list(c.logprobs or [])
        joined.cumulative_logprob = c.cumulative_logprob
        joined.finish_reason = c.finish_reason
        joined.stop_reason = c.stop_reason
        by_index[c.index] = joined
    merged.outputs = [by_index[i] for i in sorted(by_index)]
    if merged.prompt_logprobs is None:
        merged.prompt_logprobs = new.prompt_logprobs
    merged.finished = new.finished
    if getattr(new, "metrics", None) is not None:
        merged.metrics = new.metrics
    if getattr(new, "num_cached_tokens", None) is not None:
        merged.num_cached_tokens = new.num_cached_tokens
    if getattr(new, "kv_transfer_params", None) is not None:
        merged.kv_transfer_params = new.kv_transfer_params
    return merged


def snapshot(output: Any) -> Any:
    """A copy whose lists the stream will not mutate later (CUMULATIVE hand-outs)."""
    snap = copy.copy(output)
    snap.outputs = []
    for c in output.outputs:
        cc = copy.copy(c)
        cc.token_ids = list(c.token_ids)
        if c.logprobs is not None:
            cc.logprobs = list(c.logprobs)
        snap.outputs.append(cc)
    return snap


def as_aborted(output: Any, empty: bool = False) -> Any:
    """A finished copy of `output`; `empty` drops its content (a DELTA with no news)."""
    final = snapshot(output)
    final.finished = True
    for c in final.outputs:
        if empty:
            c.text, c.token_ids = "", []
            c.logprobs = [] if c.logprobs is not None else None
        if c.finish_reason is None:
            c.finish_reason = "abort"
    return final


def _sentence(exc: BaseException) -> str:
    """The error's message as a sentence (one final period), to be followed by another:
    messages that end with a period already must not get a second one."""
    text = str(exc).rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _prompt_parts(prompt: Any) -> tuple[Optional[str], Optional[list[int]]]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        return prompt.get("prompt"), prompt.get("prompt_token_ids")
    return None, None


def _engine_index(vllm_config: Any) -> int:
    """The `engine` label of this engine's series: its data-parallel rank."""
    pc = getattr(vllm_config, "parallel_config", None)
    return getattr(pc, "data_parallel_rank", 0)


def _observability_args(vllm_config: Any) -> dict[str, Any]:
    """StatsTracker's arguments for the opt-in metric families (ObservabilityConfig)."""
    obs = getattr(vllm_config, "observability_config", None)
    if obs is None:
        return {}
    args: dict[str, Any] = {"observability_config": obs}
    if obs.enable_mfu_metrics:
        from vllm.engine.perf_metrics import ModelShape, PerfModel, device_model
        from vllm.platforms import current_platform
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        dtype_bytes = getattr(mc.torch_dtype, "itemsize", 2)
        kv_bytes = 1 if str(vllm_config.cache_config.cache_dtype).startswith("fp8") \
            else dtype_bytes
        shape = ModelShape.from_hf_config(
            mc.hf_config, dtype_bytes=dtype_bytes, kv_bytes=kv_bytes,
            num_devices=pc.tensor_parallel_size * pc.pipeline_parallel_size)
        args.update(perf_model=PerfModel(shape), device_model=device_model(current_platform))
    return args

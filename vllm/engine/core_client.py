"""How the frontend (LLMEngine) reaches its engine core: in this process or in another.

Both kinds answer the same calls, the ones LLMEngine makes: `add_request`,
`abort_requests`, `step`, `get_stats`, `call_utility`, `check_awake`, `loaded_loras`,
`shutdown`. In-process, that is the `EngineCore` itself (a step runs in the caller's
thread). Out of process, `MPEngineCoreClient` sends requests and admin calls over ZMQ to
the core's own process (vllm/engine/core_proc.py), which steps on its own; `step()`
here returns the outputs that arrived (waiting for some when none has).

Where the core runs (VLLM_ENABLE_V1_MULTIPROCESSING, vLLM's switch): unset, the server
puts it in its own process and `LLM` keeps it in-process (a script's first generate
comes sooner, and tests reach the model through it); 1 / 0 force one or the other.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from typing import Any, Iterable, Optional

import zmq

from vllm.core.scheduler import EngineCoreOutput, SchedulerStats
from vllm.engine import serial
from vllm.engine.serial import MessageDecoder, MessageEncoder
from vllm.request import Request, RequestStatus

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
"""How long shutdown waits for the core process to stop its workers and exit."""


def use_multiprocessing(default: bool) -> bool:
    """VLLM_ENABLE_V1_MULTIPROCESSING, or `default` (the caller's) when unset."""
    from vllm import envs
    value = envs.VLLM_ENABLE_V1_MULTIPROCESSING
    return default if value is None else value


def make_engine_core(vllm_config: Any, multiprocess: bool, wait_ready: bool = True,
                     address: Optional[str] = None) -> Any:
    """The engine core for LLMEngine: an EngineCore here, or a client of one elsewhere
    (`wait_ready=False`: started, not waited for; call its `wait_ready()`). `address`:
    a shared core already running there (vllm/engine/core_server.py)."""
    if address is not None:
        return RemoteEngineCoreClient(vllm_config, address, wait_ready=wait_ready)
    if multiprocess:
        return MPEngineCoreClient(vllm_config, wait_ready=wait_ready)
    from vllm.engine.core import EngineCore
    return EngineCore(vllm_config)


def core_mp_context() -> Any:
    """The multiprocessing context the engine core starts with: fork where it is safe,
    spawn otherwise (the rules: vllm/engine/core_launch.py)."""
    from vllm.engine import core_launch
    return core_launch.mp_context(core_launch.start_method())


class EngineCoreDeadError(RuntimeError):
    """The engine-core process exited or failed; nothing more will come from it."""


class MPEngineCoreClient:
    """The frontend's end of an engine core running in its own process."""

    multiprocess = True

    records_core_stats = True
    """Whether this frontend records the core's own metric series (a shared core's
    primary frontend does; see vllm/engine/core_server.py)."""

    def __init__(self, vllm_config: Any, wait_ready: bool = True) -> None:
        self._init_state(vllm_config)
        self._dir = tempfile.mkdtemp(prefix="vllm-core-")
        self._input_addr = f"ipc://{os.path.join(self._dir, 'input')}"
        self._output_addr = f"ipc://{os.path.join(self._dir, 'output')}"
        start = time.perf_counter()
        # The process first, then this process's ZMQ context (whose I/O threads would
        # make a fork unsafe); the core's connects wait for the binds.
        self.proc, self._death_writer = self._start_process()
        self._ctx = zmq.Context()
        self._input = self._bind(zmq.PUSH, self._input_addr)
        self._output = self._bind(zmq.PULL, self._output_addr)
        self._make_pollers(self.proc.sentinel)
        self._finalizer = weakref.finalize(self, _close, self.proc, self._input, self._output,
                                           self._ctx, self._death_writer, self._dir,
                                           self._wake_r, self._wake_w)
        self._started_at = start
        self._ready = False
        if wait_ready:
            self.wait_ready()

    def _init_state(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.loaded_loras: dict[int, Any] = {}
        """Adapters the core loaded (mirrors the core's table: add_request checks it)."""
        self._asleep = False
        self._stats = SchedulerStats()
        self._pending: list[EngineCoreOutput] = []
        self._replies: dict[int, tuple[bool, Any]] = {}
        self._call_ids = itertools.count()
        self._lock = threading.RLock()  # one thread at a time talks to the sockets
        self._dead: Optional[str] = None
        self._closed = False
        self._encoder = MessageEncoder()
        self._decoder = MessageDecoder()

    def _make_pollers(self, death_watch: Any) -> None:
        """What a wait watches: the core's messages, `death_watch` (the core process's
        sentinel, or a disconnect monitor), and (`step()` only) wakeups."""
        self._death_watch = death_watch
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._poller = zmq.Poller()
        self._poller.register(self._output, zmq.POLLIN)
        self._poller.register(death_watch, zmq.POLLIN)
        self._wakeable_poller = zmq.Poller()
        for sock in (self._output, death_watch, self._wake_r):
            self._wakeable_poller.register(sock, zmq.POLLIN)

    def wait_ready(self) -> None:
        """Wait until the core is initialized (its KV cache sized); raise its start-up
        error, after stopping it. The frontend may do its own set-up first (load the
        tokenizer) while the core initializes."""
        if self._ready:
            return
        try:
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self._ready = True
        logger.info("Engine core process started (pid %d) in %.2f s.", self.proc.pid,
                    time.perf_counter() - self._started_at)

    def _on_ready(self, info: dict[str, Any]) -> None:
        self.vllm_config.cache_config.num_gpu_blocks = info["num_gpu_blocks"]

    def _start_process(self) -> tuple[Any, Any]:
        """The core's process and this end of its death pipe: the one the server forked
        early with this config (sent the addresses now), else a new one (fork or spawn,
        core_launch.py)."""
        from vllm.engine import core_launch
        from vllm.engine.core_proc import run_engine_core
        from vllm.executor.multiproc_utils import register_engine_side
        kwargs = dict(vllm_config=self.vllm_config, input_addr=self._input_addr,
                      output_addr=self._output_addr)
        early = core_launch.take(self.vllm_config)
        if early is not None:
            core_launch.launch(early, self._input_addr, self._output_addr)
            return early.proc, early.conn
        ctx = core_mp_context()
        death_reader, death_writer = ctx.Pipe(duplex=False)
        register_engine_side(death_writer)
        # Not a daemon: the core starts worker processes of its own (TP/PP).
        proc = ctx.Process(target=run_engine_core, name="EngineCore", daemon=False,
                           kwargs=dict(kwargs, death_reader=death_reader))
        proc.start()
        death_reader.close()
        return proc, death_writer

    def _bind(self, kind: int, addr: str) -> Any:
        sock = self._ctx.socket(kind)
        sock.bind(addr)
        return sock

    def _wait_ready(self) -> None:
        try:
            self._wait_ready_message()
        except EngineCoreDeadError as exc:
            raise EngineCoreDeadError(
                f"{exc} It died before it was ready (its log is above). A script that "
                "starts an engine core process must guard its top level with `if "
                "__name__ == \"__main__\":`: the process starts with spawn, which "
                "imports the script again.") from None

    def _wait_ready_message(self) -> None:
        while True:
            message = self._recv()
            if message is None:
                continue
            kind, *fields = message
            if kind == serial.READY:
                self._on_ready(fields[0])
                return
            if kind == serial.FAILED:
                exc, tb = fields
                # The error says what to do; its traceback is for debugging only.
                logger.debug("The engine core failed to start:\n%s", tb)
                raise exc

    # ---------------------------------------------------------- requests
    def add_request(self, request: Request) -> None:
        self._send(serial.ADD, MessageEncoder.opaque(request))

    def abort_requests(self, request_ids: Iterable[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        ids = list(request_ids)
        if ids:
            self._send(serial.ABORT, ids, int(status))

    def step(self) -> list[EngineCoreOutput]:
        """The outputs that arrived since the last call; waits for some when none has
        (until `wakeup()` or the core's death, which raises EngineCoreDeadError)."""
        with self._lock:
            while not self._pending:
                message = self._recv()
                if message is None:
                    break  # woken up: the caller has news to send first
                self._absorb(message)
            self._drain()
            outputs, self._pending = self._pending, []
        return outputs

    def wakeup(self) -> None:
        """Make a `step()` waiting in another thread return (thread-safe)."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def get_stats(self) -> SchedulerStats:
        """The scheduler's stats as of the last message from the core (those already
        waiting are read first: after an abort the core sends its new stats with no
        outputs, which no step would read once the frontend has nothing to run)."""
        if not self._dead:
            self._drain()
        return self._stats

    # --------------------------------------------------------- utilities
    def call_utility(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run an admin operation in the core between two steps; its result or error."""
        with self._lock:
            call_id = next(self._call_ids)
            self._send(serial.UTILITY, call_id, name, MessageEncoder.opaque(args),
                       MessageEncoder.opaque(kwargs))
            while call_id not in self._replies:
                message = self._recv(wakeable=False)
                if message is not None:
                    self._absorb(message)
            ok, value = self._replies.pop(call_id)
        if not ok:
            raise value
        self._mirror(name, args, value)
        return value

    def _mirror(self, name: str, args: tuple, result: Any) -> None:
        """Keep the frontend's copies of core state that add_request consults."""
        if name == "add_lora":
            self.loaded_loras[args[0].lora_int_id] = args[0]
        elif name == "remove_lora":
            self.loaded_loras.pop(args[0], None)
        elif name in ("sleep", "wake_up"):
            self._asleep = self.call_utility("is_sleeping")

    def collective_rpc(self, method: Any, timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        return self.call_utility("collective_rpc", method, timeout=timeout, args=args,
                                 kwargs=kwargs, unique_reply_rank=unique_reply_rank)

    def check_awake(self) -> None:
        if self._asleep:
            raise ValueError("The engine is sleeping; call wake_up() before adding "
                             "requests.")

    def check_health(self) -> None:
        """Raise when the core process is gone (no round trip: a flag, a waitpid and a
        read of /proc, which tells a killed core at once, before it can be reaped)."""
        from vllm.executor.multiproc_utils import exiting_status
        if self._dead is None and (not self.proc.is_alive()
                                   or exiting_status(self.proc.pid) is not None):
            self._read_last_words()
            if self._dead is None:
                self._dead = self._death_message()
        if self._dead is not None:
            raise EngineCoreDeadError(self._dead)

    def _read_last_words(self) -> None:
        """Take the messages the core sent before it exited, its reason (DEAD) among
        them, unless another thread is reading the sockets (that thread gets them)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._drain()
        except EngineCoreDeadError:
            pass  # self._dead now holds the core's own reason
        finally:
            self._lock.release()

    @property
    def executor(self) -> Any:
        raise AttributeError(
            "The engine core runs in another process (VLLM_ENABLE_V1_MULTIPROCESSING=1), "
            "so its executor is not reachable from here; use collective_rpc, or set "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0.")

    # ----------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Ask the core to stop (it shuts its workers down), wait, then make sure. A core
        not ready yet (the frontend's own set-up failed meanwhile) has nothing to finish
        and may not read its socket for a while: its death pipe closes at once instead
        (a stop message sent before it connected would be dropped, and the wait would
        run out its 30 s)."""
        if self._closed:
            return
        self._closed = True
        if self.proc.is_alive() and self._dead is None and self._ready:
            try:
                self._input.send(self._encoder.encode(serial.SHUTDOWN), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self.proc.join(SHUTDOWN_TIMEOUT_S)
        self._finalizer()

    # ------------------------------------------------------------ sockets
    def _send(self, kind: str, *fields: Any) -> None:
        self.check_health()
        with self._lock:
            self._input.send(self._encoder.encode(kind, *fields))

    def _recv(self, wakeable: bool = True) -> Optional[list[Any]]:
        """The next message; None when woken up. Raises when the core died."""
        events = dict((self._wakeable_poller if wakeable else self._poller).poll())
        if self._output in events:
            return self._decoder.decode(self._output.recv())
        if self._death_watch in events:
            self._on_death_event()
            return None
        self._clear_wakeups()
        return None

    def _on_death_event(self) -> None:
        self._dead = self._death_message()
        raise EngineCoreDeadError(self._dead)

    def _drain(self) -> None:
        """Take every message already waiting, without blocking."""
        while True:
            try:
                data = self._output.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._absorb(self._decoder.decode(data))

    def _absorb(self, message: list[Any]) -> None:
        kind, *fields = message
        if kind == serial.OUTPUTS:
            self._pending.extend(serial.unpack_outputs(fields[0]))
            self._stats = fields[1]
        elif kind == serial.UTILITY_REPLY:
            call_id, ok, value = fields
            self._replies[call_id] = (ok, value)
        elif kind == serial.DEAD:
            reason, tb = fields
            logger.error("The engine core died:\n%s", tb)
            self._dead = f"The engine core process failed: {reason}"
            raise EngineCoreDeadError(self._dead)
        else:
            raise RuntimeError(f"Unexpected message {kind!r} from the engine core.")

    def _clear_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _death_message(self) -> str:
        from vllm.executor.multiproc_utils import describe_exit, exiting_status
        if exiting_status(self.proc.pid) is None:
            self.proc.join(1.0)  # reap it: its exit code (the sentinel fires before that)
        return (f"The engine core process (pid {self.proc.pid}) exited unexpectedly "
                f"({describe_exit(self.proc)}).")


class RemoteEngineCoreClient(MPEngineCoreClient):
    """The frontend's end of a shared engine core (vllm/engine/core_server.py) already
    running at `address`, on this node or another; several frontends share it.

    Nothing here owns the core: shutdown only tells it this frontend leaves. The core
    counts as dead when its connection drops (its process exited, or heartbeats stopped
    on a lost node): the requests waiting on it fail with EngineCoreDeadError."""

    def __init__(self, vllm_config: Any, address: str, wait_ready: bool = True) -> None:
        from vllm.engine.core_server import set_heartbeats, watch_disconnects
        self._init_state(vllm_config)
        self.address = address
        self.records_core_stats = False
        self._started_at = time.perf_counter()
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, os.urandom(8))
        set_heartbeats(sock)
        self._monitor = watch_disconnects(sock)
        sock.connect(address)
        self._input = self._output = sock
        self._make_pollers(self._monitor)
        self._finalizer = weakref.finalize(self, _close_remote, sock, self._monitor,
                                           self._ctx, self._wake_r, self._wake_w)
        self._ready = False
        self._send(serial.HELLO)
        if wait_ready:
            self.wait_ready()

    @property
    def rank(self) -> int:
        return self.vllm_config.parallel_config.data_parallel_rank

    def wait_ready(self) -> None:
        if self._ready:
            return
        try:
            self._wait_ready_message()
        except BaseException:
            self.shutdown()
            raise
        self._ready = True
        logger.info("Connected to engine core DP rank %d at %s (%s).", self.rank,
                    self.address, "primary frontend" if self.records_core_stats else
                    "secondary frontend")

    def _on_ready(self, info: dict[str, Any]) -> None:
        super()._on_ready(info)
        self.records_core_stats = bool(info.get("primary"))

    def check_health(self) -> None:
        """Raise once the core's connection dropped (read without blocking, unless
        another thread is reading the sockets: it notices the same event)."""
        from vllm.engine.core_server import disconnected
        if self._dead is None and self._lock.acquire(blocking=False):
            try:
                if disconnected(self._monitor):
                    self._drain_quietly()
                    if self._dead is None:
                        self._dead = self._death_message()
            finally:
                self._lock.release()
        if self._dead is not None:
            raise EngineCoreDeadError(self._dead)

    def _drain_quietly(self) -> None:
        try:
            self._drain()
        except EngineCoreDeadError:
            pass  # self._dead holds the core's own reason

    def _on_death_event(self) -> None:
        from vllm.engine.core_server import disconnected
        if disconnected(self._monitor):
            self._drain_quietly()
            if self._dead is None:
                self._dead = self._death_message()
            raise EngineCoreDeadError(self._dead)

    def _death_message(self) -> str:
        return (f"The engine core of data-parallel rank {self.rank} at {self.address} "
                "disconnected: its process or its node is gone.")

    def shutdown(self) -> None:
        """Tell the core this frontend leaves (it aborts what is left of ours)."""
        if self._closed:
            return
        self._closed = True
        if self._dead is None:
            try:
                self._input.send(self._encoder.encode(serial.SHUTDOWN), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._finalizer()


def _close_remote(sock: Any, monitor: Any, ctx: Any, wake_r: Any, wake_w: Any) -> None:
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(linger=0)
    sock.close(linger=1000)  # the goodbye goes out
    ctx.term()
    for s in (wake_r, wake_w):
        s.close()


def _close(proc: Any, input_sock: Any, output_sock: Any, ctx: Any, death_writer: Any,
           ipc_dir: str, wake_r: Any, wake_w: Any) -> None:
    """Stop the core process if it still runs, and release every handle (also at exit)."""
    from vllm.executor.multiproc_utils import stop_processes
    try:
        death_writer.close()  # the core's watcher reads EOF and exits
    except OSError:
        pass
    if proc.is_alive():
        stop_processes([proc], grace_s=5.0)
    for sock in (input_sock, output_sock):
        sock.close(linger=0)
    ctx.term()
    for s in (wake_r, wake_w):
        s.close()
    shutil.rmtree(ipc_dir, ignore_errors=True)

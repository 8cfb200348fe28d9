"""An engine core served to several frontends, on this node or another: the process
side of `RemoteEngineCoreClient` (vllm/engine/core_client.py).

Why: with `--api-server-count N` every API server process is a frontend of its own
(tokenization, detokenization, streaming run there), and each must reach every
data-parallel engine core; a core on a `--headless` node is reached over TCP.

Sockets: the core binds one ROUTER socket; each frontend connects a DEALER, whose
identity names it. Frontend -> core: the messages of a private core (ADD, ABORT,
UTILITY), HELLO (answered with READY) and SHUTDOWN, which here means "this frontend
leaves" (its unfinished requests are aborted). Core -> frontend: a step's outputs go to
the frontend that added each request, each with the scheduler's stats; every frontend
gets the stats when they change (they route new requests by each core's waiting +
running); an admin call's reply goes to its caller. The first frontend to say hello is
the core's *primary*: only it records the core's own series (queue gauges,
prefix-cache and preemption counters) in the Prometheus files the frontends share, so
that they are counted once.

Registration: the core initializes, binds its socket, then tells the head node's
registry (vllm/engine/dp_cores.py) its rank and address, or its start-up error. It
keeps that connection: when the head goes away (its process exits, or ZMQ heartbeats
stop on a lost node) or sends SHUTDOWN there, the core stops.
"""
from __future__ import annotations

import logging
import os
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any, Optional

import zmq
import zmq.utils.monitor

from vllm.engine import serial
from vllm.engine.core_proc import (IDLE_HEALTH_CHECK_MS, EngineCoreProc, _exit, _portable,
                                   run_off_main_thread)
from vllm.engine.serial import MessageEncoder
from vllm.request import RequestStatus

logger = logging.getLogger(__name__)

HEARTBEAT_IVL_MS = 2000
"""ZMQ heartbeats between a core and its head / frontends: a node that vanishes without
closing its connections (power, network) is noticed within HEARTBEAT_TIMEOUT_MS."""
HEARTBEAT_TIMEOUT_MS = 20000


def set_heartbeats(sock: Any) -> None:
    """Heartbeats run in ZMQ's I/O thread: a core busy in a long step still answers."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


def watch_disconnects(sock: Any) -> Any:
    """A PAIR socket that becomes readable when `sock`'s peer disconnects."""
    return sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)


def disconnected(monitor: Any) -> bool:
    """Whether `monitor` (watch_disconnects) reported a disconnect; never blocks."""
    lost = False
    while monitor.poll(0):
        event = zmq.utils.monitor.recv_monitor_message(monitor)
        lost = lost or event["event"] == zmq.EVENT_DISCONNECTED
    return lost


def run_shared_engine_core(vllm_config: Any, registry_addr: str, host: str,
                           death_reader: Optional[Connection] = None) -> None:
    """Entry point of a served engine core (data-parallel rank
    `vllm_config.parallel_config.data_parallel_rank`): initialize, bind on `host`,
    register with the head at `registry_addr`, then serve. `death_reader`: the pipe of a
    local parent (its EOF stops the core too)."""
    from vllm.executor.multiproc_utils import exit_when_parent_dies, prefix_log_lines
    rank = vllm_config.parallel_config.data_parallel_rank
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launcher decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if death_reader is not None:
        exit_when_parent_dies(death_reader)
    prefix_log_lines(None, kind=f"EngineCore_DP{rank}")
    ctx = zmq.Context()
    registry = ctx.socket(zmq.DEALER)
    set_heartbeats(registry)
    registry.setsockopt(zmq.LINGER, 2000)
    head_monitor = watch_disconnects(registry)
    registry.connect(registry_addr)
    router = ctx.socket(zmq.ROUTER)
    set_heartbeats(router)
    encoder = MessageEncoder()
    try:
        from vllm.engine.core import EngineCore
        core = EngineCore(vllm_config)
        router.bind(f"tcp://{_bracket(host)}:*")
    except BaseException as exc:  # noqa: BLE001 - reported to the head, which raises
        registry.send(encoder.encode(serial.FAILED, rank, _portable(exc),
                                     traceback.format_exc()))
        _exit(router, registry, ctx, 1)
    address = router.getsockopt(zmq.LAST_ENDPOINT).decode()
    registry.send(encoder.encode(serial.READY, rank, address, {
        "num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks, "pid": os.getpid()}))
    logger.info("Engine core DP rank %d serving at %s.", rank, address)
    proc = SharedEngineCoreProc(core, router, encoder, registry, head_monitor)
    code = run_off_main_thread(proc.run)
    head_monitor.close(linger=0)
    _exit(router, registry, ctx, code)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class SharedEngineCoreProc(EngineCoreProc):
    """Runs an EngineCore from the messages of every frontend connected to it."""

    def __init__(self, core: Any, router: Any, encoder: MessageEncoder, registry: Any,
                 head_monitor: Any) -> None:
        super().__init__(core, router, router, encoder)
        self.registry = registry
        self.head_monitor = head_monitor
        self._poller = zmq.Poller()
        for sock in (router, registry, head_monitor):
            self._poller.register(sock, zmq.POLLIN)
        self._frontends: list[bytes] = []
        """Connected frontends' identities, the primary first."""
        self._owner: dict[str, bytes] = {}
        """The frontend each unfinished request came from."""
        self._sent_stats: dict[bytes, Any] = {}
        self._reply_to = b""
        """The frontend whose admin call is running (its reply goes there)."""

    # ----------------------------------------------------------- inputs
    def _handle_inputs(self, block: bool) -> bool:
        """Apply every waiting message; False when the head is gone or says stop."""
        if block:
            while not self._poller.poll(IDLE_HEALTH_CHECK_MS):
                self.core.check_health()
        if disconnected(self.head_monitor):
            logger.error("Lost the head node's registry: stopping this engine core.")
            return False
        if self.registry.poll(0):
            kind, *_ = self.decoder.decode(self.registry.recv())
            if kind == serial.SHUTDOWN:
                return False
        while True:
            try:
                identity, data = self.inputs.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return True
            kind, *fields = self.decoder.decode(data)
            self._handle_from(identity, kind, fields)

    def _handle_from(self, identity: bytes, kind: str, fields: list[Any]) -> None:
        if kind == serial.HELLO:
            if identity not in self._frontends:
                self._frontends.append(identity)
            self._send_to(identity, serial.READY, {
                "num_gpu_blocks": self.core.vllm_config.cache_config.num_gpu_blocks,
                "pid": os.getpid(), "primary": self._frontends[0] == identity})
        elif kind == serial.ADD:
            self._owner[fields[0].request_id] = identity
            self.core.add_request(fields[0])
        elif kind == serial.ABORT:
            ids, status = fields
            for request_id in ids:
                self._owner.pop(request_id, None)
            self.core.abort_requests(ids, RequestStatus(status))
        elif kind == serial.UTILITY:
            self._reply_to = identity
            self._run_utility(*fields)
        elif kind == serial.SHUTDOWN:
            self._forget(identity)
        else:
            raise RuntimeError(f"Unknown engine-core message {kind!r}.")

    def _forget(self, identity: bytes) -> None:
        """A frontend left: abort what it still had running."""
        orphans = [rid for rid, owner in self._owner.items() if owner == identity]
        for rid in orphans:
            del self._owner[rid]
        if orphans:
            self.core.abort_requests(orphans, RequestStatus.FINISHED_ABORTED)
        if identity in self._frontends:
            self._frontends.remove(identity)
        self._sent_stats.pop(identity, None)

    # ---------------------------------------------------------- outputs
    def _send(self, data: bytes) -> None:
        """A utility reply (EngineCoreProc sends those on `outputs`): to its caller."""
        self.inputs.send_multipart([self._reply_to, data])

    def _send_to(self, identity: bytes, kind: str, *fields: Any) -> None:
        self.inputs.send_multipart([identity, self.encoder.encode(kind, *fields)])

    def _send_outputs(self, outputs: list[Any]) -> None:
        """Each frontend its own requests' outputs, and the stats when they changed."""
        stats = self.core.get_stats()
        mine: dict[bytes, list[Any]] = {}
        for out in outputs:
            owner = (self._owner.pop(out.request_id, None) if out.finished
                     else self._owner.get(out.request_id))
            if owner is not None:
                mine.setdefault(owner, []).append(out)
        for identity in self._frontends:
            batch = mine.get(identity, [])
            if not batch and self._sent_stats.get(identity) == stats:
                continue
            self._sent_stats[identity] = stats
            self._send_to(identity, serial.OUTPUTS, serial.pack_outputs(batch),
                          MessageEncoder.opaque(stats))

    def _send_dead(self, reason: str, tb: str) -> None:
        for identity in self._frontends:
            self._send_to(identity, serial.DEAD, reason, tb)

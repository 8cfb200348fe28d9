"""MultiprocExecutor: one process per rank on this node (tensor/pipeline parallel).

Every rank, rank 0 included, runs in its own worker process; the engine process
only schedules and waits on pipes. Keeping the driver out of the engine process
means the engine never blocks inside a collective: whatever a worker does (fails,
hangs past VLLM_ENGINE_ITERATION_TIMEOUT_S, gets killed), the engine learns it from
a pipe or a process sentinel and raises a RuntimeError instead of hanging.

Lifetime: a monitor thread watches the process sentinels; the first unexpected
death marks the executor failed and stops the remaining workers (their process
group is useless without the dead rank).

Over several nodes (--nnodes, vllm/executor/multinode.py) this node's ranks are
local workers as above and every other node's ranks are remote workers: their pipe is
a TCP connection and their sentinel a second connection that closes when they die or
their node is lost; the rest is the same code. `shutdown()`, garbage collection of the
executor and interpreter exit all run the same cleanup (weakref.finalize): ask each
worker to shut down, then SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Optional, Sequence

from vllm.executor.distributed_executor import (DistributedExecutorBase, method_name,
                                                wire_method)
from vllm.executor.executor_base import WorkerMethod
from vllm.executor.multinode import (NodeLayout, RemoteWorkerListener, engine_shape,
                                     hang_up)
from vllm.executor.multiproc_utils import (SHUTDOWN_METHOD, RpcReply, RpcRequest,
                                          describe_exit, distributed_init_method,
                                          get_loopback_ip, get_mp_context, get_open_port,
                                          register_engine_side, stop_processes, worker_main)

logger = logging.getLogger(__name__)


@dataclass
class WorkerHandle:
    """The engine's end of one worker process (`proc` None: a remote worker, on another
    node; its `death_writer` is the connection that closes when it is gone)."""
    rank: int
    proc: Optional[BaseProcess]
    conn: Connection
    death_writer: Connection
    peer: str = ""
    """A remote worker's host:port."""

    @property
    def sentinel(self) -> Any:
        """Ready when the worker is gone."""
        return self.death_writer if self.proc is None else self.proc.sentinel


class WorkerGroup:
    """The worker processes and their failure state, shared with the monitor thread.

    Kept apart from the executor so the monitor thread and the finalizer hold no
    reference to the executor, which can then be garbage collected (and cleaned up).
    """

    def __init__(self, handles: list[WorkerHandle]) -> None:
        self.handles = handles
        self.failure: Optional[str] = None
        self.closing = False
        self._lock = threading.RLock()  # one thread at a time reaps the processes
        self._seq = 0
        self._wake_r, self._wake_w = os.pipe()
        self._monitor = threading.Thread(target=self._watch, name="vllm-worker-monitor",
                                         daemon=True)
        self._monitor.start()

    # --------------------------------------------------------------- failure
    @property
    def _procs(self) -> list[BaseProcess]:
        return [h.proc for h in self.handles if h.proc is not None]

    def fail(self, message: str) -> RuntimeError:
        """Record the first failure, stop every worker, return the error to raise."""
        with self._lock:
            if self.failure is None:
                self.failure = message
                logger.error("%s", message)
            stop_processes(self._procs, grace_s=0.0)
            for h in self.handles:
                if h.proc is None:  # hanging up makes a remote worker exit (and wakes
                    hang_up(h.conn)  # a thread waiting on these connections here)
                    hang_up(h.death_writer)
        return RuntimeError(self.failure)

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def death_message(self, handle: WorkerHandle) -> str:
        if handle.proc is None:
            return (f"Remote worker rank {handle.rank} ({handle.peer}) closed its connection: "
                    "its process died or its node or the network was lost; the engine "
                    "cannot continue and must be restarted.")
        with self._lock:  # two threads reaping one process race (one sees no status)
            handle.proc.join(5.0)  # its pipe closes a moment before its exit status is known
            how = describe_exit(handle.proc)
        return (f"Worker process rank {handle.rank} (pid {handle.proc.pid}) died unexpectedly "
                f"({how}); the engine cannot continue and must be restarted.")

    def _wait_for_death(self, grace_s: float) -> Optional[WorkerHandle]:
        """A worker that exits within `grace_s`, if any."""
        by_sentinel = {h.sentinel: h for h in self.handles}
        ready = mp_connection.wait(list(by_sentinel), timeout=grace_s)
        return by_sentinel[ready[0]] if ready else None

    def _watch(self) -> None:
        sentinels = {h.sentinel: h for h in self.handles}
        while not self.closing:
            ready = mp_connection.wait([*sentinels, self._wake_r])
            if self.closing or self._wake_r in ready:
                return
            dead = sentinels[next(s for s in ready if s in sentinels)]
            self.fail(self.death_message(dead))
            return

    # ------------------------------------------------------------------- rpc
    def broadcast(self, request: RpcRequest) -> int:
        """Send one call to every worker; returns its sequence number."""
        if self.closing:
            raise RuntimeError("The executor is shut down; create a new engine.")
        self.raise_if_failed()
        self._seq += 1
        request.seq = self._seq
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        sent = 0
        try:
            for h in self.handles:
                try:
                    h.conn.send_bytes(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    raise self.fail(self.death_message(h)) from None
                sent += 1
        except BaseException:
            if 0 < sent < len(self.handles):
                # Some ranks got the call and will wait in collectives for the others.
                self.fail(f"Interrupted while sending {method_name(request.method)} to the workers; "
                          "their state is inconsistent, restart the engine.")
            raise
        return self._seq

    def collect(self, method: str, ranks: Sequence[int], timeout: Optional[float],
                seq: int) -> list[Any]:
        """Wait for the replies of `ranks` to call `seq`, watching every pipe and sentinel."""
        results: dict[int, Any] = {}
        pending = set(ranks)
        by_conn = {h.conn: h for h in self.handles}
        by_sentinel = {h.sentinel: h for h in self.handles}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            self.raise_if_failed()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self.fail(
                    f"Worker rank(s) {sorted(pending)} did not finish {method} within "
                    f"{timeout:.0f} s (VLLM_ENGINE_ITERATION_TIMEOUT_S); the engine cannot "
                    "continue and must be restarted.")
            ready_list = mp_connection.wait([*by_conn, *by_sentinel], remaining)
            for ready in ready_list:
                if ready in by_sentinel:
                    raise self.fail(self.death_message(by_sentinel[ready]))
            for ready in ready_list:
                handle = by_conn[ready]
                try:
                    reply: RpcReply = ready.recv()
                except (EOFError, OSError):
                    raise self.fail(self.death_message(handle)) from None
                if reply.failure is not None:
                    raise self._fail_with(reply)
                if reply.seq != seq:
                    continue  # the answer to a call whose wait was interrupted
                if reply.rank in pending:
                    results[reply.rank] = reply.result
                    pending.discard(reply.rank)
        return [results[r] for r in ranks]

    def _fail_with(self, reply: RpcReply) -> BaseException:
        failure = reply.failure
        dead = self._wait_for_death(grace_s=2.0)
        if dead is not None and dead.proc is not None:
            with self._lock:
                dead.proc.join(5.0)  # its sentinel fires a moment before its status is known
        # A worker that exits cleanly after a failed call (init) reported its own error;
        # only an abnormal death is the cause of the others' failures.
        if dead is not None and dead.proc is not None and dead.proc.exitcode != 0:
            # A peer's death makes the survivors' collectives fail: report the cause. (The
            # survivors see its sockets close just before its exit becomes visible here.)
            return self.fail(self.death_message(dead))
        error = self.fail(failure.describe())
        if isinstance(failure.exception, ValueError) and failure.method == "init":
            return failure.exception  # bad configuration: keep it a ValueError
        if failure.exception is not None:
            error.__cause__ = failure.exception
        return error

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Ask every worker to exit, then terminate and kill the stragglers."""
        if self.closing:
            return
        self.closing = True
        os.write(self._wake_w, b"x")
        if self.failure is None:
            data = pickle.dumps(RpcRequest(SHUTDOWN_METHOD, ()))
            for h in self.handles:
                try:
                    h.conn.send_bytes(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
        with self._lock:
            stop_processes(self._procs, grace_s=5.0)
            # Remote workers exit on the shutdown call: wait for that (their connections
            # close), so they do not take the head's closing for its death.
            remote = [h.death_writer for h in self.handles
                      if h.proc is None and not h.death_writer.closed]
            deadline = time.monotonic() + 5.0
            while remote and time.monotonic() < deadline:
                gone = mp_connection.wait(remote, max(0.0, deadline - time.monotonic()))
                remote = [c for c in remote if c not in gone]
        for h in self.handles:
            h.conn.close()
            h.death_writer.close()
        self._monitor.join(1.0)
        os.close(self._wake_r)
        os.close(self._wake_w)


class MultiprocExecutor(DistributedExecutorBase):
    """Tensor/pipeline parallel over worker processes on this node (backend "mp")."""

    def _init_executor(self) -> None:
        pc = self.vllm_config.parallel_config
        layout = NodeLayout.of(pc)
        if pc.nnodes > 1 and pc.node_rank != 0:
            raise ValueError(f"node_rank={pc.node_rank}: only node 0 runs the engine; start "
                             "the other nodes with --headless.")
        init_method = (layout.init_method if pc.nnodes > 1 else
                       distributed_init_method(get_loopback_ip(), get_open_port()))
        listener = (RemoteWorkerListener(layout, engine_shape(self.vllm_config))
                    if pc.nnodes > 1 else None)
        start = time.perf_counter()
        handles: list[WorkerHandle] = []
        try:
            for rank in layout.ranks(0):
                handles.append(self._spawn(rank, init_method))
            if listener is not None:
                logger.info("Waiting for the workers of %d other node(s) at %s:%d.",
                            pc.nnodes - 1, *layout.rpc_address)
                remote = listener.accept_all(check=lambda: _check_alive(handles))
                handles += [WorkerHandle(r.rank, None, r.conn, r.death, r.peer)
                            for r in remote.values()]
        except BaseException:
            stop_processes([h.proc for h in handles if h.proc is not None], grace_s=0.0)
            for h in handles:
                if h.proc is None:
                    h.conn.close()
                    h.death_writer.close()
            raise
        self.group = WorkerGroup(handles)
        self._finalizer = weakref.finalize(self, self.group.close)
        try:
            pids = self.group.collect("init", range(self.world_size), timeout=None, seq=0)
        except BaseException:
            self.shutdown()
            raise
        logger.info("Started %d worker processes (tp=%d, pp=%d, pids %s%s) in %.2f s.",
                    self.world_size, pc.tensor_parallel_size, pc.pipeline_parallel_size,
                    pids, f", over {pc.nnodes} nodes" if pc.nnodes > 1 else "",
                    time.perf_counter() - start)

    def _spawn(self, rank: int, init_method: str) -> WorkerHandle:
        ctx = get_mp_context()
        conn, child_conn = ctx.Pipe(duplex=True)
        death_reader, death_writer = ctx.Pipe(duplex=False)
        register_engine_side(conn, death_writer)
        proc = ctx.Process(target=worker_main, name=f"VllmWorker-{rank}", daemon=True,
                           kwargs=dict(vllm_config=self.vllm_config, rank=rank,
                                       local_rank=rank, init_method=init_method,
                                       conn=child_conn, death_reader=death_reader))
        proc.start()
        # Only the child may hold these ends, so that its death reads as EOF here (and ours
        # as EOF there).
        child_conn.close()
        death_reader.close()
        return WorkerHandle(rank, proc, conn, death_writer)

    @property
    def worker_pids(self) -> list[int]:
        """This node's worker processes."""
        return [h.proc.pid for h in self.group.handles if h.proc is not None]

    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        seq = self.group.broadcast(RpcRequest(wire_method(method), tuple(args),
                                              unique_reply_rank, kwargs=kwargs))
        ranks = (range(self.world_size) if unique_reply_rank is None else
                 [unique_reply_rank])
        return self.group.collect(method_name(method), ranks, timeout, seq)

    def check_health(self) -> None:
        """Raise RuntimeError when a worker died or failed (no round trip: safe anytime)."""
        self.group.raise_if_failed()

    def shutdown(self) -> None:
        self._finalizer()


def _check_alive(handles: list[WorkerHandle]) -> None:
    """While the remote nodes join: a local worker that exited (bad configuration, a
    failed start) ends the wait."""
    for h in handles:
        if h.proc is not None and h.proc.exitcode is not None:
            reason = ""
            if h.conn.poll():
                try:
                    reply = h.conn.recv()
                    if reply.failure is not None:
                        if isinstance(reply.failure.exception, ValueError):
                            raise reply.failure.exception
                        reason = ": " + reply.failure.describe()
                except (EOFError, OSError):
                    pass
            raise RuntimeError(f"Worker process rank {h.rank} exited ({describe_exit(h.proc)}) "
                               f"while the other nodes were joining{reason}")

"""Tensor/pipeline parallel over several nodes without Ray (vLLM's --nnodes).

    node 0:  vllm serve MODEL -tp 2 --nnodes 2 --node-rank 0 --master-addr A --master-port P
    node 1:  vllm serve MODEL -tp 2 --nnodes 2 --node-rank 1 --master-addr A --master-port P \\
                 --headless

Each node runs `world_size / nnodes` ranks: node R holds ranks R * per_node onwards
(local ranks 0..per_node-1, its devices). One torch.distributed group spans every
node's workers and meets at `master_addr:master_port` (rank 0, on node 0, hosts the
store). Node 0 runs the API server, the engine and its own workers exactly as the mp
executor does on one node (pipes); the other nodes run only worker processes
(`run_headless`), which reach the head over TCP:

- the head listens at `master_addr:master_port + 1` (`RemoteWorkerListener`);
- each remote worker opens two connections, both starting with a hello (its rank and
  the engine's shape, checked against the head's): the *RPC connection*, which carries
  the same pickled `RpcRequest` / `RpcReply` messages as a local worker's pipe
  (multiprocessing's `Connection` over a socket), and the *death connection*, on which
  nothing is ever sent: either end closing means the other side is gone. The worker
  exits when the head goes; the head's monitor fails the engine when a remote worker
  goes, as it does for a local worker's process sentinel;
- TCP keepalive and a user timeout on both make a lost host or network (no FIN ever
  arrives) an error within `LOST_PEER_S` seconds instead of a hang.

The RPC port carries pickles, like torch.distributed's store port carries its data:
both must be reachable only from the cluster's nodes.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from vllm.executor.multiproc_utils import distributed_init_method

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 600.0
"""How long the head waits for every remote worker to connect, and a remote worker for
the head to listen (nodes start in any order, each loads its own model files)."""
LOST_PEER_S = 20
"""Seconds after which an unanswered peer (host down, network lost) is an error."""
_HELLO = "vllm-multinode-1"
HEAD_GONE_EXIT = 4
"""A remote worker's exit status when the head closed its connections (it stopped,
or died) before sending the shutdown call."""


@dataclass(frozen=True)
class NodeLayout:
    """Where the ranks live (see the module doc)."""
    nnodes: int
    node_rank: int
    per_node: int
    master_addr: str
    master_port: int

    @classmethod
    def of(cls, parallel_config: Any) -> "NodeLayout":
        pc = parallel_config
        return cls(pc.nnodes, pc.node_rank, pc.world_size // pc.nnodes, pc.master_addr,
                   pc.master_port)

    def ranks(self, node: Optional[int] = None) -> range:
        node = self.node_rank if node is None else node
        return range(node * self.per_node, (node + 1) * self.per_node)

    @property
    def remote_ranks(self) -> list[int]:
        """The ranks of every node but the head."""
        return list(range(self.per_node, self.nnodes * self.per_node))

    @property
    def init_method(self) -> str:
        return distributed_init_method(self.master_addr, self.master_port)

    @property
    def rpc_address(self) -> tuple[str, int]:
        return self.master_addr, self.master_port + 1


def engine_shape(vllm_config: Any) -> dict:
    """What every node must agree on; a node started with other flags is refused."""
    pc, mc = vllm_config.parallel_config, vllm_config.model_config
    return {"model": mc.model, "dtype": str(mc.torch_dtype), "max_model_len": mc.max_model_len,
            "tensor_parallel_size": pc.tensor_parallel_size,
            "pipeline_parallel_size": pc.pipeline_parallel_size, "nnodes": pc.nnodes}


def _tune(sock: socket.socket) -> None:
    """Keepalive and a user timeout: a silent peer becomes a socket error (module doc)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 3),
                        ("TCP_KEEPCNT", max(1, (LOST_PEER_S - 5) // 3)),
                        ("TCP_USER_TIMEOUT", LOST_PEER_S * 1000)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _wrap(sock: socket.socket) -> Connection:
    _tune(sock)
    sock.settimeout(None)
    return Connection(sock.detach())


def hang_up(conn: Connection) -> None:
    """Shut a socket connection down without closing it: the peer reads EOF, and a
    thread of this process waiting on it wakes up (closing it would not wake it)."""
    if conn.closed:
        return
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more
    finally:
        sock.close()


# ------------------------------------------------------------------ head side
@dataclass
class RemoteWorker:
    """The head's ends of one remote worker's connections."""
    rank: int
    conn: Connection
    death: Connection
    peer: str
    """host:port it connected from (for messages)."""


class RemoteWorkerListener:
    """The head's RPC port: takes each remote worker's two connections."""

    def __init__(self, layout: NodeLayout, shape: dict) -> None:
        self.layout = layout
        self.shape = shape
        host, port = layout.rpc_address
        try:
            self.sock = socket.create_server((host, port), reuse_port=False)
        except OSError as e:
            raise OSError(f"Cannot listen for the remote workers at {host}:{port} "
                          f"(master_addr, master_port + 1): {e}. Choose a free "
                          "--master-port and an address of this node.") from e
        self.sock.settimeout(0.5)

    def accept_all(self, timeout_s: float = JOIN_TIMEOUT_S,
                   check: Callable[[], None] = lambda: None) -> dict[int, RemoteWorker]:
        """Every remote rank's connections; `check()` runs while waiting (it raises when a
        local worker died). TimeoutError names the nodes that never came."""
        expected = set(self.layout.remote_ranks)
        halves: dict[int, dict[str, Connection]] = {}
        peers: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while any(len(halves.get(r, {})) < 2 for r in expected):
                check()
                if time.monotonic() > deadline:
                    missing = sorted(r for r in expected if len(halves.get(r, {})) < 2)
                    nodes = sorted({r // self.layout.per_node for r in missing})
                    raise TimeoutError(
                        f"Remote workers of rank(s) {missing} (node(s) {nodes}) did not "
                        f"connect to {self.layout.rpc_address[0]}:"
                        f"{self.layout.rpc_address[1]} within {timeout_s:.0f} s: start "
                        "`vllm serve ... --nnodes N --node-rank R --headless` there with "
                        "the same model and parallel flags and this --master-addr/--master-port.")
                try:
                    sock, addr = self.sock.accept()
                except socket.timeout:
                    continue
                conn = _wrap(sock)
                welcome = self._handshake(conn, expected, halves, f"{addr[0]}:{addr[1]}")
                if welcome is None:
                    continue
                rank, kind = welcome
                halves.setdefault(rank, {})[kind] = conn
                peers[rank] = f"{addr[0]}:{addr[1]}"
        except BaseException:
            for parts in halves.values():
                for c in parts.values():
                    c.close()
            raise
        finally:
            self.sock.close()
        return {r: RemoteWorker(r, halves[r]["rpc"], halves[r]["death"], peers[r])
                for r in sorted(expected)}

    def _handshake(self, conn: Connection, expected: set[int],
                   halves: dict[int, dict[str, Connection]], peer: str
                   ) -> Optional[tuple[int, str]]:
        """Read a hello (JSON: nothing is unpickled from a connection before it); answer
        the reason it is refused, or none. A connection that is no vLLM worker is dropped
        (None); a worker started with other flags fails the start (it would only hang the
        group)."""
        try:
            hello = json.loads(conn.recv_bytes(1 << 16)) if conn.poll(10.0) else None
        except (OSError, EOFError, ValueError):
            hello = None
        if not isinstance(hello, dict) or hello.get("hello") != _HELLO:
            logger.warning("Dropped a connection from %s to the multi-node RPC port: not a "
                           "vLLM worker of this version.", peer)
            conn.close()
            return None
        error = None
        if hello["shape"] != self.shape:
            diff = {k: (self.shape.get(k), hello["shape"].get(k)) for k in self.shape
                    if self.shape.get(k) != hello["shape"].get(k)}
            error = ("started with other settings than the head: " + ", ".join(
                f"{k}={theirs!r} (head: {ours!r})" for k, (ours, theirs) in diff.items()))
        elif hello["rank"] not in expected or hello["kind"] in halves.get(hello["rank"], {}):
            error = (f"claims rank {hello['rank']}, which is not a remote rank still "
                     f"expected ({sorted(expected)}); check --node-rank")
        conn.send_bytes(json.dumps({"error": error}).encode())
        if error is not None:
            conn.close()
            raise RuntimeError(f"A remote worker was refused: {error}.")
        return hello["rank"], hello["kind"]


# ---------------------------------------------------------------- worker side
def connect_to_head(layout: NodeLayout, rank: int, shape: dict,
                    timeout_s: float = JOIN_TIMEOUT_S) -> tuple[Connection, Connection]:
    """(RPC connection, death connection) of remote worker `rank`, once the head
    listens (retried until `timeout_s`)."""
    return (_connect(layout, rank, shape, "rpc", timeout_s),
            _connect(layout, rank, shape, "death", timeout_s))


def _connect(layout: NodeLayout, rank: int, shape: dict, kind: str,
             timeout_s: float) -> Connection:
    host, port = layout.rpc_address
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5.0)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                raise TimeoutError(f"The head node at {host}:{port} (master_addr, "
                                   f"master_port + 1) did not accept a connection within "
                                   f"{timeout_s:.0f} s: {e}.") from e
            time.sleep(0.5)
    conn = _wrap(sock)
    conn.send_bytes(json.dumps({"hello": _HELLO, "rank": rank, "kind": kind,
                                "shape": shape}).encode())
    if not conn.poll(30.0):
        raise TimeoutError(f"The head at {host}:{port} did not answer rank {rank}'s hello.")
    error = json.loads(conn.recv_bytes())["error"]
    if error is not None:
        raise ValueError(f"The head at {host}:{port} refused rank {rank}: {error}.")
    return conn


def remote_worker_main(vllm_config: Any, rank: int, local_rank: int) -> None:
    """A headless node's worker process: connect to the head, then serve its RPCs as a
    local worker serves its pipe (multiproc_utils.worker_main)."""
    from vllm.executor.multiproc_utils import prefix_log_lines, worker_main
    prefix_log_lines(rank)
    layout = NodeLayout.of(vllm_config.parallel_config)
    try:
        conn, death = connect_to_head(layout, rank, engine_shape(vllm_config))
    except (OSError, ValueError) as e:
        logger.error("%s", e)
        os._exit(3)
    worker_main(vllm_config, rank, local_rank, layout.init_method, conn, death,
                engine_gone_code=HEAD_GONE_EXIT)


def run_headless(vllm_config: Any) -> int:
    """Run this node's workers until the head shuts them down (0) or one of them dies
    (the others are stopped; 1). SIGINT/SIGTERM stop them (0)."""
    from vllm.executor.multiproc_utils import describe_exit, get_mp_context, stop_processes
    layout = NodeLayout.of(vllm_config.parallel_config)
    if layout.node_rank == 0:
        raise ValueError("--headless runs the workers of a node other than the head: give "
                         "it --node-rank 1 or higher (node 0 serves the API).")
    ranks = layout.ranks()
    logger.info("Node %d of %d: starting workers of ranks %d-%d; they join the head at "
                "%s:%d (RPC) and torch.distributed at %s.", layout.node_rank, layout.nnodes,
                ranks[0], ranks[-1], *layout.rpc_address, layout.init_method)
    ctx = get_mp_context()
    procs = []
    for local_rank, rank in enumerate(ranks):
        proc = ctx.Process(target=remote_worker_main, name=f"VllmWorker-{rank}", daemon=True,
                           args=(vllm_config, rank, local_rank))
        proc.start()
        procs.append(proc)

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        pending = {p.sentinel: p for p in procs}
        while pending:
            for s in mp_connection.wait(list(pending)):
                proc = pending.pop(s)
                proc.join()
                if proc.exitcode == HEAD_GONE_EXIT:
                    logger.warning("The head at %s:%d closed its connections (it stopped "
                                   "or died); stopping this node's workers.",
                                   *layout.rpc_address)
                    return 0
                if proc.exitcode != 0:
                    logger.error("Worker %s (pid %s) exited (%s); stopping this node's "
                                 "workers.", proc.name, proc.pid, describe_exit(proc))
                    return 1
        logger.info("The head shut this node's workers down.")
        return 0
    except KeyboardInterrupt:
        logger.info("Stopping this node's workers.")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_processes(procs, grace_s=5.0)

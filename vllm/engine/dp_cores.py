"""Engine cores of their own, for several API servers or several nodes, and the head
node's registry where each of them reports its address.

Layout, with vLLM's flags:

    head:  vllm serve M -dp 4 -dpl 2 -dpa HEAD -dpp 29550 [--api-server-count N]
    other: vllm serve M -dp 4 -dpl 2 -dpa HEAD -dpp 29550 --headless -dpr 2

The head binds its registry at tcp://HEAD:29550. Every core (this node's processes, a
headless node's, or Ray tasks with `--data-parallel-backend ray`) initializes, binds a
socket of its own and registers its rank and address there (vllm/engine/core_server.py).
Once every rank has, the head starts its API servers, each of which connects to every
core. The registry's socket stays open while the head runs: a core whose head is gone
stops (it watches that connection).

What happens when a core dies, as in vLLM: its requests fail with an error, the API
servers report the engine dead (/health 503) and exit, and so does the head (exit
status 1); a supervisor restarts the deployment. A headless node whose cores exit
exits with them.
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import time
from typing import Any, Callable, Optional

import zmq

from vllm.engine import serial
from vllm.engine.serial import MessageDecoder, MessageEncoder

logger = logging.getLogger(__name__)

REGISTRATION_TIMEOUT_S = 1800.0
"""How long the head waits for every core to initialize and register (model loading,
HPU warmup and a second node's start are all inside it)."""


def rank_config(engine_args: Any, rank: int) -> Any:
    """The config of data-parallel rank `rank` (its own objects: each core's cache size
    is written into its config)."""
    config = engine_args.create_engine_config()
    config.parallel_config = dataclasses.replace(config.parallel_config,
                                                 data_parallel_rank=rank)
    return config


def head_address(parallel_config: Any) -> str:
    """--data-parallel-address, else loopback (every core is on this node)."""
    return parallel_config.data_parallel_address or "127.0.0.1"


def advertised_host(head: str) -> str:
    """The address this node's cores are reached at by the head's API servers: loopback
    when the head is this machine's loopback, else the address of the interface that
    routes to the head."""
    if head in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in head else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((head, 9))  # UDP: no packet is sent; the kernel picks the route
        return probe.getsockname()[0]


def registry_endpoint(parallel_config: Any) -> str:
    head = head_address(parallel_config)
    host = f"[{head}]" if ":" in head else head
    return f"tcp://{host}:{parallel_config.data_parallel_rpc_port}"


class CoreRegistry:
    """The head's end: collects each rank's registration, and tells the cores to stop."""

    def __init__(self, parallel_config: Any) -> None:
        self.endpoint = registry_endpoint(parallel_config)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        from vllm.engine.core_server import set_heartbeats
        set_heartbeats(self._sock)
        try:
            self._sock.bind(self.endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise OSError(f"Cannot bind the data-parallel registry at {self.endpoint}: "
                          f"{e}. Is another head running there? Choose another "
                          "--data-parallel-rpc-port.") from e
        self._decoder = MessageDecoder()
        self._encoder = MessageEncoder()
        self._cores: dict[int, bytes] = {}

    def wait_for(self, size: int, check: Callable[[], None],
                 timeout_s: float = REGISTRATION_TIMEOUT_S) -> list[str]:
        """Every rank's address, by rank. `check()` raises when a core this node
        started died; a core's start-up error is raised as itself."""
        addresses: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        while len(addresses) < size:
            check()
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(addresses))
                raise TimeoutError(f"Data-parallel ranks {missing} did not register at "
                                   f"{self.endpoint} within {timeout_s:.0f} s.")
            if not self._sock.poll(500):
                continue
            identity, data = self._sock.recv_multipart()
            kind, rank, *fields = self._decoder.decode(data)
            if kind == serial.FAILED:
                exc, tb = fields
                logger.debug("Data-parallel rank %d failed to start:\n%s", rank, tb)
                raise exc
            if rank in addresses:
                raise ValueError(f"Data-parallel rank {rank} registered twice (check "
                                 "--data-parallel-start-rank on each node).")
            addresses[rank] = fields[0]
            self._cores[rank] = identity
            logger.info("Data-parallel rank %d registered (%s, %d KV blocks).", rank,
                        fields[0], fields[1]["num_gpu_blocks"])
        return [addresses[r] for r in range(size)]

    def stop_cores(self) -> None:
        """Ask every registered core to stop (a headless node's too)."""
        for identity in self._cores.values():
            try:
                self._sock.send_multipart([identity, self._encoder.encode(serial.SHUTDOWN)],
                                          zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self) -> None:
        self._sock.close(linger=1000)
        self._ctx.term()


class LocalCores:
    """This node's cores: one process per rank (or Ray tasks with the ray backend)."""

    def __init__(self, engine_args: Any, ranks: range, registry_addr: str, host: str,
                 backend: str = "mp") -> None:
        self.ranks = ranks
        self.procs: list[Any] = []
        self._death_writers: list[Any] = []
        self._ray_refs: list[Any] = []
        self._started_ray = False
        if backend == "ray":
            self._start_ray(engine_args, registry_addr, host)
        else:
            self._start_processes(engine_args, registry_addr, host)

    def _start_processes(self, engine_args: Any, registry_addr: str, host: str) -> None:
        from vllm.engine.core_client import core_mp_context
        from vllm.engine.core_server import run_shared_engine_core
        ctx = core_mp_context()
        for rank in self.ranks:
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=run_shared_engine_core, name=f"EngineCore_DP{rank}",
                               daemon=False, kwargs=dict(
                                   vllm_config=rank_config(engine_args, rank),
                                   registry_addr=registry_addr, host=host,
                                   death_reader=reader))
            proc.start()
            reader.close()
            self.procs.append(proc)
            self._death_writers.append(writer)

    def _start_ray(self, engine_args: Any, registry_addr: str, host: str) -> None:
        """One Ray task per rank, placed by Ray wherever the cluster has room (a core
        on another node registers with that node's address)."""
        import signal

        import ray
        handler = signal.getsignal(signal.SIGTERM)
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, log_to_driver=True)
            self._started_ray = True
        signal.signal(signal.SIGTERM, handler)  # Ray's own would crash the head
        task = ray.remote(num_cpus=0, max_retries=0)(_ray_core_main)
        for rank in self.ranks:
            self._ray_refs.append(task.remote(rank_config(engine_args, rank),
                                              registry_addr))

    def check(self) -> None:
        """Raise when one of them exited (they run until the head stops them)."""
        for rank, proc in zip(self.ranks, self.procs):
            if not proc.is_alive():
                from vllm.executor.multiproc_utils import describe_exit
                raise RuntimeError(f"Engine core of data-parallel rank {rank} exited "
                                   f"({describe_exit(proc)}); its log is above.")
        if self._ray_refs:
            import ray
            done, _ = ray.wait(self._ray_refs, timeout=0)
            if done:
                ray.get(done)  # its error, if it failed
                raise RuntimeError("A Ray engine core exited.")

    @property
    def sentinels(self) -> list[Any]:
        return [p.sentinel for p in self.procs]

    def stop(self, grace_s: float = 30.0) -> None:
        """After the registry asked them to stop: wait, then make sure."""
        from vllm.executor.multiproc_utils import stop_processes
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for writer in self._death_writers:
            writer.close()
        stop_processes([p for p in self.procs if p.is_alive()], grace_s=5.0)
        if self._ray_refs:
            import ray
            for ref in self._ray_refs:
                ray.cancel(ref, force=True)
            if self._started_ray:
                ray.shutdown()


def _ray_core_main(vllm_config: Any, registry_addr: str) -> None:
    """A Ray task running one served engine core until its head stops it."""
    from vllm.engine.core_server import run_shared_engine_core
    head = registry_addr.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    run_shared_engine_core(vllm_config, registry_addr, advertised_host(head))


def wait_any(sentinels: list[Any], timeout: Optional[float]) -> list[Any]:
    from multiprocessing.connection import wait
    return wait(sentinels, timeout)

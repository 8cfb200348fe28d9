"""`vllm serve` past one process: several API servers, data parallel over nodes.

Used when a deployment needs engine cores of their own (vllm/engine/dp_cores.py):
`--api-server-count N` (N > 1), `--data-parallel-size-local` below
`--data-parallel-size` (other nodes run the rest), `--data-parallel-backend ray`, and
`--headless` (a node that runs engine cores only). Otherwise `vllm serve` keeps its
one-process path (vllm/entrypoints/openai/api_server.py).

The head process: checks the flags, binds the API port, starts this node's cores and
waits until every rank registered, then starts the API servers (spawned processes, each
a whole OpenAI server: its own tokenizer, detokenizer and streams, its engine talking to
every core). They share the one listening socket: the kernel hands each connection to
one of them. Metrics: prometheus_client's multiprocess mode (vllm/metrics/
multiprocess.py), so any API server's /metrics counts every request once.

Lifetime: SIGINT/SIGTERM stops the API servers (graceful, as one server), then the
cores. When any API server or local core exits on its own, the rest are stopped and the
head exits with status 1 (a core's death first fails its requests with an error and
makes the API servers report the engine dead, as vLLM does).
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
import socket
import sys
from typing import Any, Optional

logger = logging.getLogger(__name__)

API_SERVER_STOP_S = 60.0
"""How long stopping waits for the API servers (their --shutdown-timeout comes first)."""


def run_multi_server(args: argparse.Namespace) -> None:
    """Run the deployment and exit with its status when it needs cores of its own;
    otherwise return (the one-process server follows)."""
    from vllm.entrypoints.openai.cli_args import needs_own_cores
    if not needs_own_cores(args):
        return
    from vllm.entrypoints.openai.api_server import _apply_log_level
    _apply_log_level(args)
    try:
        code = run_headless(args) if getattr(args, "headless", False) else run_head(args)
    except (ValueError, OSError, TimeoutError, RuntimeError) as e:
        logger.error("%s", e)
        code = 1
    sys.exit(code)


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_head(args: argparse.Namespace) -> int:
    """The head node: cores, then API servers; the exit status."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_cores import (CoreRegistry, LocalCores, advertised_host,
                                      head_address)
    from vllm.entrypoints.openai.api_server import create_server_socket
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    from vllm.metrics import multiprocess
    validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    pc = engine_args.create_engine_config().parallel_config  # bad flags fail here
    count = args.api_server_count or 1
    metrics_dir = multiprocess.setup_dir() if count > 1 else None
    signal.signal(signal.SIGTERM, _raise_interrupt)
    sock = create_server_socket(args.host, args.port)
    registry = CoreRegistry(pc)
    cores: Optional[LocalCores] = None
    servers: list[Any] = []
    try:
        head = head_address(pc)
        ranks = range(pc.data_parallel_size) if pc.data_parallel_backend == "ray" \
            else range(pc.data_parallel_local_size)
        cores = LocalCores(engine_args, ranks, registry.endpoint, advertised_host(head),
                           backend=pc.data_parallel_backend)
        logger.info("Waiting for %d data-parallel engine cores (%d on this node) to "
                    "register at %s.", pc.data_parallel_size, len(ranks), registry.endpoint)
        addresses = registry.wait_for(pc.data_parallel_size, cores.check)
        servers = _start_api_servers(args, sock, addresses, count)
        return _supervise(servers, cores)
    except KeyboardInterrupt:
        logger.info("Stopping the API servers and engine cores.")
        return 0
    finally:
        _stop_api_servers(servers)
        registry.stop_cores()
        if cores is not None:
            cores.stop()
        registry.close()
        sock.close()
        multiprocess.remove_dir(metrics_dir)


def run_headless(args: argparse.Namespace) -> int:
    """A node without API server: its cores register with the head and run until the
    head stops them or goes away."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_cores import LocalCores, advertised_host, head_address, \
        registry_endpoint
    engine_args = AsyncEngineArgs.from_cli_args(args)
    pc = engine_args.create_engine_config().parallel_config
    if pc.data_parallel_address is None:
        raise ValueError("--headless needs --data-parallel-address (the head node's).")
    if pc.data_parallel_backend == "ray":
        raise ValueError("--headless with --data-parallel-backend ray: Ray places every "
                         "core from the head node; start no headless node.")
    start = pc.data_parallel_start_rank
    ranks = range(start, start + pc.data_parallel_local_size)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    cores = LocalCores(engine_args, ranks, registry_endpoint(pc),
                       advertised_host(head_address(pc)))
    logger.info("Headless node: data-parallel ranks %d-%d, registering at %s.", ranks[0],
                ranks[-1], registry_endpoint(pc))
    from vllm.engine.dp_cores import wait_any
    try:
        wait_any(cores.sentinels, None)
        logger.info("An engine core exited; stopping this node.")
    except KeyboardInterrupt:
        return 0
    finally:
        cores.stop(grace_s=5.0)
    # 0 when the head stopped them (or went away), else a core failed.
    return 0 if all(p.exitcode == 0 for p in cores.procs) else 1


# ------------------------------------------------------------------ API servers
def _start_api_servers(args: argparse.Namespace, sock: socket.socket,
                       addresses: list[str], count: int) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: multiprocess metrics
    servers = []
    for index in range(count):
        proc = ctx.Process(target=api_server_main, name=f"ApiServer_{index}",
                           args=(args, sock, addresses, index), daemon=False)
        proc.start()
        servers.append(proc)
    logger.info("Started %d API server process(es) serving %d engine core(s).", count,
                len(addresses))
    return servers


def api_server_main(args: argparse.Namespace, sock: socket.socket, addresses: list[str],
                    index: int) -> None:
    """One API server process: an OpenAI server whose engine uses the shared cores."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import build_remote_engine
    from vllm.entrypoints.openai.api_server import _apply_log_level, serve_engine
    from vllm.executor.multiproc_utils import prefix_log_lines
    prefix_log_lines(None, kind=f"ApiServer_{index}")
    _apply_log_level(args)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    engine_died = False
    try:
        engine = build_remote_engine(AsyncEngineArgs.from_cli_args(args), addresses,
                                     max_log_len=args.max_log_len)
        engine_died = serve_engine(args, sock, engine)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    sys.exit(1 if engine_died else 0)


def _supervise(servers: list[Any], cores: Any) -> int:
    """Wait until an API server or a local core exits: 1 (the rest are stopped). With
    VLLM_KEEP_ALIVE_ON_ENGINE_DEATH a core's exit stops nothing: the API servers stay
    up answering 503, as one server does, until one of them exits."""
    from vllm import envs
    from vllm.engine.dp_cores import wait_any
    from vllm.executor.multiproc_utils import describe_exit
    watched = servers + cores.procs
    while True:
        ready = wait_any([p.sentinel for p in watched], None)
        for proc in [p for p in watched if p.sentinel in ready]:
            proc.join(1.0)
            watched.remove(proc)
            if proc in servers or not envs.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH:
                logger.error("%s exited (%s): stopping the deployment.", proc.name,
                             describe_exit(proc))
                return 1
            logger.error("%s exited (%s); VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps the API "
                         "servers up (answering 503).", proc.name, describe_exit(proc))


def _stop_api_servers(servers: list[Any]) -> None:
    from vllm.executor.multiproc_utils import stop_processes
    from vllm.metrics import multiprocess
    for proc in servers:
        if proc.is_alive():
            proc.terminate()  # SIGTERM: each shuts down as one server does
    for proc in servers:
        proc.join(API_SERVER_STOP_S)
    stop_processes([p for p in servers if p.is_alive()], grace_s=5.0)
    if multiprocess.enabled():
        for proc in servers:
            multiprocess.mark_process_dead(proc.pid)

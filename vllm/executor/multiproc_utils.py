"""Worker processes of the multiprocess executor: the process side and its plumbing.

Each rank runs `worker_main` in its own process, started as VLLM_WORKER_MULTIPROC_METHOD
says (see `get_mp_context`): fork by default, as vLLM, since it needs no re-import of the
user's main module (a script read from standard input cannot be re-imported); spawn when
fork is unsafe because an accelerator runtime (CUDA, HPU) or Ray already runs in this
process, whose threads and device handles a fork would copy half-way. The engine talks to
a worker over one duplex pipe:

- engine -> worker: a pickled `RpcRequest`, pickled once per call and written to
  every worker's pipe (the cheapest broadcast measured for SchedulerOutputs of a few
  hundred requests: tens of microseconds per step, ~50x less than a gloo
  `broadcast_object_list`);
- worker -> engine: an `RpcReply` when the request names this rank as the replier
  (or names none), and always when the call failed.

A second, one-way "death pipe" is held open by the engine only: when the engine
process dies, however abruptly, the worker reads EOF on it and exits, so no worker
outlives its engine.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Optional, Sequence

from vllm.executor.distributed_executor import method_name, unwire_method
from vllm.executor.executor_base import run_worker_method

logger = logging.getLogger(__name__)

SHUTDOWN_METHOD = "shutdown"
"""The RPC after which a worker leaves its loop and its process exits."""


@dataclass
class RpcRequest:
    method: Any
    """A worker method's name, or a function pickled by value (see `wire_method`)."""
    args: tuple
    unique_reply_rank: Optional[int] = None
    """Only this rank answers a successful call; None: every rank answers."""
    seq: int = 0
    """Call number, echoed in the reply: a reply to a call the engine stopped waiting for
    (interrupted by Ctrl-C) is recognized and dropped instead of answering the next call."""
    kwargs: Optional[dict] = None


@dataclass
class WorkerFailure:
    """Why a call failed on one rank, in a form that always pickles."""
    rank: int
    method: str
    exc_type: str
    message: str
    traceback: str
    exception: Optional[BaseException] = None
    """The exception itself when it could be pickled (lets a ValueError stay one)."""

    def describe(self) -> str:
        return (f"Worker rank {self.rank} failed in {self.method}: {self.exc_type}: "
                f"{self.message}\n--- worker traceback ---\n{self.traceback}")


@dataclass
class RpcReply:
    rank: int
    result: Any = None
    failure: Optional[WorkerFailure] = None
    seq: int = 0


# ------------------------------------------------------------ engine side
MP_METHODS = ("fork", "spawn")

_engine_side_connections: "weakref.WeakSet[Connection]" = weakref.WeakSet()
"""The engine's ends of every worker's pipes. A forked child must not keep them open: a
worker that held another worker's death pipe would keep it from seeing the engine die."""


def _close_engine_side_connections() -> None:
    for conn in list(_engine_side_connections):
        try:
            conn.close()
        except OSError:
            pass
    _engine_side_connections.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_engine_side_connections)


def register_engine_side(*conns: Connection) -> None:
    """Record pipe ends that only the engine process may hold (closed in forked children)."""
    _engine_side_connections.update(conns)


def fork_unsafe_reason() -> Optional[str]:
    """Why forking this process would break the workers, or None when fork is safe."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return "fork is not available on this system"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialized in this process"
    if "habana_frameworks.torch" in sys.modules:
        # Loading the Gaudi bridge already starts its runtime threads (see HPU.md).
        return "the HPU runtime (habana_frameworks.torch) is loaded in this process"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return "Ray was initialized in this process"
    return None


def resolve_mp_method() -> str:
    """VLLM_WORKER_MULTIPROC_METHOD, with fork turned into spawn where fork is unsafe."""
    from vllm import envs
    method = envs.VLLM_WORKER_MULTIPROC_METHOD.strip().lower()
    if method not in MP_METHODS:
        raise ValueError(f"VLLM_WORKER_MULTIPROC_METHOD={method!r}; choose fork or spawn.")
    if method == "fork":
        reason = fork_unsafe_reason()
        if reason is not None:
            logger.warning("Starting the workers with spawn instead of fork: %s. Run the "
                           "engine in a script guarded by `if __name__ == \"__main__\":`.",
                           reason)
            method = "spawn"
    if method == "spawn":
        check_main_reimportable()
    return method


def check_main_reimportable() -> None:
    """Raise a clear error when spawned workers could not re-import `__main__`.

    Spawn starts a fresh interpreter that re-runs the parent's main module from its path
    (or module name). A script read from standard input (`python - <<EOF`, a heredoc) has
    the path `<stdin>`, which does not exist: every worker would die on start.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return  # `python -m module`: re-imported by name
    path = getattr(main, "__file__", None)
    if path is None or os.path.exists(path):
        return  # interactive (nothing to re-import) or a real file
    raise RuntimeError(
        f"The worker processes are started with spawn, which re-imports the main module, "
        f"but it was read from {path!r}, not from a file. Save the script to a file and "
        f"run that, or start the workers with fork (VLLM_WORKER_MULTIPROC_METHOD=fork, "
        f"possible before CUDA/HPU is initialized in this process).")


def get_mp_context() -> Any:
    return multiprocessing.get_context(resolve_mp_method())


def get_loopback_ip() -> str:
    """Address the ranks of one node rendezvous on (VLLM_HOST_IP, else loopback)."""
    from vllm import envs
    return envs.VLLM_HOST_IP or "127.0.0.1"


def get_open_port() -> int:
    """A free TCP port: from VLLM_PORT upwards when set, else one the OS picks."""
    from vllm import envs
    base = envs.VLLM_PORT
    if base is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]
    for port in range(base, min(base + 1000, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"No free port in [{base}, {base + 1000}) (VLLM_PORT={base}).")


def distributed_init_method(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}:{port}"


def stop_processes(procs: Sequence[BaseProcess], grace_s: float = 5.0) -> None:
    """Wait up to `grace_s` for processes to exit, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + 2.0
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            logger.warning("Worker process %s (pid %s) ignored SIGTERM; killing it.", p.name,
                           p.pid)
            p.kill()
            p.join(2.0)


_PF_EXITING = 0x4
"""The kernel's task flag for a process in its exit (linux/sched.h)."""
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def exiting_status(pid: int) -> Optional[int]:
    """The wait status (as waitpid words it) of a process that is exiting but not yet
    reaped; None while it is not exiting, or where /proc cannot tell.

    A killed process can be reaped only once the kernel has torn it down (ended its
    threads, freed its memory: a fraction of a second for a few GiB), and until then
    waitpid and `is_alive()` call it alive. /proc/<pid>/stat tells at once: a SIGKILL is
    pending from the moment kill() returns, then the flags carry PF_EXITING (and the
    exit_code field the status), then the state is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # fields[i] is field i + 3 of proc(5)
    try:
        state, flags, pending = fields[0], int(fields[6]), int(fields[28])
        exit_code = int(fields[49]) if len(fields) > 49 else 0
    except (IndexError, ValueError):
        return None
    if exit_code:
        return exit_code
    if pending & _SIGKILL_BIT:
        return int(signal.SIGKILL)
    if state in (b"Z", b"X") or flags & _PF_EXITING:
        return 0
    return None


def describe_exit(proc: BaseProcess) -> str:
    """'exit code 3' / 'killed by SIGKILL' / 'still running' for a worker process (also
    one being torn down, not yet reaped: see `exiting_status`)."""
    code = proc.exitcode
    if code is None and proc.pid is not None:
        status = exiting_status(proc.pid)
        if status is not None:
            code = -(status & 0x7F) if status & 0x7F else status >> 8
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ------------------------------------------------------------ worker side
def worker_main(vllm_config: Any, rank: int, local_rank: int, init_method: str,
                conn: Connection, death_reader: Connection, engine_gone_code: int = 1) -> None:
    """Entry point of a worker process: build the worker, then serve RPCs until shutdown
    (the process exits with `engine_gone_code` when the engine goes away first)."""
    # Ctrl-C reaches the whole process group; the engine decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_when_parent_dies(death_reader, engine_gone_code)
    prefix_log_lines(rank)
    try:
        worker = create_worker(vllm_config, rank, local_rank, init_method)
    except BaseException as exc:  # noqa: BLE001 - reported to the engine, which raises
        _send(conn, RpcReply(rank, failure=make_failure(rank, "init", exc)))
        return
    _send(conn, RpcReply(rank, result=os.getpid()))
    try:
        run_rpc_loop(worker, rank, conn)
    finally:
        leave_process_groups()
    # Skip interpreter teardown (seconds with torch loaded): nothing is left to clean up,
    # and the engine waits for this exit during its shutdown.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - closed or broken stream: nothing to flush
            pass
    os._exit(0)


def create_worker(vllm_config: Any, rank: int, local_rank: int, init_method: str) -> Any:
    """The platform's worker for one rank, with its device, process groups and model ready."""
    from vllm.executor.executor_base import resolve_worker_cls
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    worker = resolve_worker_cls()(vllm_config, local_rank=local_rank, rank=rank,
                                  distributed_init_method=init_method)
    worker.init_device()
    worker.load_model()
    return worker


def run_rpc_loop(worker: Any, rank: int, conn: Connection) -> None:
    """Serve `RpcRequest`s on `conn` until the shutdown RPC or until the engine is gone."""
    while True:
        try:
            request: RpcRequest = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the engine closed the pipe: nothing more will come
        name = method_name(request.method)
        try:
            method = unwire_method(request.method)
            name = method_name(method)
            result = run_worker_method(worker, method, request.args, request.kwargs)
            reply = None
            if request.unique_reply_rank is None or request.unique_reply_rank == rank:
                reply = RpcReply(rank, result=result, seq=request.seq)
        except BaseException as exc:  # noqa: BLE001 - the engine decides what a failure means
            reply = RpcReply(rank, failure=make_failure(rank, name, exc), seq=request.seq)
        if reply is not None and not _send(conn, reply):
            return
        if request.method == SHUTDOWN_METHOD:
            return


def make_failure(rank: int, method: str, exc: BaseException) -> WorkerFailure:
    try:
        pickle.dumps(exc)
        kept: Optional[BaseException] = exc
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as text only
        kept = None
    return WorkerFailure(rank=rank, method=method, exc_type=type(exc).__name__,
                         message=str(exc), traceback=traceback.format_exc(), exception=kept)


def _send(conn: Connection, reply: RpcReply) -> bool:
    """Send a reply; False when the engine is gone (then the worker just exits)."""
    try:
        conn.send(reply)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
        return False
    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result: say so instead
        failure = make_failure(reply.rank, "reply", exc)
        try:
            conn.send(RpcReply(reply.rank, failure=failure, seq=reply.seq))
        except Exception:  # noqa: BLE001 - nothing else can be done from here
            return False
        return True


def exit_when_parent_dies(death_reader: Connection, code: int = 1) -> None:
    def watch() -> None:
        try:
            death_reader.recv_bytes()
        except (EOFError, OSError):
            pass
        # The engine is gone (or asked for an immediate exit): nobody will send work again,
        # and peers may be blocked in collectives with us, so do not wait for cleanups.
        os._exit(code)

    threading.Thread(target=watch, name="vllm-parent-watch", daemon=True).start()


def prefix_log_lines(rank: Optional[int], kind: str = "VllmWorker") -> None:
    """Prefix this process's vllm log lines with its rank, as vLLM's workers do."""
    rank_part = "" if rank is None else f" rank={rank}"
    prefix = f"({kind}{rank_part} pid={os.getpid()}) "
    for handler in logging.getLogger("vllm").handlers:
        old = handler.formatter
        fmt = getattr(old, "_fmt", None) or "%(message)s"
        if fmt.startswith(prefix):
            continue  # prefixed already (an early engine core logs before it runs)
        handler.setFormatter(logging.Formatter(prefix + fmt,
                                               datefmt=getattr(old, "datefmt", None)))


def leave_process_groups() -> None:
    """Destroy this process's TP/PP groups before exiting (quiet, and frees the ports)."""
    try:
        from vllm.distributed import destroy_distributed_environment
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001 - exiting anyway; peers may already be gone
        logger.debug("Leaving the process groups failed.", exc_info=True)

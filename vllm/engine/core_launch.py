"""Starting the engine-core process: fork where it is safe, and as early as possible.

Why fork: spawn starts a fresh interpreter that imports torch, transformers and vLLM
again (4-5 s of a server's start on a small machine) and re-imports the main module. A
forked child starts with everything its parent imported.

When fork is safe: fork copies only the calling thread. A process whose OpenMP pool
(torch's first parallel op), tokenizer pool, ZMQ I/O threads or any helper thread
already runs would hand the child locks held by threads that do not exist there (the
child's first multi-threaded torch op hangs). So, unless VLLM_WORKER_MULTIPROC_METHOD
is set, the core is forked only while this process has no thread but the main one
(read from /proc/self/task, which counts native threads too), OpenBLAS's pool aside
(numpy starts it at import; OpenBLAS's own fork handler stops and restarts it), and no
accelerator runtime or Ray is loaded (`fork_unsafe_reason`); otherwise it is spawned,
as before. Set explicitly, the variable is honoured (fork still falls back to spawn
where CUDA/HPU/Ray run, as for the TP workers).

Why early: the server builds its config first (a platform's construction imports no
kernels and starts no thread, so building the config leaves the process safe to fork),
then forks the core with it before importing its web stack (`prestart`, from
vllm/entrypoints/openai/core_prestart.py or `run_server`: one thread, nothing bound
yet, not even the listening socket). The core initializes at once (weights, packing,
KV cache) while the server imports FastAPI, loads its tokenizer and builds its engine
from the very same config object (`config_for`), then waits on a pipe for the
addresses `MPEngineCoreClient` sends it. That pipe is also the core's death pipe: EOF
before the addresses (the server failed while starting) or after them (the server
died) ends the child.
"""
from __future__ import annotations

import copy
import ctypes
import logging
import multiprocessing
import os
import signal
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Optional

logger = logging.getLogger(__name__)

def thread_count() -> Optional[int]:
    """This process's OS threads (native ones included); None where /proc is missing."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _openblas_pool_threads() -> int:
    """Threads of the OpenBLAS pools loaded here (numpy's starts one at import, with
    `get_num_threads() - 1` workers). Safe to fork: OpenBLAS stops its pool before a
    fork and starts it again when needed (its own pthread_atfork handler)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {fields[-1] for fields in map(str.split, f)
                     if len(fields) == 6 and ".so" in fields[-1]
                     and "openblas" in os.path.basename(fields[-1]).lower()}
    except OSError:
        return 0
    pool = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _OPENBLAS_GET_THREADS:
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                pool += max(0, fn() - 1)
                break
    return pool


_OPENBLAS_GET_THREADS = ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads")


def other_threads() -> Optional[int]:
    """Threads besides the main one that a fork would leave half-way (an OpenMP pool, a
    tokenizer or ZMQ pool, a helper thread): all but the OpenBLAS pools'. None where
    this cannot be read (no /proc)."""
    total = thread_count()
    if total is None:
        return None
    return max(0, total - 1 - _openblas_pool_threads())


def start_method() -> str:
    """'fork' or 'spawn' for the engine-core process (see the module docstring)."""
    from vllm.executor.multiproc_utils import (check_main_reimportable, fork_unsafe_reason,
                                               resolve_mp_method)
    from vllm import envs
    asked = envs.is_set("VLLM_WORKER_MULTIPROC_METHOD")
    if asked and envs.VLLM_WORKER_MULTIPROC_METHOD.strip():
        method = resolve_mp_method()  # validates it; fork -> spawn where fork is unsafe
        others = other_threads()
        if method == "fork" and others != 0:
            logger.warning("VLLM_WORKER_MULTIPROC_METHOD=fork: forking the engine core from "
                           "a process with %s other threads; a child of a process whose "
                           "OpenMP pool already runs can hang on its first multi-threaded "
                           "op.", others if others is not None else "maybe")
        return method
    if fork_unsafe_reason() is None and other_threads() == 0:
        return "fork"
    try:
        check_main_reimportable()
    except RuntimeError:
        logger.warning("The main module was read from stdin: starting the engine core with "
                       "fork, which hangs if this process already ran torch on several "
                       "threads. Save the script to a file to avoid it.")
        return "fork"
    return "spawn"


def mp_context(method: str) -> Any:
    return multiprocessing.get_context(method)


# ------------------------------------------------------------------ early start
@dataclass
class PrestartedCore:
    """A forked engine-core process initializing from `config`."""
    proc: BaseProcess
    conn: Connection
    """This end of the launch pipe: the addresses are sent on it, then it is the death
    pipe (closing it ends the child)."""
    config: Any
    """The config the core was forked with: the frontend's engine must run this very
    object (`config_for`, then `take`)."""
    engine_args: Any
    """A copy of the arguments it was built from."""


_prestarted: Optional[PrestartedCore] = None


def prestart(engine_args: Any) -> bool:
    """Build the config from `engine_args`, then fork an engine-core process that
    initializes from it now, when fork is the method and safe; True if one was started.
    The engine this process then builds from equal arguments runs that config
    (`config_for`) and takes the core (`take`). A config that fails to build starts
    nothing (the engine builds it again and reports the error)."""
    global _prestarted
    if _prestarted is not None:
        return True
    if start_method() != "fork":
        return False
    snapshot = copy.deepcopy(engine_args)
    try:
        config = copy.deepcopy(engine_args).create_engine_config()
    except Exception:  # noqa: BLE001 - the engine builds it again and reports its error
        logger.debug("Building the engine config before the fork failed.", exc_info=True)
        return False
    if start_method() != "fork":
        return False  # building it started a thread: spawn later, as without an early core
    from vllm.executor.multiproc_utils import register_engine_side
    ctx = mp_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    register_engine_side(writer)  # closed in every forked child: the core sees EOF
    # Not a daemon: the core starts worker processes of its own (TP/PP).
    proc = ctx.Process(target=_initialize_then_serve, args=(reader, config),
                       name="EngineCore", daemon=False)
    proc.start()
    reader.close()
    _prestarted = PrestartedCore(proc, writer, config, snapshot)
    weakref.finalize(proc, _abandon, proc, writer)
    logger.debug("Engine core process forked early (pid %d).", proc.pid)
    return True


def config_for(engine_args: Any) -> Optional[Any]:
    """The early core's config for an engine built from `engine_args`: when they equal
    the ones it was built from (a server's), or build an equal config (`LLM(...)` fills
    in arguments of its own); the engine then runs that object and takes the core.
    None otherwise, after releasing the early core."""
    found = _prestarted
    if found is None:
        return None
    if found.engine_args == engine_args:
        return found.config
    config = engine_args.create_engine_config()
    if config == found.config:
        return found.config
    logger.warning("The engine's config differs from the one its core was forked with; "
                   "starting another core.")
    release()
    return config


def take(vllm_config: Any) -> Optional[PrestartedCore]:
    """The early core, once, for the engine that runs its config (None when there is
    none, it exited, or the engine runs another config: that core is released)."""
    global _prestarted
    found, _prestarted = _prestarted, None
    if found is None:
        return None
    if found.config is not vllm_config or not found.proc.is_alive():
        _abandon(found.proc, found.conn)
        return None
    return found


def release() -> None:
    """Let an early core that no engine took exit now (EOF on its pipe) instead of
    idling until this process exits."""
    global _prestarted
    found, _prestarted = _prestarted, None
    if found is not None:
        _abandon(found.proc, found.conn)


def _abandon(proc: BaseProcess, conn: Connection) -> None:
    """Never taken (the server failed before its engine, or the engine runs another
    config): EOF lets a child waiting for its addresses exit; one still initializing is
    stopped."""
    try:
        conn.close()
    except OSError:
        pass
    proc.join(0.5)
    if proc.is_alive():
        proc.terminate()
        proc.join(5.0)


def _initialize_then_serve(conn: Connection, vllm_config: Any) -> None:
    """The early core: initialize from `vllm_config`, then serve once the frontend sends
    its sockets' addresses. An initialization that fails is left to `run_engine_core`,
    which repeats it and reports the error to the frontend."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from vllm.executor.multiproc_utils import prefix_log_lines
    prefix_log_lines(None, kind="EngineCore")
    core = None
    try:
        from vllm.engine.core import EngineCore
        core = EngineCore(vllm_config)
    except Exception:  # noqa: BLE001 - repeated below, where the frontend hears of it
        logger.debug("Initializing the early engine core failed.", exc_info=True)
    try:
        kwargs = conn.recv()
    except (EOFError, OSError):
        os._exit(0)  # the server stopped before it built its engine
    from vllm.engine.core_proc import run_engine_core
    run_engine_core(death_reader=conn, vllm_config=vllm_config, core=core, **kwargs)


def launch(early: PrestartedCore, input_addr: str, output_addr: str) -> None:
    """Send the early core the addresses of the frontend's sockets."""
    early.conn.send(dict(input_addr=input_addr, output_addr=output_addr))

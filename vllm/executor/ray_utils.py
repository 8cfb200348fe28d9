"""Ray plumbing of the Ray executor: the cluster, the placement group, the worker actor.

Ray is optional (`pip install ray`); it is imported only when the ray backend is
chosen, and a missing install is a ValueError naming the flag.

Each rank reserves one unit of its device's Ray resource (`GPU`, `HPU`, else `CPU`).
Ray counts a node's Gaudi cards as `HPU` only where `habana_frameworks` imports in the
environment that runs `ray start`; a node started elsewhere (or the fake HPU) offers
none unless it declares them (`ray start --resources='{"HPU": 8}'`). A cluster that
lacks them is reported at once, node by node, with that remedy, instead of a bare
timeout; a single-node cluster started here for the fake HPU declares one per rank.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Iterator, Optional

from vllm import envs

logger = logging.getLogger(__name__)

PLACEMENT_GROUP_TIMEOUT_S = 120.0
"""How long to wait for the cluster to grant one bundle per rank."""
LOCAL_OBJECT_STORE_BYTES = 256 << 20
"""Object store of a cluster started here: only SchedulerOutputs travel through it."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ValueError("distributed_executor_backend='ray' needs Ray: `pip install ray` "
                         f"(import failed: {e}).") from e
    return ray


def ray_device_key(device_type: str) -> str:
    """The Ray resource one rank reserves: a GPU, an HPU, or a CPU."""
    return {"cuda": "GPU", "hpu": "HPU"}.get(device_type, "CPU")


class _RayConnection:
    """Who uses the Ray connection this process opened (data-parallel replicas share it)."""
    lock = threading.Lock()
    users = 0
    owned = False
    keeper_release: Optional[threading.Event] = None


def acquire_ray_cluster(num_ranks: int, device_key: str = "CPU") -> None:
    """Connect to the cluster at RAY_ADDRESS, or start a single-node one on loopback.

    `num_ranks` (all ranks of all replicas on this machine) sizes a local cluster's
    CPUs (and the fake HPU's devices: `device_key` is the resource a rank reserves).
    A connection opened here is closed by the last `release_ray_cluster()`, which also
    stops a cluster started here; one the application opened is left alone.
    """
    ray = import_ray()
    with _RayConnection.lock:
        if not ray.is_initialized():
            _RayConnection.keeper_release = _connect_from_long_lived_thread(
                ray, num_ranks, device_key)
            _RayConnection.owned = True
        _RayConnection.users += 1


def release_ray_cluster() -> None:
    ray = import_ray()
    with _RayConnection.lock:
        _RayConnection.users = max(0, _RayConnection.users - 1)
        if _RayConnection.users == 0 and _RayConnection.owned:
            _RayConnection.owned = False
            if ray.is_initialized():
                ray.shutdown()
            if _RayConnection.keeper_release is not None:
                _RayConnection.keeper_release.set()
                _RayConnection.keeper_release = None


def _connect_from_long_lived_thread(ray: Any, num_ranks: int,
                                    device_key: str) -> Optional[threading.Event]:
    """Connect from the main thread, or from a thread that lives until release.

    Ray ties the processes of a cluster it starts (GCS, raylet) to the *thread* that
    started them (PR_SET_PDEATHSIG): started from a short-lived thread, e.g. one
    building a data-parallel replica, the cluster would die with that thread.
    Returns the event that lets the keeper thread end (None on the main thread).
    """
    if threading.current_thread() is threading.main_thread():
        _connect(ray, num_ranks, device_key)
        return None
    connected = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def keep() -> None:
        try:
            _connect(ray, num_ranks, device_key)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)
            return
        finally:
            connected.set()
        release.wait()

    threading.Thread(target=keep, name="vllm-ray-keeper", daemon=True).start()
    connected.wait()
    if errors:
        raise errors[0]
    return release


def _connect(ray: Any, num_ranks: int, device_key: str) -> None:
    address = envs.RAY_ADDRESS
    if address:
        logger.info("Connecting to the Ray cluster at %s.", address)
        ray.init(address=address, configure_logging=False)
        return
    num_cpus = max(num_ranks, os.cpu_count() or 1)
    resources = local_device_resources(device_key, num_ranks)
    logger.info("Starting a local Ray cluster (%d CPUs%s, loopback only).", num_cpus,
                "".join(f", {n:g} {k}" for k, n in resources.items()))
    with _loopback_only(ray):
        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                 resources=resources or None, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 configure_logging=False)


def local_device_resources(device_key: str, num_ranks: int) -> dict[str, float]:
    """Custom resources of a single-node cluster started here: the fake HPU's devices
    (one per rank), which Ray cannot count; real devices Ray detects by itself."""
    if device_key == "HPU" and envs.VLLM_USE_FAKE_HPU:
        return {"HPU": float(num_ranks)}
    return {}


@contextlib.contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """Make a local cluster bind to 127.0.0.1 instead of the machine's network address.

    Ray resolves "127.0.0.1" to the routable address on Linux unless multi-node
    clusters are switched off; that switch is an environment variable the Ray
    processes started here inherit (and a module constant for this process).
    """
    var = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    old_env = os.environ.get(var)
    os.environ[var] = "0"
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    old_const = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if constants is not None and old_const is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old_env
        if constants is not None and old_const is not None:
            constants.ENABLE_RAY_CLUSTER = old_const


def create_placement_group(world_size: int, device_key: str) -> Any:
    """One bundle per rank, packed onto as few nodes as possible; waits until granted."""
    ray = import_ray()
    from ray.util.placement_group import placement_group
    bundles = [{device_key: 1.0} for _ in range(world_size)]
    short = _device_shortage(ray, world_size, device_key)
    if short:
        # Not refused yet (vLLM waits too: an autoscaler may still add nodes).
        logger.warning("%s Waiting up to %.0f s for the cluster to grow.", short,
                       PLACEMENT_GROUP_TIMEOUT_S)
    pg = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_GROUP_TIMEOUT_S)
    if not ready:
        from ray.util.placement_group import remove_placement_group
        remove_placement_group(pg)
        raise ValueError(
            f"The Ray cluster cannot place {world_size} workers (one {device_key} each) "
            f"within {PLACEMENT_GROUP_TIMEOUT_S:.0f} s; available resources: "
            f"{ray.available_resources()}. "
            + (_device_shortage(ray, world_size, device_key) or
               "Lower tensor_parallel_size x pipeline_parallel_size or add nodes."))
    return pg


_DECLARE_HINT = {
    "HPU": "Ray counts a node's Gaudi cards only where habana_frameworks imports in the "
           "environment that runs `ray start`; declare them on each node: `ray start ... "
           "--resources='{\"HPU\": 8}'` (the fake HPU, VLLM_USE_FAKE_HPU=1: one per rank "
           "the node should host).",
    "GPU": "Start each node with its GPUs visible (`ray start ... --num-gpus N`).",
    "CPU": "Start each node with enough CPUs (`ray start ... --num-cpus N`).",
}


def _device_shortage(ray: Any, world_size: int, device_key: str) -> str:
    """Why the cluster's nodes cannot hold `world_size` ranks (their `device_key` count,
    node by node, and how to declare more), or "" when their total is enough."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    counts = [(n.get("NodeManagerAddress", "?"), (n.get("Resources") or {}).get(device_key, 0))
              for n in nodes]
    total = sum(c for _, c in counts)
    if total >= world_size:
        return ""
    per_node = ", ".join(f"{ip}: {c:g}" for ip, c in counts) or "no live node"
    return (f"{world_size} ranks need {world_size} {device_key} but the cluster's nodes offer "
            f"{total:g} ({per_node}). {_DECLARE_HINT.get(device_key, '')}")


WORKER_ENV_PREFIXES = ("VLLM_", "PT_HPU_", "HABANA_")
"""Variables Ray workers get from the engine process: ours, and the Gaudi runtime's
(lazy mode, lazy collectives, graph and logging settings), which must agree on every
rank: a worker on another node does not inherit the engine's environment."""
NODE_LOCAL_ENV_VARS = frozenset({"HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"})
"""Which devices a process may use is the business of its own node (the container
runtime) and of Ray, which gives each actor its module: never copied."""


def vllm_env_vars() -> dict[str, str]:
    """The engine process's WORKER_ENV_PREFIXES variables, without NODE_LOCAL_ENV_VARS."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(WORKER_ENV_PREFIXES) and k not in NODE_LOCAL_ENV_VARS}


def get_driver_ip() -> str:
    ray = import_ray()
    return ray.util.get_node_ip_address()


class RayWorkerWrapper:
    """The body of one Ray actor: hosts the platform's worker for one rank.

    Created empty (Ray places it first); the executor then learns where it landed,
    assigns ranks, and calls `init_worker`. Every later call goes through
    `execute_method`, which mirrors the multiprocess executor's RPCs.
    """

    WATCH_GROUP = "watch"
    """The actor's concurrency group of `watch`: its own thread, so the one waiting call
    never delays the ordered calls of the default group."""

    def __init__(self) -> None:
        self.worker: Optional[Any] = None
        self.rank: Optional[int] = None
        self._stopped = threading.Event()

    def watch(self) -> None:
        """Returns at shutdown. The executor keeps one call of it pending per actor: the
        call fails (RayActorError) as soon as Ray learns that the actor's process or
        node died, so a death is noticed while the engine is idle too."""
        self._stopped.wait()

    def get_node_ip(self) -> str:
        import ray
        return ray.util.get_node_ip_address()

    def get_free_port(self) -> int:
        from vllm.executor.multiproc_utils import get_open_port
        return get_open_port()

    def get_pid(self) -> int:
        return os.getpid()

    def init_worker(self, vllm_config: Any, rank: int, local_rank: int,
                    init_method: str) -> int:
        from vllm.executor.multiproc_utils import create_worker, prefix_log_lines
        self.rank = rank
        prefix_log_lines(rank, kind="RayWorker")
        self.worker = create_worker(vllm_config, rank, local_rank, init_method)
        return os.getpid()

    def execute_method(self, call: tuple) -> Any:
        """One rank's part of a collective_rpc: (method as wired, args, kwargs)."""
        from vllm.executor.distributed_executor import unwire_method
        from vllm.executor.executor_base import run_worker_method
        method, args, kwargs = call
        return run_worker_method(self.worker, unwire_method(method), args, kwargs)

    def shutdown(self) -> None:
        from vllm.executor.multiproc_utils import leave_process_groups
        self._stopped.set()
        if self.worker is not None:
            self.worker.shutdown()
        leave_process_groups()


def initialize_ray_cluster(parallel_config: Any, ray_address: Optional[str] = None) -> Any:
    """vLLM's public helper: connect to the Ray cluster (at `ray_address`, else
    RAY_ADDRESS, else a local one) and reserve one bundle per rank of
    `parallel_config`; returns the placement group. The Ray executor does the same
    by itself; this is for applications that prepare the cluster first."""
    if ray_address:
        os.environ["RAY_ADDRESS"] = ray_address
    world_size = parallel_config.world_size
    from vllm.platforms import current_platform
    device_key = ray_device_key(current_platform.device_type)
    acquire_ray_cluster(world_size, device_key)
    return create_placement_group(world_size, device_key)

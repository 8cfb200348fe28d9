"""RayDistributedExecutor: tensor/pipeline parallel ranks as Ray actors, across nodes.

`--distributed-executor-backend ray` joins the cluster at RAY_ADDRESS, or starts a
single-node cluster on loopback. One placement-group bundle per rank (a CPU, GPU or
HPU) keeps the ranks reserved; actors on the engine's node take the lowest ranks,
and each node's actors get consecutive ranks, so tensor-parallel groups (consecutive
ranks) stay within a node where possible. torch.distributed meets at a TCP store
hosted by rank 0 (the engine's node when it has a rank; loopback on one machine).

Per step the SchedulerOutput is put in the object store once and every actor reads
it; only the driver rank's ModelRunnerOutput is fetched. A dead actor or a failed
call raises RuntimeError and stops the other actors (their process group is lost).
A death while idle is noticed by `check_health` (a pending `watch` call per actor fails).
"""
from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Optional

from vllm.executor.distributed_executor import (DistributedExecutorBase, method_name,
                                                wire_method)
from vllm.executor.executor_base import WorkerMethod
from vllm.executor.multiproc_utils import distributed_init_method
from vllm.executor.ray_utils import (RayWorkerWrapper, acquire_ray_cluster,
                                     create_placement_group, get_driver_ip, import_ray,
                                     ray_device_key, release_ray_cluster, vllm_env_vars)

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5.0


class RayDistributedExecutor(DistributedExecutorBase):

    def _init_executor(self) -> None:
        self.ray = import_ray()
        self._failure: Optional[str] = None
        start = time.perf_counter()
        pc = self.vllm_config.parallel_config
        device_key = ray_device_key(self.vllm_config.device_config.device)
        acquire_ray_cluster(self.world_size * pc.data_parallel_size, device_key)
        self.placement_group = None
        self.workers: list[Any] = []
        self._watches: list[Any] = []
        pg_box: list[Any] = [None]
        # The finalizer shares these containers, so it sees what is created below.
        self._finalizer = weakref.finalize(self, _shutdown_ray_workers, self.workers, pg_box)
        try:
            self.placement_group = pg_box[0] = create_placement_group(self.world_size,
                                                                      device_key)
            self._start_actors(device_key)
            self._init_workers()
        except BaseException:
            self.shutdown()
            raise
        logger.info("Started %d Ray workers in %.2f s.", self.world_size,
                    time.perf_counter() - start)

    def _start_actors(self, device_key: str) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        resources: dict[str, Any] = {"num_cpus": 1} if device_key == "CPU" else (
            {"num_cpus": 0, "num_gpus": 1} if device_key == "GPU" else
            {"num_cpus": 0, "resources": {device_key: 1}})
        env = vllm_env_vars()
        options: dict[str, Any] = dict(resources)
        if env:
            options["runtime_env"] = {"env_vars": env}
        actor_cls = ray.remote(concurrency_groups={RayWorkerWrapper.WATCH_GROUP: 1})(
            RayWorkerWrapper)
        actors = [actor_cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=i,
                placement_group_capture_child_tasks=True),
            **options).remote() for i in range(self.world_size)]
        self.workers.extend(actors)
        ips = ray.get([a.get_node_ip.remote() for a in actors])
        driver_ip = get_driver_ip()
        order = sorted(range(len(actors)), key=lambda i: (ips[i] != driver_ip, ips[i]))
        self.workers[:] = [actors[i] for i in order]
        self.worker_ips = [ips[i] for i in order]
        self._watches = [w.watch.options(concurrency_group=RayWorkerWrapper.WATCH_GROUP)
                         .remote() for w in self.workers]

    def _init_workers(self) -> None:
        ray = self.ray
        ips = self.worker_ips
        local_ranks = [ips[:rank].count(ip) for rank, ip in enumerate(ips)]
        port = ray.get(self.workers[0].get_free_port.remote())
        init_method = distributed_init_method(ips[0], port)
        logger.info("Ray workers on %s; torch.distributed rendezvous at %s.",
                    sorted(set(ips)), init_method)
        refs = [w.init_worker.remote(self.vllm_config, rank, local_ranks[rank], init_method)
                for rank, w in enumerate(self.workers)]
        self.worker_pids = self._wait(refs, "init", timeout=None)

    # ------------------------------------------------------------------ rpc
    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        if not self._finalizer.alive:
            raise RuntimeError("The executor is shut down; create a new engine.")
        self.check_health()
        name = method_name(method)
        # Serialized once, read by every actor.
        call_ref = self.ray.put((wire_method(method), tuple(args), kwargs))
        refs: list[Any] = []
        try:
            for w in self.workers:
                refs.append(w.execute_method.remote(call_ref))
        except BaseException:
            # Some ranks got the call and will wait in collectives for the others.
            self._fail(f"Sending {name} to the Ray workers was interrupted; their state "
                       "is inconsistent, restart the engine.")
            raise
        results = self._wait(refs, name, timeout)
        return results if unique_reply_rank is None else [results[unique_reply_rank]]

    def _wait(self, refs: list[Any], method: str, timeout: Optional[float]) -> list[Any]:
        """All results in rank order; the first failure (not the last) raises."""
        ray = self.ray
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not ready:
                raise self._fail(f"Ray worker rank(s) {sorted(rank_of[r] for r in pending)} "
                                 f"did not finish {method} within {timeout:.0f} s "
                                 "(VLLM_ENGINE_ITERATION_TIMEOUT_S); the engine cannot "
                                 "continue and must be restarted.")
            for ref in ready:
                self._get_one(ref, rank_of, pending, method)
        return ray.get(refs)

    def _get_one(self, ref: Any, rank_of: dict[Any, int], pending: list[Any],
                 method: str) -> Any:
        from ray.exceptions import RayActorError, RayTaskError
        try:
            return self.ray.get(ref)
        except RayActorError as e:
            raise self._fail(self._death_message(rank_of[ref], method, e)) from e
        except RayTaskError as e:
            # A peer's death makes the survivors' collectives fail: report the cause.
            dead = self._dead_peer(pending, rank_of, method)
            if dead is not None:
                raise self._fail(dead) from e
            error = self._fail(f"Ray worker rank {rank_of[ref]} failed in {method}: {e}")
            if method == "init" and isinstance(e, ValueError):
                raise  # a configuration problem stays a ValueError
            raise error from e

    def _dead_peer(self, pending: list[Any], rank_of: dict[Any, int], method: str,
                   grace_s: float = 2.0) -> Optional[str]:
        """The death message of a rank whose call ended in RayActorError, if any."""
        from ray.exceptions import RayActorError
        if not pending:
            return None
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=grace_s)
        for ref in ready:
            try:
                self.ray.get(ref)
            except RayActorError as e:
                return self._death_message(rank_of[ref], method, e)
            except Exception:  # noqa: BLE001 - another survivor's error: not the cause
                pass
        return None

    @staticmethod
    def _death_message(rank: int, method: str, error: BaseException) -> str:
        return (f"Ray worker rank {rank} died unexpectedly during {method} "
                f"({type(error).__name__}); the engine cannot continue and must be restarted.")

    def _fail(self, message: str) -> RuntimeError:
        """Record the first failure and stop every actor; returns the error to raise."""
        if self._failure is None:
            self._failure = message
            logger.error("%s", message)
            for w in self.workers:
                _kill_quietly(self.ray, w)
        return RuntimeError(self._failure)

    def check_health(self) -> None:
        """Raise once a rank's actor died, even while idle (its `watch` call failed);
        a local poll of the pending calls, no round trip."""
        if self._failure is None and self._watches:
            from ray.exceptions import RayActorError
            ready, _ = self.ray.wait(self._watches, num_returns=len(self._watches),
                                     timeout=0)
            for ref in ready:
                try:
                    self.ray.get(ref)
                except RayActorError as e:
                    self._fail(self._death_message(self._watches.index(ref), "idle time", e))
                    break
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def shutdown(self) -> None:
        self._finalizer()


def _shutdown_ray_workers(workers: list[Any], pg_box: list[Any]) -> None:
    """Stop the actors (gracefully, then by force), free the bundles, disconnect.

    A module function holding no reference to the executor, so that it can run from
    weakref.finalize when the executor is collected or at interpreter exit.
    """
    try:
        _stop_actors(workers, pg_box)
    finally:
        release_ray_cluster()


def _stop_actors(workers: list[Any], pg_box: list[Any]) -> None:
    try:
        import ray
        if not ray.is_initialized():
            return
        refs = []
        for w in workers:
            try:
                refs.append(w.shutdown.remote())
            except Exception:  # noqa: BLE001 - actor already gone
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_GRACE_S)
        for w in workers:
            _kill_quietly(ray, w)
        workers.clear()
        if pg_box and pg_box[0] is not None:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(pg_box[0])
    except Exception:  # noqa: BLE001 - best effort while shutting down
        logger.debug("Ray executor shutdown failed.", exc_info=True)


def _kill_quietly(ray: Any, actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead or disconnected
        pass

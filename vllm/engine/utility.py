"""Admin operations ("utility calls"): each one defined once, all reached by one path.

    EngineClient.<op>()  ->  call_utility(name, ...)        (server; async, any engine)
      AsyncLLMEngine: posted to the engine thread, run between two steps
      DPAsyncLLMEngine: sent to every replica, the answers merged
    LLMEngine.<op>() / LLM.<op>()  ->  EngineCore.call_utility(name, ...)
      ->  UTILITIES[name].run(core, ...)  ->  executor.collective_rpc(...)  ->  each worker

Adding an operation is a worker method plus one entry here (and, for a nicer
spelling, a one-line method on EngineClient / LLMEngine / LLM calling
`call_utility`); no executor or engine is touched. Operations that need the engine
core's own state (the prefix cache, whether it sleeps) are EngineCore methods the
entry calls.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger(__name__)


def _first(results: list[Any]) -> Any:
    return results[0]


def _concat(results: list[list[Any]]) -> list[Any]:
    return [item for part in results for item in part]


def _same_on_every_rank(results: list[Any]) -> Any:
    """The ranks' common answer (they hold the same adapters); RuntimeError otherwise."""
    if any(r != results[0] for r in results[1:]):
        raise RuntimeError(f"The ranks disagree: {results}.")
    return results[0]


@dataclass(frozen=True)
class Utility:
    """How one admin operation runs on an engine core, and how data-parallel replicas'
    answers combine."""
    run: Callable[..., Any]
    """(core, *args, **kwargs) -> the operation's result for one engine."""
    merge_replicas: Callable[[list[Any]], Any] = _first
    """Every replica's result -> the answer of a data-parallel engine."""


def on_workers(method: str, reduce: Callable[[list[Any]], Any] = _first) -> Callable[..., Any]:
    """Run `worker.<method>(*args, **kwargs)` on every rank; `reduce` the ranks' results."""

    def run(core: Any, *args: Any, **kwargs: Any) -> Any:
        return reduce(core.collective_rpc(method, args=args, kwargs=kwargs))

    return run


def on_driver(method: str) -> Callable[..., Any]:
    """Ask only the driver rank (the one that samples): per-engine facts like its
    compile counts."""

    def run(core: Any, *args: Any, **kwargs: Any) -> Any:
        executor = core.executor
        return core.collective_rpc(method, args=args, kwargs=kwargs,
                                   unique_reply_rank=executor.driver_rank)[0]

    return run


def on_core(method: str) -> Callable[..., Any]:
    """An EngineCore method (the operation needs the core's own state)."""

    def run(core: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(core, method)(*args, **kwargs)

    return run


def _add_lora(core: Any, lora_request: Any) -> bool:
    """Load (and check) an adapter on every rank; ValueError when it cannot be used."""
    if core.vllm_config.lora_config is None:
        raise ValueError("LoRA is not enabled; start the engine with enable_lora=True.")
    known = core.loaded_loras.get(lora_request.lora_int_id)
    if (known is not None and known.lora_path == lora_request.lora_path
            and known.generation == lora_request.generation
            and not lora_request.load_inplace):
        return True  # several API servers load their --lora-modules on a shared core
    added = all(core.collective_rpc("add_lora", args=(lora_request,)))
    core.loaded_loras[lora_request.lora_int_id] = lora_request
    return added


def _remove_lora(core: Any, lora_id: int) -> bool:
    core.loaded_loras.pop(lora_id, None)
    return all(core.collective_rpc("remove_lora", args=(lora_id,)))


def _start_weight_update(core: Any) -> None:
    """Refused while the engine sleeps: the parameters are offloaded or gone."""
    core.check_awake()
    core.collective_rpc("start_weight_update")


def _update_weights(core: Any, update_info: dict) -> int:
    """One batch of new weights on every rank; how many tensors a rank loaded."""
    return core.collective_rpc("update_weights", args=(update_info,))[0]


def _finish_weight_update(core: Any, weight_version: Any = None) -> None:
    """End the update on every rank, then make sure no KV computed with the old weights
    serves a later request (vllm/core/kv_cache_manager.py); set the version if given."""
    core.collective_rpc("finish_weight_update")
    scheduler = core.scheduler
    if not scheduler.kv_cache_manager.invalidate_prefix_cache(scheduler.waiting):
        logger.info("Weights updated while requests run: their KV blocks stay theirs, no "
                    "later request will reuse them.")
    if weight_version is not None:
        _update_weight_version(core, weight_version)


def _update_weight_version(core: Any, new_version: Any) -> None:
    if not isinstance(new_version, str):
        raise ValueError(f"weight_version must be a string, got {type(new_version).__name__}.")
    core.weight_version = new_version


UTILITIES: dict[str, Utility] = {
    # LoRA adapters: every rank of every replica holds every adapter.
    "add_lora": Utility(_add_lora, merge_replicas=any),
    "remove_lora": Utility(_remove_lora, merge_replicas=any),
    "list_loras": Utility(on_workers("list_loras", _same_on_every_rank)),
    # HPU graph compile accounting (None on other platforms).
    "get_compile_stats": Utility(on_driver("get_compile_stats"), merge_replicas=list),
    "get_bucket_stats": Utility(on_driver("get_bucket_stats"), merge_replicas=list),
    # INC: MEASURE writes the statistics (json path per rank); QUANTIZE reloads scales.
    "finalize_calibration": Utility(on_workers("finalize_calibration", list),
                                    merge_replicas=_concat),
    "reload_quant_scales": Utility(on_workers("reload_quant_scales", min),
                                   merge_replicas=min),
    "check_health": Utility(on_core("check_health")),
    "reset_prefix_cache": Utility(on_core("reset_prefix_cache"), merge_replicas=all),
    # Sleep mode (vllm/worker/sleep_mode.py) and the torch profiler (torch_profiler.py).
    "sleep": Utility(on_core("sleep")),
    "wake_up": Utility(on_core("wake_up")),
    "is_sleeping": Utility(on_core("is_sleeping"), merge_replicas=any),
    "start_profile": Utility(on_core("start_profile")),
    "stop_profile": Utility(on_core("stop_profile")),
    # In-place weight updates (vllm/distributed/weight_transfer/), vLLM's RL surface.
    "init_weight_transfer_engine": Utility(on_workers("init_weight_transfer_engine")),
    "start_weight_update": Utility(_start_weight_update),
    "update_weights": Utility(_update_weights),
    "finish_weight_update": Utility(_finish_weight_update),
    "update_weight_version": Utility(_update_weight_version),
    "get_weight_version": Utility(lambda core: core.weight_version),
    # Anything else a worker can do: one result per rank (of every replica).
    "collective_rpc": Utility(on_core("collective_rpc"), merge_replicas=_concat),
}


def get_utility(name: str) -> Utility:
    try:
        return UTILITIES[name]
    except KeyError:
        raise ValueError(f"Unknown engine utility {name!r}; the utilities are "
                         f"{', '.join(sorted(UTILITIES))}.") from None

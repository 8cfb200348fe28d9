"""Counts graph compilations per step, before and after warmup.

On Gaudi every new input signature of a forward pass is a graph compile (seconds
to minutes, in the middle of a request). Warmup compiles every bucket up front;
after it, a healthy server compiles nothing. Everything a step runs on the device is
measured: each forward pass, the logits gather, the structured-output bitmask, the
sampler, the prompt-logprob gathers and the defragmenter's swaps. This tracker
measures each of them with
`metric_localcontext("graph_compilation")` (Gaudi's own counter on hardware; on
the fake HPU it counts new signatures recorded with `record_compile`, which the
fake HPU graphs do per capture and this tracker does for passes run without a
graph), splits the total into warmup and serving, and implements the per-step
logs of VLLM_HPU_LOG_STEP_GRAPH_COMPILATION[_ALL] and
VLLM_HPU_LOG_STEP_CPU_FALLBACKS[_ALL]. CPU fallbacks are counted where the runtime
counts them (Gaudi); the fake HPU cannot (every op runs on the host), so there
`num_cpu_fallbacks` is None and the fallback logs say so once instead of printing 0.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterator, Optional

from vllm import envs

from vllm.hpu import habana

logger = logging.getLogger(__name__)

_tracker_ids = itertools.count()


def _metric_value(metric: Any, key: str) -> Any:
    return dict(metric.stats()).get(key, 0)


@dataclass
class PassRecord:
    label: str
    compiles: int
    cpu_fallbacks: Optional[int]
    """None: the runtime cannot count them (the fake HPU)."""
    fallback_ops: dict = field(default_factory=dict)


class CompileTracker:
    """Graph compilations of one runner; `num_compiles_after_warmup` is the export."""

    def __init__(self) -> None:
        self._uid = next(_tracker_ids)  # keeps runners in one process apart
        self.warmup_done = False
        self.num_compiles_warmup = 0
        self.num_compiles_after_warmup = 0
        self.num_cpu_fallbacks: Optional[int] = 0
        """None once a pass could not count them (the fake HPU)."""
        self._said_unmeasured = False
        self.num_steps = 0
        self._step: list[PassRecord] = []
        self.compiled_labels: dict[bool, list[str]] = {False: [], True: []}
        """Labels of the passes and calls that compiled, during (False) and after (True)
        warmup: what a compile after warmup was (a forward bucket, a sampler shape...)."""

    @contextlib.contextmanager
    def track_pass(self, label: str, signature: Optional[Hashable]) -> Iterator[None]:
        """Measure one forward pass.

        `signature` is the pass's input signature when it runs without an HPU graph
        (eager, lazy, torch.compile, or a bucket whose graph was not captured); a
        replayed or newly captured graph passes None and is counted by the graph.
        """
        with habana.metric_localcontext("graph_compilation") as compiles, \
                habana.metric_localcontext("cpu_fallback") as fallbacks:
            if signature is not None:
                habana.record_compile(("hpu_runner", self._uid, signature))
            yield
        fallback_count = _metric_value(fallbacks, "TotalNumber")
        record = PassRecord(label, int(_metric_value(compiles, "TotalNumber")),
                            None if fallback_count is None else int(fallback_count),
                            dict(_metric_value(fallbacks, "FallbackOps") or {}))
        if record.compiles:
            self.compiled_labels[self.warmup_done].append(label)
        if self.warmup_done:
            self.num_compiles_after_warmup += record.compiles
        else:
            self.num_compiles_warmup += record.compiles
        if record.cpu_fallbacks is None or self.num_cpu_fallbacks is None:
            self.num_cpu_fallbacks = None
        else:
            self.num_cpu_fallbacks += record.cpu_fallbacks
        self._step.append(record)

    def finish_warmup(self) -> None:
        self.warmup_done = True
        self._step.clear()

    def end_step(self) -> None:
        """Close a serving step: log it as the VLLM_HPU_LOG_STEP_* knobs ask."""
        self.num_steps += 1
        records, self._step = self._step, []
        compiles = sum(r.compiles for r in records)
        if envs.VLLM_HPU_LOG_STEP_GRAPH_COMPILATION_ALL or (
                envs.VLLM_HPU_LOG_STEP_GRAPH_COMPILATION and compiles):
            detail = ", ".join(f"{r.label}: {r.compiles}" for r in records)
            log = logger.warning if compiles else logger.info
            log("Step %d: %d graph compilation(s) [%s]; %d since warmup.", self.num_steps,
                compiles, detail, self.num_compiles_after_warmup)
        asked = envs.VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL or envs.VLLM_HPU_LOG_STEP_CPU_FALLBACKS
        if any(r.cpu_fallbacks is None for r in records):
            if asked and not self._said_unmeasured:
                self._said_unmeasured = True
                logger.warning("CPU fallbacks cannot be counted on the fake HPU (every op "
                               "runs on the host; none is known to lack a Gaudi kernel): "
                               "VLLM_HPU_LOG_STEP_CPU_FALLBACKS[_ALL] logs nothing here.")
            return
        fallbacks = sum(r.cpu_fallbacks or 0 for r in records)
        if envs.VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL or (
                envs.VLLM_HPU_LOG_STEP_CPU_FALLBACKS and fallbacks):
            ops: dict = {}
            for r in records:
                ops.update(r.fallback_ops)
            log = logger.warning if fallbacks else logger.info
            log("Step %d: %d CPU fallback(s) %s", self.num_steps, fallbacks, ops or "")

    def stats(self) -> dict[str, Optional[int]]:
        return {"num_compiles_warmup": self.num_compiles_warmup,
                "num_compiles_after_warmup": self.num_compiles_after_warmup,
                "num_cpu_fallbacks": self.num_cpu_fallbacks,
                "num_steps": self.num_steps}

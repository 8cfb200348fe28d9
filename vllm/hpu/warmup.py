"""Warmup: compile every bucket, then capture HPU graphs within the memory reserved.

Phase 1 runs one dummy batch per bucket, largest first (so an out-of-memory shows
up at once), prompt buckets then decode buckets, or with a bucket plan or a time
budget (`VLLM_WARMUP_BUDGET_S`) in order of expected traffic (`warmup_order.py`),
stopping when the budget is spent and logging the buckets left cold; each run is the compile that
serving would otherwise pay for, for the forward and everything after it in the
step: the logits gather, the structured-output bitmask, the sampler (argmax and
full, every logprob bucket) and the prompt-logprob gathers (see hpu_sampling.py);
then the defragmenter's swap buckets (on the fake HPU in torch.compile mode the
compiled regions skip their arithmetic meanwhile, see `warmup_context`).
Phase 2 (HPU graph mode only) captures graphs.
The memory left for graphs (free memory minus the margin kept by
gpu_memory_utilization) is split by VLLM_GRAPH_PROMPT_RATIO (unset: by the
phases' measured shares); prompt buckets are captured in
VLLM_GRAPH_PROMPT_STRATEGY order and decode buckets in VLLM_GRAPH_DECODE_STRATEGY
order. A bucket whose estimated memory (the memory model measured before the KV
cache was sized, graph_memory.py; with VLLM_GRAPH_RESERVED_MEM set by hand,
tokens times the bytes per token measured so far in its phase) does not fit is
skipped and keeps running without a graph, and so is one whose capture the device
refuses (out of memory: logged, never fatal); memory one phase leaves over goes
to the other.

With tensor parallelism the ranks must capture the same buckets (a graph holds the
layers' collectives, so a rank replaying one while its peer runs eagerly would not
match), so the graph memory is the minimum over the TP ranks' and each capture
counts the most memory any rank measured: every rank then takes the same decisions.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from tqdm import tqdm

from vllm import envs

from vllm.hpu import habana
from vllm.distributed.parallel_state import get_tp_group
from vllm.hpu.bucketing import Bucket
from vllm.hpu.execution import ExecutionMode, warmup_context
from vllm.hpu.graph_memory import (GraphMemoryModel, is_device_oom, oom_is_recoverable,
                                   reduce_capture)
from vllm.hpu.log import format_bytes, log_graph_memory, log_warmup_step
from vllm.hpu.warmup_order import WarmupItem, largest_first, traffic_order

logger = logging.getLogger(__name__)

PROMPT_STRATEGIES = ("min_tokens", "max_bs")
DECODE_STRATEGIES = ("max_bs", "min_tokens")


def bucket_tokens(is_prompt: bool, bucket: Bucket) -> int:
    """What a bucket's graph memory grows with: padded tokens (prompt), rows (decode)."""
    return bucket.batch_size * bucket.query_len if is_prompt else bucket.batch_size


def order_for_capture(buckets: list[Bucket], is_prompt: bool, strategy: str) -> list[Bucket]:
    """min_tokens: smallest bs x seq first (many small graphs), where seq is the query
    length of a prompt bucket and the KV blocks of a decode bucket, as Gaudi's runner
    orders them; max_bs: largest batch first."""
    _check_strategy(is_prompt, strategy)
    if strategy == "min_tokens":
        def bs_x_seq(b: Bucket) -> int:
            return b.batch_size * (b.query_len if is_prompt else b.num_blocks)
        return sorted(buckets, key=lambda b: (bs_x_seq(b), b))
    return sorted(buckets, key=lambda b: (-b.batch_size, b.query_len, b.num_blocks))


def _check_strategy(is_prompt: bool, strategy: str) -> None:
    allowed = PROMPT_STRATEGIES if is_prompt else DECODE_STRATEGIES
    name = "VLLM_GRAPH_PROMPT_STRATEGY" if is_prompt else "VLLM_GRAPH_DECODE_STRATEGY"
    if strategy not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {strategy!r}.")


def check_warmup_knobs() -> None:
    """Refuse a bad warmup or graph-capture knob at start-up (the platform's config
    check). The capture knobs are read when the graphs are captured, after the whole
    compile phase of the warmup: a typo there cost the warmup's minutes first."""
    if envs.VLLM_WARMUP_BUDGET_S < 0:
        raise ValueError(f"VLLM_WARMUP_BUDGET_S must be >= 0, got "
                         f"{envs.VLLM_WARMUP_BUDGET_S}.")
    _check_strategy(True, envs.VLLM_GRAPH_PROMPT_STRATEGY)
    _check_strategy(False, envs.VLLM_GRAPH_DECODE_STRATEGY)
    graph_reserved_fraction()
    if envs.VLLM_GRAPH_PROMPT_RATIO is not None:
        _check_ratio("VLLM_GRAPH_PROMPT_RATIO", envs.VLLM_GRAPH_PROMPT_RATIO, True)


@dataclass
class CaptureResult:
    captured: list[Bucket] = field(default_factory=list)
    skipped: list[Bucket] = field(default_factory=list)
    used_bytes: int = 0
    left_bytes: int = 0
    bytes_per_token: Optional[float] = None
    """Measured graph memory per token (None until something was captured)."""
    out_of_memory: list[Bucket] = field(default_factory=list)
    """Buckets whose capture the device refused (also in `skipped`)."""
    predicted_bytes: float = 0.0
    """The memory model's estimate for the captured buckets (0 without a model)."""


class GraphCaptureOOM(Exception):
    """A capture the device could not allocate (on any TP rank); `used_bytes` is what
    it took before failing."""

    def __init__(self, used_bytes: int) -> None:
        super().__init__(f"graph capture out of memory after {used_bytes} bytes")
        self.used_bytes = used_bytes


def capture_within_budget(buckets: list[Bucket], budget: int, tokens_of: Callable[[Bucket], int],
                          capture: Callable[[Bucket], int],
                          bytes_per_token: Optional[float] = None,
                          model: Optional[GraphMemoryModel] = None) -> CaptureResult:
    """Capture buckets in order while their estimated memory fits `budget`.

    `capture(bucket)` records the graph and returns the bytes it took, or raises
    `GraphCaptureOOM` (the bucket is then skipped, never fatal). The estimate is the
    measured memory `model`'s, scaled up by how much the captures so far exceeded
    their estimates; without a model, tokens times the bytes per token measured so
    far (`bytes_per_token` seeds it), and with nothing measured yet a bucket is
    tried whenever some budget is left.
    """
    result = CaptureResult(bytes_per_token=bytes_per_token)
    tokens_done = 0
    for bucket in buckets:
        left = budget - result.used_bytes
        tokens = tokens_of(bucket)
        if model is not None:
            scale = max(1.0, result.used_bytes / result.predicted_bytes
                        if result.predicted_bytes > 0 else 1.0)
            estimate = model.estimate(bucket) * scale
        else:
            estimate = tokens * (result.bytes_per_token or 0.0)
        if left <= 0 or estimate > left:
            result.skipped.append(bucket)
            continue
        try:
            used = max(0, capture(bucket))
        except GraphCaptureOOM as oom:
            result.used_bytes += max(0, oom.used_bytes)
            result.skipped.append(bucket)
            result.out_of_memory.append(bucket)
            continue
        result.used_bytes += used
        tokens_done += tokens
        result.captured.append(bucket)
        result.predicted_bytes += model.estimate(bucket) if model is not None else 0.0
        result.bytes_per_token = result.used_bytes / max(1, tokens_done)
    result.left_bytes = max(0, budget - result.used_bytes)
    return result


def _check_ratio(name: str, value: float, upper_inclusive: bool) -> float:
    if not (0.0 <= value <= 1.0) or (not upper_inclusive and value == 1.0):
        bound = "1]" if upper_inclusive else "1)"
        raise ValueError(f"{name} must be in [0, {bound}, got {value}.")
    return value


DEFAULT_PROMPT_RATIO = 0.3


def graph_reserved_fraction() -> Optional[float]:
    """VLLM_GRAPH_RESERVED_MEM when the user set it; None: measure (graph_memory.py)."""
    value = envs.VLLM_GRAPH_RESERVED_MEM
    return None if value is None else _check_ratio("VLLM_GRAPH_RESERVED_MEM", value, False)


@dataclass
class WarmupOps:
    """What the warmup needs from a runner, and nothing else: the buckets, the
    execution mode, and the three device operations it calls per bucket. The runner
    builds one (`HPUModelRunner.warmup_ops`); the warmup never sees the runner."""
    prompt_buckets: list[Bucket]
    decode_buckets: list[Bucket]
    block_size: int
    mode: ExecutionMode
    uses_hpu_graphs: bool
    mem_margin: int
    """Device bytes kept free (gpu_memory_utilization): graphs get what is above it."""
    run_dummy_batch: Callable[[bool, Bucket], None]
    """(is_prompt, bucket): one compile pass, no graph."""
    capture_graph: Callable[[bool, Bucket], None]
    forget_graph: Callable[[bool, Bucket], None]
    """(is_prompt, bucket): a capture failed; the bucket runs without a graph."""
    warmup_defragmenter: Callable[[], None]
    prompt_traffic: Optional[dict[Bucket, int]] = None
    decode_traffic: Optional[dict[Bucket, int]] = None
    """Trace passes per bucket, from a bucket plan (None: unknown)."""
    budget_s: float = 0.0
    """Seconds the compile phase may take (0: no limit)."""
    graph_models: Optional[tuple[GraphMemoryModel, GraphMemoryModel]] = None
    """(prompt, decode) graph memory measured before the KV cache was sized
    (graph_memory.py); None when VLLM_GRAPH_RESERVED_MEM was set by hand."""


@dataclass
class WarmupResult:
    seconds: float
    allocated_bytes: int
    """Device memory the warmup left allocated (graphs, caches of compiled code)."""
    prompt_graphs: Optional[CaptureResult] = None
    decode_graphs: Optional[CaptureResult] = None
    cold: list[WarmupItem] = field(default_factory=list)
    """(is_prompt, bucket) the compile phase did not reach within the time budget."""


class HPUWarmup:
    """Runs one warmup (see the module doc) over the operations it is given."""

    def __init__(self, ops: WarmupOps) -> None:
        self.ops = ops

    @staticmethod
    def _free() -> int:
        return habana.mem_get_info()[0]

    def run(self) -> WarmupResult:
        ops = self.ops
        start, free_start = time.perf_counter(), self._free()
        prompt = largest_first(ops.prompt_buckets, True, ops.block_size)
        decode = largest_first(ops.decode_buckets, False, ops.block_size)
        cold: list[WarmupItem] = []
        with warmup_context(ops.mode):
            if ops.budget_s > 0 or ops.prompt_traffic or ops.decode_traffic:
                cold = self._compile_by_traffic(start)
                prompt = [b for b in prompt if (True, b) not in cold]
                decode = [b for b in decode if (False, b) not in cold]
            else:
                self._compile_phase("Prompt", True, prompt)
                self._compile_phase("Decode", False, decode)
        ops.warmup_defragmenter()
        graphs: tuple[Optional[CaptureResult], Optional[CaptureResult]] = (None, None)
        if ops.uses_hpu_graphs:
            graphs = self._capture_graphs(prompt, decode)
        habana.synchronize()
        return WarmupResult(time.perf_counter() - start, max(0, free_start - self._free()),
                            *graphs, cold=cold)

    def _compile_by_traffic(self, start: float) -> list[WarmupItem]:
        """Compile both phases' buckets in order of expected traffic until the budget
        is spent; returns the buckets left cold (logged)."""
        ops = self.ops
        order = traffic_order(ops.prompt_buckets, ops.decode_buckets, ops.block_size,
                              ops.prompt_traffic, ops.decode_traffic)
        for i, (is_prompt, bucket) in enumerate(order):
            if ops.budget_s > 0 and time.perf_counter() - start >= ops.budget_s:
                cold = order[i:]
                logger.warning(
                    "Warmup budget VLLM_WARMUP_BUDGET_S=%.1f s spent after %d of %d buckets; "
                    "left cold (they compile on first use, or batches take a larger warm "
                    "bucket): prompt %s, decode %s", ops.budget_s, i, len(order),
                    [tuple(b) for p, b in cold if p], [tuple(b) for p, b in cold if not p])
                return cold
            log_warmup_step("Prompt" if is_prompt else "Decode", i + 1, len(order), bucket,
                            ops.block_size)
            ops.run_dummy_batch(is_prompt, bucket)
        return []

    def _compile_phase(self, phase: str, is_prompt: bool, buckets: list[Bucket]) -> None:
        for i, bucket in enumerate(tqdm(buckets, desc=f"Warmup {phase.lower()} buckets",
                                        disable=None, leave=False), start=1):
            log_warmup_step(phase, i, len(buckets), bucket, self.ops.block_size)
            self.ops.run_dummy_batch(is_prompt, bucket)

    def _capture_graphs(self, prompt: list[Bucket], decode: list[Bucket]
                        ) -> tuple[CaptureResult, CaptureResult]:
        models = self.ops.graph_models
        ratio = self._prompt_ratio(prompt, decode)
        graph_mem = get_tp_group().all_reduce_int(max(0, self._free() - self.ops.mem_margin),
                                                  "min")
        prompt_budget = int(graph_mem * ratio)
        decode_budget = graph_mem - prompt_budget
        prompt_order = order_for_capture(prompt, True, envs.VLLM_GRAPH_PROMPT_STRATEGY)
        decode_order = order_for_capture(decode, False, envs.VLLM_GRAPH_DECODE_STRATEGY)
        log_graph_memory(graph_mem, self._free(), prompt_budget, decode_budget, ratio)
        p = self._capture_phase("Prompt", True, prompt_order, prompt_budget)
        d = self._capture_phase("Decode", False, decode_order, decode_budget + p.left_bytes)
        if p.skipped and d.left_bytes > 0:
            # The second prompt pass continues the first one's numbering (i/N of all).
            retry = [b for b in p.skipped if b not in p.out_of_memory]
            again = self._capture_phase("Prompt", True, retry, d.left_bytes,
                                        p.bytes_per_token, first_index=len(p.captured) + 1,
                                        total=len(prompt))
            p.captured += again.captured
            p.skipped = [b for b in p.skipped if b not in again.captured]
            p.out_of_memory += again.out_of_memory
            p.used_bytes += again.used_bytes
            p.predicted_bytes += again.predicted_bytes
        if models is not None:
            logger.info("Graph memory: captured %s, the measured model predicted %s",
                        format_bytes(p.used_bytes + d.used_bytes),
                        format_bytes(int(p.predicted_bytes + d.predicted_bytes)))
        for phase, res, total in (("Prompt", p, len(prompt)), ("Decode", d, len(decode))):
            logger.info("Graph/%s captured:%d (%.1f%%) used_mem:%s buckets:%s", phase,
                        len(res.captured), 100.0 * len(res.captured) / max(1, total),
                        format_bytes(res.used_bytes), sorted(tuple(b) for b in res.captured))
            if res.skipped:
                logger.info("Graph/%s not captured (no graph memory left; they run without "
                            "a graph): %s", phase, sorted(tuple(b) for b in res.skipped))
        return p, d

    def _prompt_ratio(self, prompt: list[Bucket], decode: list[Bucket]) -> float:
        """VLLM_GRAPH_PROMPT_RATIO when set; else the prompt graphs' share of the
        measured estimate (0.3, vllm-gaudi's default, without a measurement)."""
        if envs.VLLM_GRAPH_PROMPT_RATIO is not None:
            return _check_ratio("VLLM_GRAPH_PROMPT_RATIO", envs.VLLM_GRAPH_PROMPT_RATIO, True)
        models = self.ops.graph_models
        if models is None:
            return DEFAULT_PROMPT_RATIO
        want_p = sum(models[0].estimate(b) for b in prompt)
        want_d = sum(models[1].estimate(b) for b in decode)
        return want_p / (want_p + want_d) if want_p + want_d > 0 else DEFAULT_PROMPT_RATIO

    def _capture_phase(self, phase: str, is_prompt: bool, buckets: list[Bucket],
                       budget: int, bytes_per_token: Optional[float] = None,
                       first_index: int = 1, total: Optional[int] = None) -> CaptureResult:
        """Capture in order within `budget`; log lines are numbered from `first_index`
        out of `total` (default: these buckets)."""
        progress = tqdm(total=len(buckets), desc=f"Capturing {phase.lower()} graphs",
                        disable=None, leave=False)
        counter = itertools.count(first_index)
        total = len(buckets) if total is None else total

        def capture(bucket: Bucket) -> int:
            log_warmup_step(f"Graph/{phase}", next(counter), total, bucket,
                            self.ops.block_size)
            before = self._free()
            failed = False
            try:
                self.ops.capture_graph(is_prompt, bucket)
                habana.synchronize()
            except Exception as error:  # noqa: BLE001 - only a device OOM is absorbed
                if not (is_device_oom(error) and oom_is_recoverable(get_tp_group())):
                    raise
                failed = True
                logger.warning("Graph/%s %s: capture ran out of device memory (%s); the "
                               "bucket runs without a graph.", phase, tuple(bucket), error)
            progress.update(1)
            # Every rank takes the same decision: a graph on one rank only would not match.
            used = reduce_capture(get_tp_group().all_reduce_int, before - self._free(),
                                  failed)
            if used is None:
                self.ops.forget_graph(is_prompt, bucket)
                raise GraphCaptureOOM(max(0, before - self._free()))
            return used

        try:
            model = None if self.ops.graph_models is None else (
                self.ops.graph_models[0 if is_prompt else 1])
            return capture_within_budget(buckets, budget,
                                         lambda b: bucket_tokens(is_prompt, b), capture,
                                         bytes_per_token, model)
        finally:
            progress.close()

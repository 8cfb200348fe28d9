"""Runs one scheduled step on the HPU: bucketed prompt and decode passes, then sampling.

Per step the scheduled requests are split by phase: a request still in its prompt
(a whole prompt, a chunk, or the tail after a prefix-cache hit) joins the prompt
passes, a request past its prompt with one new token joins the decode pass.
The decode pass runs first; prompts are grouped into batches that each fit a
warmed bucket, ordered so that a prompt reading blocks another prompt writes in
this step runs after it. Every pass is padded to its bucket (see
hpu_input_prep.py) and executed in the runner's execution mode (see
hpu_execution.py). Logits are computed at one row per batch
entry (a fixed [B] shape per bucket); only the real sequences that reached the
end of their known tokens are sampled. Request states and the output are the
base's (`model_runner_base.py`): each bucketed batch is one `ForwardPass`; logits
processors, prompt logprobs, sampling and their warmup are the HPU sampling stage's
(`sampling_stage.py`: every shape fixed per bucket, tracked and warmed).

Pipeline parallel: every stage builds the same passes from the same SchedulerOutput;
a later stage runs each pass on the previous stage's activations (received in the
bucket's padded shape), an earlier one sends its own on and samples nothing.

Block ids from the scheduler are logical; with contiguous paged attention the
defragmenter maps them to physical ids, which is what every tensor here holds.
The KV cache has one extra block at the end, the pad block, which padded rows
write into.
"""
from __future__ import annotations

import functools
import gc
import logging
import time
from typing import Any, Optional

import numpy as np
import torch

from vllm import envs

from vllm.hpu import habana
from vllm.hpu.attention import HPUKVCache
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.hpu.graph_keys import baked_constants, input_signature
from vllm.sequence import IntermediateTensors
from vllm.hpu.bucket_accounting import BucketAccounting
from vllm.hpu.bucketing import Bucket, HPUBucketingContext
from vllm.hpu.compile_tracker import CompileTracker
from vllm.hpu.defragmenter import HPUDefragmenter, swap_blocks, swap_buckets
from vllm.hpu.execution import ExecutionMode, prepare_forward_module, run_forward
from vllm.hpu.graph_memory import (GraphMemoryModel, GraphReservePlan, fit_models,
                                  is_device_oom, plan_graph_reserve, probe_buckets,
                                  oom_is_recoverable, reduce_capture)
from vllm.multimodal.inputs import bidirectional_span_ids
from vllm.hpu.input_prep import (DecodeSeq, HPUBatch, PromptSeq, build_decode_batch,
                                        build_prompt_batch, decode_blocks_needed,
                                        dependency_levels, pad_slots)
from vllm.hpu.prompt_grouping import group_prompts, resolve_pass_overhead
from vllm.hpu.profiler import HPUProfiler
from vllm.hpu.sampling_stage import HPUSamplingStage
from vllm.hpu.log import (MemorySnapshot, format_bytes, log_graph_models, log_profile_run,
                          log_took, log_weights_loaded)
from vllm.hpu.warmup import HPUWarmup, WarmupOps
from vllm.worker.kv_cache_alloc import zeroed_tensors
from vllm.worker.kv_cache_layout import allocate_layer_caches, unique_tensors
from vllm.worker.state_cache import StateMetadata, set_state_metadata
from vllm.worker.model_runner_base import ForwardPass, ModelRunnerBase, PassOutput

logger = logging.getLogger(__name__)

PROBE_CACHE_BLOCKS = 64
"""KV blocks of the temporary cache the graph memory probes run on (enough for the
per-block cost to show; at most what the real cache could hold)."""


def resolve_contiguous_pa(enable_prefix_caching: bool) -> bool:
    """VLLM_CONTIGUOUS_PA, which only works without prefix caching.

    Contiguous PA gives each physical block one owner row; a prefix-cached block
    shared by two sequences of a batch would need two.
    """
    if not envs.VLLM_CONTIGUOUS_PA:
        return False
    if enable_prefix_caching:
        if envs.is_set("VLLM_CONTIGUOUS_PA"):
            logger.warning("VLLM_CONTIGUOUS_PA is ignored with prefix caching enabled "
                           "(shared blocks cannot be indexed by physical id); disable "
                           "prefix caching to use it.")
        return False
    return True


class HPUModelRunner(ModelRunnerBase):
    """Bucketed passes, HPU attention metadata and execution modes (the rest: the base)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str = "cpu") -> None:
        mc, cc = vllm_config.model_config, vllm_config.cache_config
        sc = vllm_config.scheduler_config
        super().__init__(vllm_config, device)
        self.max_model_len = mc.max_model_len
        self.is_pooling = getattr(mc, "runner_type", "generate") == "pooling"
        """Pooling model: prompt buckets only, pooled hidden states instead of logits."""
        self.mode = ExecutionMode.select(habana.is_lazy(), mc.enforce_eager or self.calibrating)
        """An INC measurement runs without graphs or compiled regions: its layers update
        host-side statistics per pass (a calibration run is short; speed is moot)."""
        self.device_label = "hpu:0"
        """Device named in the log lines (the worker sets its own index)."""
        # Speculative decoding: a request verifying k drafts takes k + 1 decode rows
        # (each one query row against its paged context), so decode buckets reach
        # max_num_seqs * (k + 1) rows; its rows share blocks, which contiguous PA's one
        # owner per block cannot express.
        rows_per_seq = 1 + (self.spec_decode.config.num_speculative_tokens
                            if self.spec_decode is not None else 0)
        self.contiguous_pa = (resolve_contiguous_pa(cc.enable_prefix_caching)
                              and rows_per_seq == 1)
        chunked = sc.enable_chunked_prefill and sc.max_num_batched_tokens < mc.max_model_len
        self.bucketing = HPUBucketingContext(
            max_num_seqs=sc.max_num_seqs * rows_per_seq,
            max_num_prefill_seqs=min(sc.max_num_seqs, 64), block_size=self.block_size,
            max_num_batched_tokens=sc.max_num_batched_tokens, max_model_len=mc.max_model_len,
            use_prompt_context=cc.enable_prefix_caching or chunked,
            contiguous_pa=self.contiguous_pa)
        self.tracker = CompileTracker()
        self.accounting = BucketAccounting(self.bucketing, record_trace=self._is_driver())
        self.prompt_pass_overhead = resolve_pass_overhead(self.bucketing.plan)
        """Fixed cost of a prompt pass in token slots (prompt_grouping.py)."""
        self.capture_on_first_use = False
        self.graph_refused: set[tuple[bool, Bucket]] = set()
        """Buckets whose graph did not fit (they run without one)."""
        self.graph_models: Optional[tuple[GraphMemoryModel, GraphMemoryModel]] = None
        """Measured graph memory, (prompt, decode): graph_memory.py."""
        """VLLM_SKIP_WARMUP with HPU graphs: a bucket's graph is captured when first run."""
        self.num_graph_captures = 0
        self.num_graph_replays = 0
        self._graph_keys: set = set()
        self.graph_bytes: dict[tuple, int] = {}
        """Device bytes each captured graph took, measured at its capture (free memory
        before minus after: its static buffers and workspace), by graph key."""
        self.profiler = HPUProfiler()
        self.sampling_stage = HPUSamplingStage(
            self.sampling_stage, self.tracker, self.mode.value, self.profiler,
            mc.vocab_size, mc.max_logprobs)
        self.graphed_buckets: set[tuple[bool, Bucket]] = set()
        self.forward_module: Optional[torch.nn.Module] = None
        self.num_kv_blocks = 0
        self.pad_block_id = -1
        self.defragmenter: Optional[HPUDefragmenter] = None
        self.mem_margin = 0
        """Bytes kept free for gpu_memory_utilization < 1 (set by the worker)."""
        self.warmup_seconds: Optional[float] = None
        self.cold_buckets: list[Bucket] = []
        """Buckets the warmup left uncompiled (VLLM_WARMUP_BUDGET_S ran out, or their
        graph would not fit in memory)."""
        logger.info("HPU execution mode: %s (PT_HPU_LAZY_MODE=%d, enforce_eager=%s); "
                    "contiguous PA: %s.", self.mode.value, int(self.mode.is_lazy),
                    mc.enforce_eager, self.contiguous_pa)

    @staticmethod
    def _is_driver() -> bool:
        """One rank records the trace (every TP rank and PP stage runs the same passes)."""
        from vllm.distributed.parallel_state import get_tp_group
        return get_tp_group().rank_in_group == 0 and get_pp_group().is_first_rank

    # ------------------------------------------------------------------ setup
    @property
    def uses_hpu_graphs(self) -> bool:
        return self.mode is ExecutionMode.HPU_GRAPHS

    @property
    def num_compiles_after_warmup(self) -> int:
        """Graph compilations since warmup ended: 0 on a well-configured server."""
        return self.tracker.num_compiles_after_warmup

    def load_model(self) -> None:
        from vllm.model_executor.cpu_offload import offload_layers
        from vllm.model_executor.model_loader import get_model
        start, before = time.perf_counter(), MemorySnapshot.take()
        self.model = get_model(self.vllm_config, device=self.device)
        from vllm.lora.models import create_lora_manager
        # Static shapes: rank-padded adapter slots, a [rows] slot tensor per pass.
        self.lora_manager = create_lora_manager(self.model, self.vllm_config, self.device,
                                                static_shapes=True)
        self.cpu_offload = offload_layers(
            self.model, self.vllm_config.cache_config.cpu_offload_gb, self.device)
        host_resident = {id(p) for p in self.cpu_offload.freed_params}
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if id(t) not in host_resident:  # they share a staging copy (cpu_offload.py)
                habana.track_alloc(t)
        log_weights_loaded(self.device_label, before, time.perf_counter() - start)
        wrap_before = MemorySnapshot.take()
        self.forward_module = prepare_forward_module(
            self.model, self.attn_impl, self.mode,
            lora_batch=self.lora_manager.batch if self.lora_manager else None)
        if self.uses_hpu_graphs:
            log_took("Wrapping in HPU Graph", wrap_before)
        self.vision_encoder = None
        if getattr(self.model, "supports_multimodal", False):
            from vllm.hpu.mm_encoder import HPUVisionEncoder
            self.vision_encoder = HPUVisionEncoder(self.model, self.tracker, self.mode.value,
                                                   self.model_config)
        log_took("Loading model weights", before, time.perf_counter() - start)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Per layer an `HPUKVCache`: separate K and V tensors of
        [(num_blocks + 1) * block_size, kv_heads, head_size], zeroed.

        The extra last block is the pad block. Zeroed so that padding rows, which
        read blocks nobody wrote, never meet NaN garbage. Layers of other pipeline
        stages get None.
        """
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}.")
        before = MemorySnapshot.take()
        self.num_kv_blocks = num_blocks
        self.pad_block_id = num_blocks
        self._restore_kv_cache()
        log_took("Initializing cache engine", before)
        self.bucketing.generate_decode_buckets(num_blocks)

    def _restore_kv_cache(self) -> None:
        """The tensors (and the defragmenter over them) of `num_kv_blocks` blocks: what
        start-up and a wake-up from sleep allocate; the buckets stay as they are."""
        empty = torch.empty(0, dtype=self.kv_cache_dtype, device=self.device)

        def make(spec: Any, count: int) -> list[HPUKVCache]:
            # MLA: the latent is both K and V (vllm/hpu/mla.py); the value tensor is empty.
            shape = ((self.num_kv_blocks + 1) * spec.block_size, spec.num_kv_heads,
                     spec.head_size)
            halves = iter(zeroed_tensors(shape, spec.dtype, self.device,
                                         spec.num_parts * count))
            return [HPUKVCache(next(halves), next(halves) if spec.num_parts == 2 else empty)
                    for _ in range(count)]

        self.kv_caches = allocate_layer_caches(
            self.get_kv_cache_config(), self._owned_layer_ids(),
            self.model_config.get_num_layers(), make, None)
        self._init_state_cache()  # state-space layers: [max_num_seqs + 1 pad, ...] slots
        caches = {id(c): c for c in self.kv_caches if c is not None}
        for cache in caches.values():
            habana.track_alloc(cache.key_cache)
            habana.track_alloc(cache.value_cache)
        if self.contiguous_pa:
            self.defragmenter = HPUDefragmenter(self.num_kv_blocks, self.block_size,
                                                pad_block_id=self.pad_block_id)

    def kv_layer_views(self) -> dict[str, Any]:
        """Each owned layer's separate K and V caches for the KV connector, its logical
        blocks resolved through the defragmenter (when contiguous PA moved them)."""
        from vllm.kv_transfer.kv_io import SplitKVLayer

        def caches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return self.kv_caches[i].key_cache, self.kv_caches[i].value_cache

        def resolve(block_ids: np.ndarray) -> np.ndarray:
            if self.defragmenter is None:
                return block_ids
            return np.asarray(self.defragmenter.resolve_table(block_ids.tolist()),
                              dtype=np.int64)

        return {f"layers.{i}": SplitKVLayer(lambda i=i: caches(i), self.block_size, resolve)
                for i in self._owned_layer_ids()}

    def _release_kv_cache(self) -> None:
        """The defragmenter's block tables describe the freed cache: dropped too. The
        captured HPU graphs stay: the caches are graph inputs, not captured tensors, so
        the new ones (same shapes) replay the same graphs without a compile."""
        self.defragmenter = None

    def _weights_released(self) -> None:
        """The weights leave the device (level 1: to host memory; level 2: gone)."""
        for p in self.model.parameters():
            habana.track_free(p)

    def _weights_restored(self) -> None:
        """Back on the device. On Gaudi they now sit at new addresses, which the graphs
        captured before the sleep still point to: drop those graphs (recaptured on first
        use). On the fake HPU the tensors never moved (host memory is the device), so
        the graphs stay valid and nothing is recompiled."""
        for p in self.model.parameters():
            habana.track_alloc(p)
        if self.uses_hpu_graphs and not habana.is_fake_hpu():
            self.forward_module = prepare_forward_module(
                self.model, self.attn_impl, self.mode,
                lora_batch=self.lora_manager.batch if self.lora_manager else None)
            self.graphed_buckets.clear()
            self._graph_keys.clear()
            self.graph_bytes.clear()
            self.capture_on_first_use = True

    def flush_weight_copies(self) -> None:
        """Lazy mode: the copies of a batch are pending ops; run them now."""
        if self.mode.is_lazy:
            habana.mark_step()

    def weights_updated(self) -> None:
        """An in-place update copied new values into the same device tensors, which the
        captured graphs read as they replay: no graph is dropped or captured again."""
        self.flush_weight_copies()

    def _cache_tensors(self) -> list[torch.Tensor]:
        """Every K and V tensor of this rank (what the defragmenter swaps blocks in)."""
        return unique_tensors(t for cache in self.kv_caches if cache is not None
                              for t in cache)

    # ----------------------------------------------------------- dummy passes
    def _dummy_prompt_batch(self, bucket: Bucket) -> HPUBatch:
        """B full rows of token 0 writing into the pad block; C pad context blocks."""
        b, t, c = bucket
        bs = self.block_size
        ctx_len = max(0, min(c * bs, self.max_model_len - t))
        positions = np.minimum(ctx_len + np.arange(t), self.max_model_len - 1)
        seq = PromptSeq(None, np.zeros(t, dtype=np.int64), positions,
                        pad_slots(self.pad_block_id, bs, t), ctx_len, [self.pad_block_id] * c)
        return build_prompt_batch([seq] * b, bucket, bs, self.pad_block_id, self.device,
                                  self._bidirectional_mm)

    @property
    def _bidirectional_mm(self) -> bool:
        """The model's image tokens attend both ways (Gemma 3): prompt passes carry each
        position's image (input_prep.build_prompt_batch)."""
        return bool(getattr(self.model, "bidirectional_mm", False))

    def _dummy_decode_batch(self, bucket: Bucket) -> HPUBatch:
        """min(B, N) sequences sharing the bucket's N blocks (ids 0..N-1, left untouched:
        the new tokens are written into the pad block)."""
        b, _, n = bucket
        bs = self.block_size
        num_seqs = min(b, n)
        counts = [n // num_seqs + (1 if i < n % num_seqs else 0) for i in range(num_seqs)]
        seqs, first = [], 0
        for i, count in enumerate(counts):
            seq_len = count * bs
            seqs.append(DecodeSeq(None, 0, min(seq_len, self.max_model_len) - 1,
                                  self.pad_block_id * bs + i % bs, seq_len,
                                  list(range(first, first + count))))
            first += count
        return build_decode_batch(seqs, bucket, bs, self.pad_block_id, self.contiguous_pa,
                                  self.dtype, self.device)

    def dummy_batch(self, is_prompt: bool, bucket: Bucket) -> HPUBatch:
        return self._dummy_prompt_batch(bucket) if is_prompt else self._dummy_decode_batch(bucket)

    @torch.inference_mode()
    def run_dummy_batch(self, is_prompt: bool, bucket: Bucket, use_graph: bool) -> None:
        """One warmup pass (forward, logits, then the sampling stage's bitmask, custom
        processors, samplers and prompt logprobs) in the exact shapes serving uses."""
        batch = self.dummy_batch(is_prompt, bucket)
        hidden, logits = self._run_batch(batch, use_graph=use_graph)
        if self.is_pooling:
            self._bucket_pooled(batch, hidden)
            return
        if logits is None:
            return  # a pipeline stage before the last: no logits
        self.sampling_stage.warm_bucket(self.model, batch, hidden, logits)

    def pooled_rows(self, fwd: ForwardPass, hidden: torch.Tensor,
                    indices: list[int]) -> torch.Tensor:
        """The bucket pooled at its fixed shape (warmed per bucket), then the real
        entries picked on the host."""
        pooled = self._bucket_pooled(fwd.platform_data, hidden).to("cpu")
        return pooled[indices]

    def _bucket_pooled(self, batch: HPUBatch, hidden: torch.Tensor) -> torch.Tensor:
        """[B, out]: every entry of a prompt bucket pooled (padding entries too)."""
        lengths = batch.attn_metadata.query_lens
        size = lengths.shape[0]
        with self.tracker.track_pass(f"pooler {tuple(batch.bucket)}",
                                     ("pooler", tuple(hidden.shape), hidden.dtype, size)):
            return self.model.pooler.pooled_padded(hidden, lengths, size, batch.row_stride)

    def warmup_defragmenter(self) -> None:
        """Every swap bucket of the defragmenter, as no-op swaps of the pad block."""
        if self.defragmenter is None or not self.defragmenter.max_moves:
            return
        for bucket in swap_buckets(self.defragmenter.max_moves):
            with self._track_swap(bucket):
                swap_blocks(self._cache_tensors(), [], self.block_size, self.pad_block_id,
                            bucket=bucket)

    def capture_graph(self, is_prompt: bool, bucket: Bucket) -> None:
        """Record the HPU graph of a bucket; later passes in it replay the graph."""
        self.graphed_buckets.add((is_prompt, bucket))
        self.run_dummy_batch(is_prompt, bucket, use_graph=True)

    def measure_graph_memory(self, usable: int, upper: int) -> GraphReservePlan:
        """Capture probe graphs on a temporary KV cache, fit the graph memory models
        and return the reserve every bucket's graph needs (graph_memory.py), for a KV
        cache of at most `upper` blocks; the probe graphs and the cache are dropped."""
        # Every TP rank probes the same buckets (each probe is a collective): the
        # smallest rank's limits decide, as they decide the KV cache.
        tp = get_tp_group()
        upper = max(1, tp.all_reduce_int(upper, "min"))
        usable = tp.all_reduce_int(usable, "min")
        decode = [] if self.is_pooling else self.bucketing.decode_grid(upper)
        rows = max((b.batch_size for b in decode), default=1)
        # At most a quarter of what the cache could hold: the probe graphs need room too.
        probe_blocks = max(1, min(upper // 4, max(rows, PROBE_CACHE_BLOCKS)))
        self.num_kv_blocks, self.pad_block_id = probe_blocks, probe_blocks
        self._restore_kv_cache()
        samples: dict[bool, list[tuple[Bucket, int]]] = {True: [], False: []}
        try:
            for is_prompt, buckets in ((True, self.bucketing.prompt_buckets), (False, decode)):
                for bucket in probe_buckets(is_prompt, buckets, probe_blocks):
                    used = self._probe_capture(is_prompt, bucket)
                    if used is not None:
                        samples[is_prompt].append((bucket, used))
        finally:
            self._drop_graphs()
            self.kv_caches, self.defragmenter = [], None
            self.num_kv_blocks, self.pad_block_id = 0, -1
            gc.collect()
        self.graph_models = fit_models(samples)
        plan = plan_graph_reserve(*self.graph_models, self.bucketing.prompt_buckets, decode,
                                  usable)
        log_graph_models(self.graph_models, plan, len(self.bucketing.prompt_buckets),
                         len(decode))
        return plan

    def _probe_capture(self, is_prompt: bool, bucket: Bucket) -> Optional[int]:
        """Bytes one capture took (the most any TP rank measured), or None when some
        rank has no device memory left or its device refused the capture."""
        tp = get_tp_group()
        before, failed = habana.mem_get_info()[0], False
        if tp.all_reduce_int(before, "min") <= 0:
            return None  # some rank cannot hold any graph: none is captured anywhere
        try:
            with torch.inference_mode():  # the forward's graph only: no sampler warmup
                self._run_batch(self.dummy_batch(is_prompt, bucket), use_graph=True)
            habana.synchronize()
        except Exception as error:  # noqa: BLE001 - only a device OOM is absorbed
            if not (is_device_oom(error) and oom_is_recoverable(tp)):
                raise
            failed = True
            logger.warning("Graph memory probe %s out of device memory: %s", tuple(bucket),
                           error)
        return reduce_capture(tp.all_reduce_int, before - habana.mem_get_info()[0],
                              failed)

    def _drop_graphs(self) -> None:
        """Free every captured graph: a fresh wrapper captures again on first use."""
        habana.release_hpu_graphs(self.forward_module)
        self.forward_module = prepare_forward_module(
            self.model, self.attn_impl, self.mode,
            lora_batch=self.lora_manager.batch if self.lora_manager else None)
        self.graphed_buckets.clear()
        self._graph_keys.clear()
        self.graph_bytes.clear()
        self.num_graph_captures = self.num_graph_replays = 0

    def release_graphs(self) -> None:
        """Shutdown: free the captured graphs (on the fake HPU, their ledger entries)."""
        if self.uses_hpu_graphs and getattr(self, "forward_module", None) is not None:
            habana.release_hpu_graphs(self.forward_module)

    def _forget_graph(self, is_prompt: bool, bucket: Bucket) -> None:
        """A capture failed: the bucket runs without a graph (and is never retried)."""
        self.graphed_buckets.discard((is_prompt, bucket))
        self.graph_refused.add((is_prompt, bucket))

    @torch.inference_mode()
    def profile_run(self) -> None:
        """The largest prompt pass without a KV cache: peak activation memory."""
        largest = max(self.bucketing.prompt_buckets, key=lambda b: (b.batch_size * b.query_len, b))
        bucket = Bucket(largest.batch_size, largest.query_len, 0)  # no cache to read yet
        batch = self._dummy_prompt_batch(bucket)
        before = MemorySnapshot.take()
        with self.profiler.record("profile_run", bucket=tuple(bucket)):
            self._run_batch(batch, use_graph=False, kv_caches=[])
        habana.synchronize()
        log_profile_run(before, bucket)

    def warmup_model(self) -> None:
        """Compile every bucket (and capture HPU graphs) before serving."""
        self.capture_on_first_use = False  # warmed: graphs follow the memory budget
        with self.profiler.record("warmup"):
            result = HPUWarmup(self.warmup_ops()).run()
            if getattr(self, "vision_encoder", None) is not None:
                self.vision_encoder.warmup()
        self.tracker.finish_warmup()
        self.warmup_seconds = result.seconds
        self.cold_buckets = [b for _, b in result.cold]
        for phase in (True, False):
            cold = {b for p, b in result.cold if p == phase}
            for bucket in cold:
                self.bucketing.drop_cold_bucket(phase, bucket, cold)
        logger.info("Warmup finished in %.0f secs, allocated %s of device memory "
                    "(%d graph compilations).", result.seconds,
                    format_bytes(result.allocated_bytes), self.tracker.num_compiles_warmup)

    def warmup_ops(self) -> WarmupOps:
        """The buckets and operations the warmup runs (it sees nothing else)."""
        plan = self.bucketing.plan
        if envs.VLLM_WARMUP_BUDGET_S < 0:
            raise ValueError(f"VLLM_WARMUP_BUDGET_S must be >= 0, got "
                             f"{envs.VLLM_WARMUP_BUDGET_S}.")
        return WarmupOps(
            prompt_buckets=self.bucketing.prompt_buckets,
            # A pooling request ends with its prompt: nothing ever decodes.
            decode_buckets=[] if self.is_pooling else self.bucketing.decode_buckets,
            block_size=self.block_size,
            mode=self.mode, uses_hpu_graphs=self.uses_hpu_graphs, mem_margin=self.mem_margin,
            run_dummy_batch=lambda is_prompt, bucket: self.run_dummy_batch(
                is_prompt, bucket, use_graph=False),
            capture_graph=self.capture_graph, forget_graph=self._forget_graph,
            warmup_defragmenter=self.warmup_defragmenter, graph_models=self.graph_models,
            prompt_traffic=plan.traffic(True) if plan is not None else None,
            decode_traffic=plan.traffic(False) if plan is not None else None,
            budget_s=envs.VLLM_WARMUP_BUDGET_S)

    def skip_warmup(self) -> None:
        """No warmup; with HPU graphs each bucket's graph is captured on first use."""
        logger.warning("VLLM_SKIP_WARMUP is set: buckets compile on first use while "
                       "serving (expect slow first requests)%s.",
                       "; HPU graphs are captured on first use" if self.uses_hpu_graphs else "")
        self.capture_on_first_use = self.uses_hpu_graphs
        self.tracker.finish_warmup()

    # ---------------------------------------------------------------- execute
    def execute_model(self, so: SchedulerOutput) -> Optional[ModelRunnerOutput]:
        """The base's step; every TP rank runs the passes, only the driver samples."""
        output = super().execute_model(so)
        if so.total_num_scheduled_tokens:
            self.tracker.end_step()
        return output

    def _prepare_inputs(self, so: SchedulerOutput) -> list[ForwardPass]:
        """Defragment, then one pass per bucketed batch: decodes, then prompts."""
        self._defragment()
        prompts, decodes = self._describe(so, list(so.num_scheduled_tokens))
        passes = []
        for batch in self._make_batches(prompts, decodes):
            stride = batch.row_stride
            passes.append(ForwardPass(
                input_ids=batch.input_ids, positions=batch.positions,
                attn_metadata=batch.attn_metadata, req_ids=[s.req_id for s in batch.seqs],
                row_offsets=[i * stride for i in range(batch.num_real)],
                num_tokens=[s.query_len if batch.is_prompt else 1 for s in batch.seqs],
                num_rows=batch.input_ids.shape[0],
                sample_req_ids=[s.req_id for s in batch.seqs if s.sample],
                platform_data=batch))
        return passes

    def _execute_pass(self, fwd: ForwardPass) -> PassOutput:
        """The bucket's [B, vocab] logits (a fixed shape per bucket, also for the
        logits processors); the base picks the sampling rows after them."""
        batch: HPUBatch = fwd.platform_data
        with self.calibration(self._real_rows(batch) if self.calibrating else None):
            hidden, logits = self._run_serving_batch(batch, fwd)
        if self.is_pooling:
            return PassOutput(hidden_states=hidden, sample_logits=None)
        if logits is None:
            return None  # a pipeline stage before the last: its activations went on
        rows = [i for i, s in enumerate(batch.seqs) if s.sample]
        if not rows:
            return PassOutput(hidden_states=hidden, sample_logits=None)
        row_req_ids: list[Optional[str]] = [None] * logits.shape[0]
        for i in rows:
            row_req_ids[i] = batch.seqs[i].req_id
        return PassOutput(hidden_states=hidden, sample_logits=logits,
                          logits_req_ids=row_req_ids,
                          sample_rows=torch.tensor(rows, device=logits.device))

    def _run_serving_batch(self, batch: HPUBatch, fwd: ForwardPass
                           ) -> tuple[Any, Optional[torch.Tensor]]:
        """The pass; a graph captured on first use that runs out of device memory is
        dropped and the pass runs again without one (its KV writes are the same). With
        pipeline stages the pass cannot be repeated (it consumed its input), and with
        tensor parallelism the peers are inside the pass's collectives: raised."""
        use_graph = self._graphed(batch)
        if use_graph:
            self._wait_kv_loads()  # a replayed graph cannot wait layer by layer
        run = functools.partial(self._run_batch, batch, lora_slots=fwd.lora_mapping,
                                serving=True, inputs_embeds=fwd.inputs_embeds,
                                positions=fwd.positions)
        try:
            return run(use_graph=use_graph)
        except Exception as error:  # noqa: BLE001 - only a device OOM is absorbed
            if (not (use_graph and is_device_oom(error)) or get_pp_group().world_size > 1
                    or not oom_is_recoverable(get_tp_group())):
                raise
            logger.warning("HPU graph capture of bucket %s ran out of device memory (%s); "
                           "it runs without a graph.", tuple(batch.bucket), error)
            self._forget_graph(batch.is_prompt, batch.bucket)
            return run(use_graph=False)

    def _defragment(self) -> None:
        if self.defragmenter is None:
            return
        self._wait_kv_loads()  # it moves blocks a KV load may be writing
        used = {b for st in self.requests.values() for b in st.block_ids}
        self.defragmenter.defragment(used, self._cache_tensors(), track=self._track_swap)

    def _track_swap(self, bucket: int):
        """The tracker's context for a defragmenter swap of `bucket` block pairs."""
        caches = self._cache_tensors()
        signature = ("defrag_swap", bucket, len(caches),
                     tuple(caches[0].shape) if caches else (),
                     caches[0].dtype if caches else None)
        return self.tracker.track_pass(f"defrag swap {bucket}", signature)

    def _physical(self, block_ids: list[int]) -> list[int]:
        if self.defragmenter is None:
            return block_ids
        return self.defragmenter.resolve_table(block_ids)

    def _describe(self, so: SchedulerOutput, req_ids: list[str]
                  ) -> tuple[list[PromptSeq], list[DecodeSeq]]:
        """One PromptSeq / DecodeSeq per scheduled request, in physical block ids."""
        bs = self.block_size
        prompts: list[PromptSeq] = []
        decodes: list[DecodeSeq] = []
        for req_id in req_ids:
            st = self.requests[req_id]
            n = so.num_scheduled_tokens[req_id]
            start = st.num_computed_tokens
            table = self._physical(st.block_ids)
            sample = start + n == st.num_tokens
            if n == 1 and start >= len(st.prompt_token_ids):
                decodes.append(DecodeSeq(req_id, st.token_ids[start], start,
                                         table[start // bs] * bs + start % bs, start + 1,
                                         table[:start // bs + 1], sample))
                continue
            if req_id in self.num_draft_tokens:
                # Draft verification: one decode row per token, each sampling.
                decodes.extend(DecodeSeq(req_id, st.token_ids[p], p,
                                         table[p // bs] * bs + p % bs, p + 1,
                                         table[:p // bs + 1], True)
                               for p in range(start, start + n))
                continue
            pos = np.arange(start, start + n, dtype=np.int64)
            slots = np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs
            groups = (bidirectional_span_ids(st.mm_inputs, start, n)
                      if st.mm_inputs and self._bidirectional_mm else None)
            prompts.append(PromptSeq(req_id, np.asarray(st.token_ids[start:start + n],
                                                        dtype=np.int64),
                                     pos, slots, start, table[:-(-start // bs)], sample,
                                     groups))
        return prompts, decodes

    def _make_batches(self, prompts: list[PromptSeq], decodes: list[DecodeSeq]
                      ) -> list[HPUBatch]:
        """The decode pass, then the prompt passes, writers before readers."""
        bs = self.block_size
        batches = []
        if decodes:
            blocks = decode_blocks_needed(decodes, bs, self.contiguous_pa)
            bucket = self.bucketing.find_decode_bucket(len(decodes), blocks)
            self.accounting.decode_pass(bucket, len(decodes), blocks)
            batches.append(build_decode_batch(decodes, bucket, bs, self.pad_block_id,
                                              self.contiguous_pa, self.dtype, self.device))
        for level in dependency_levels(prompts, bs):
            self.accounting.prompt_set([s.query_len for s in level],
                                       [s.num_context_blocks for s in level])
            for group in group_prompts(level, self.bucketing.covering_prompt_bucket, bs,
                                       self.prompt_pass_overhead):
                bucket = self.bucketing.find_prompt_bucket(
                    len(group), max(s.query_len for s in group),
                    max(s.num_context_blocks for s in group))
                self.accounting.prompt_pass(bucket, [s.query_len for s in group],
                                            [s.num_context_blocks for s in group])
                batches.append(build_prompt_batch(group, bucket, bs, self.pad_block_id,
                                                  self.device, self._bidirectional_mm))
        return batches

    def _real_rows(self, batch: HPUBatch) -> torch.Tensor:
        """[rows] bool: True at the rows of real tokens (not bucket padding)."""
        mask = torch.zeros(batch.input_ids.shape[0], dtype=torch.bool)
        for i, seq in enumerate(batch.seqs):
            n = seq.query_len if batch.is_prompt else 1
            mask[i * batch.row_stride:i * batch.row_stride + n] = True
        return mask.to(batch.input_ids.device)

    def _graphed(self, batch: HPUBatch) -> bool:
        """Whether the pass runs through an HPU graph: a bucket captured at warmup, or,
        captured now on first use, any bucket with VLLM_SKIP_WARMUP and a fallback
        bucket beyond the warmed range."""
        if not self.uses_hpu_graphs:
            return False
        key = (batch.is_prompt, batch.bucket)
        if key in self.graphed_buckets:
            return True
        if key in self.graph_refused:
            return False
        if self.capture_on_first_use or batch.bucket in self.bucketing.fallback_buckets:
            if not self._first_use_fits(key):
                return False
            logger.info("Capturing the HPU graph of %s bucket %s on first use.",
                        "prompt" if batch.is_prompt else "decode", tuple(batch.bucket))
            self.graphed_buckets.add(key)
            return True
        return False

    def _first_use_fits(self, key: tuple[bool, Bucket]) -> bool:
        """A graph captured while serving must fit above the memory margin by the
        measured model (no model: try, the out-of-memory guard catches a failure)."""
        if self.graph_models is None:
            return True
        is_prompt, bucket = key
        need = self.graph_models[0 if is_prompt else 1].estimate(bucket)
        free = habana.mem_get_info()[0] - self.mem_margin
        if need <= free:
            return True
        logger.warning("Not capturing the HPU graph of %s bucket %s: it needs about %s, %s "
                       "is free above the memory margin; it runs without a graph.",
                       "prompt" if is_prompt else "decode", tuple(bucket),
                       format_bytes(int(need)), format_bytes(max(0, free)))
        self.graph_refused.add(key)
        return False

    def _lora_slot_tensor(self, batch: HPUBatch, slots: Optional[np.ndarray]
                          ) -> Optional[torch.Tensor]:
        """With LoRA, every pass (warmup and base-only ones too) carries a [rows] slot
        tensor (-1: no adapter), so the graph signature never depends on the adapters."""
        if self.lora_manager is None:
            return None
        if slots is None:
            return torch.full((batch.input_ids.shape[0],), -1, dtype=torch.long,
                              device=self.device)
        return torch.from_numpy(slots).to(self.device)

    def _stage_input(self, batch: HPUBatch, serving: bool) -> Optional[IntermediateTensors]:
        """A later pipeline stage's input: the previous stage's activations (serving) or,
        in warmup and profiling, zeros of the same shape. Both have the bucket's padded
        row count, because every stage lays the step out in the same bucketed passes."""
        pp = get_pp_group()
        if pp.is_first_rank:
            return None
        rows = batch.input_ids.shape[0]
        if not serving:
            return self.model.make_empty_intermediate_tensors(rows, self.dtype, self.device)
        received = pp.recv_tensor_dict(device=self.device)
        for name, t in received.items():
            if t.shape[0] != rows:
                raise RuntimeError(f"pipeline stage received {name} with {t.shape[0]} rows "
                                   f"for a pass of {rows} rows (bucket {tuple(batch.bucket)}): "
                                   "the stages laid the step out differently.")
        return IntermediateTensors(received)

    def _run_batch(self, batch: HPUBatch, use_graph: bool,
                   kv_caches: Optional[list[torch.Tensor]] = None,
                   lora_slots: Optional[np.ndarray] = None, serving: bool = False,
                   inputs_embeds: Optional[torch.Tensor] = None,
                   positions: Optional[torch.Tensor] = None
                   ) -> tuple[Any, Optional[torch.Tensor]]:
        """Forward pass plus logits at the batch's [B] logits rows.

        `positions`: the pass's (a served pass's, after the M-RoPE hook); default
        the batch's, as [3, rows] for an M-RoPE model (warmup and profiling).
        On a pipeline stage before the last: its IntermediateTensors, sent on to the
        next stage when `serving`, and no logits (None)."""
        kv = self.kv_caches if kv_caches is None else kv_caches
        if positions is None:
            positions = batch.positions
            if getattr(self.model, "uses_mrope", False):
                positions = positions.unsqueeze(0).repeat(3, 1)
        lora = self._lora_slot_tensor(batch, lora_slots)
        intermediate = self._stage_input(batch, serving)
        phase = "prompt" if batch.is_prompt else "decode"
        label = f"{phase} {tuple(batch.bucket)}"
        inputs_embeds = self._prompt_embeds(batch, inputs_embeds, label)
        signature = None if use_graph else (
            self.mode.value, bool(kv),
            input_signature((batch.input_ids, positions, batch.attn_metadata, lora,
                             intermediate, inputs_embeds)),
            baked_constants(self.model))
        free_before = None
        if use_graph:
            key = (batch.is_prompt, batch.bucket, lora is not None, bool(kv))
            if key not in self._graph_keys:  # this pass captures: measure what it keeps
                free_before = habana.mem_get_info()[0]
            self._count_graph_run(key)
        with self.profiler.record(phase, bucket=tuple(batch.bucket), real=batch.num_real,
                                  graph=use_graph), \
                self.tracker.track_pass(label, signature), \
                set_state_metadata(self._batch_state_metadata(batch)):
            hidden = run_forward(self.forward_module, self.mode, use_graph, batch.input_ids,
                                 positions, batch.attn_metadata, kv, lora, intermediate,
                                 inputs_embeds)
        if free_before is not None:
            habana.synchronize()  # once per capture: the graph's memory is now allocated
            self.graph_bytes[key] = max(0, free_before - habana.mem_get_info()[0])
        if not get_pp_group().is_last_rank:
            if serving:
                get_pp_group().send_tensor_dict(hidden.tensors)
            return hidden, None
        if self.is_pooling:
            return hidden, None  # the pooler reads the hidden states (pooled_rows)
        # The logits gather runs outside the graph: a shape of its own, tracked.
        with self.tracker.track_pass(f"logits {tuple(batch.logits_indices.shape)}",
                                     ("logits", tuple(hidden.shape), hidden.dtype,
                                      tuple(batch.logits_indices.shape))):
            logits = self.model.compute_logits(hidden.index_select(0, batch.logits_indices))
        return hidden, logits

    def _batch_state_metadata(self, batch: HPUBatch) -> Optional[StateMetadata]:
        """State slots of the pass's rows (state-space layers): one per batch entry, the
        pad slot for padding and warmup entries; a fixed [B] shape per bucket."""
        if self.state_cache is None:
            return None
        entries = batch.input_ids.shape[0] // batch.row_stride
        pad = entries - batch.num_real
        req_ids = [s.req_id for s in batch.seqs] + [None] * pad
        if batch.is_prompt:
            num_tokens = [s.query_len for s in batch.seqs] + [0] * pad
            computed = [s.context_len for s in batch.seqs] + [0] * pad
        else:
            num_tokens = [1] * batch.num_real + [0] * pad
            computed = [1] * batch.num_real + [0] * pad
        return self.state_cache.padded_metadata(req_ids, num_tokens, computed, self.device)

    def _prompt_embeds(self, batch: HPUBatch, inputs_embeds: Optional[torch.Tensor],
                       label: str) -> Optional[torch.Tensor]:
        """A multimodal model's prompt passes always take embeddings (images merged in,
        or the tokens' own), so each prompt bucket has one signature, the one its warmup
        compiled; the embedding lookup is its own tracked shape."""
        if (inputs_embeds is not None or not batch.is_prompt
                or getattr(self, "vision_encoder", None) is None
                or not get_pp_group().is_first_rank):
            return inputs_embeds
        with self.tracker.track_pass(f"embed {label}", ("embed", self.mode.value,
                                                        tuple(batch.input_ids.shape))):
            return self.model.get_input_embeddings(batch.input_ids)

    def _encode_mm_items(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """The vision encoder in bucketed image batches (vllm/hpu/mm_encoder.py)."""
        return self.vision_encoder.encode(items)

    def _count_graph_run(self, key: tuple) -> None:
        """Graph captures (first run of a key) and replays, counted by the runner so
        the numbers exist on hardware too (the fake graphs keep their own books)."""
        if key in self._graph_keys:
            self.num_graph_replays += 1
        else:
            self._graph_keys.add(key)
            self.num_graph_captures += 1

    # ------------------------------------------------------------------ stats
    def get_compile_stats(self) -> dict:
        stats = dict(self.tracker.stats())
        stats.update(execution_mode=self.mode.value, warmup_done=self.tracker.warmup_done,
                     warmup_seconds=self.warmup_seconds,
                     num_prompt_buckets=self.bucketing.num_prompt_buckets,
                     num_decode_buckets=self.bucketing.num_decode_buckets,
                     num_fallback_buckets=len(self.bucketing.fallback_buckets),
                     num_graphed_buckets=len(self.graphed_buckets),
                     num_graph_captures=self.num_graph_captures,
                     num_graph_replays=self.num_graph_replays,
                     buckets=self.get_bucket_stats())
        return stats

    def get_bucket_stats(self) -> dict:
        """Padding (padded vs real compute per phase), bucket hits, fallback passes
        since warmup, and what the warmup left cold (see bucket_accounting.py)."""
        stats = self.accounting.stats()
        stats.update(warmup_seconds=self.warmup_seconds,
                     num_compiles_after_warmup=self.tracker.num_compiles_after_warmup,
                     cold_buckets=[list(b) for b in self.cold_buckets],
                     graph_memory_bytes=self.graph_memory_bytes())
        return stats

    def graph_memory_bytes(self) -> dict[str, int]:
        """Device bytes held by the captured HPU graphs, per phase, as measured when
        each was captured (`graph_bytes`); dropped graphs are no longer counted."""
        held = {"prompt": 0, "decode": 0}
        for (is_prompt, *_), nbytes in self.graph_bytes.items():
            held["prompt" if is_prompt else "decode"] += nbytes
        return held

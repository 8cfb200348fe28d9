"""The CUDA model runner: token-major layout, Triton or torch_sdpa metadata, CUDA graphs.

The rows are the CPU runner's flat, unpadded layout (`flat_layout.py`). With the
Triton backend (the CUDA default) every request is one sequence of the metadata,
decodes and prefills alike (attention/backends/triton_attn.py), and a step of at
most `max_cudagraph_capture_size` tokens replays a captured CUDA graph
(cuda_graphs.py). With torch_sdpa (`--attention-backend TORCH_SDPA`, MLA models, or
no triton) decodes are row-wise requests first, prefills SDPA, always eager.

Host-side arrays are staged in pinned memory and copied with non_blocking=True, so
the copies overlap the work that follows; the first `.tolist()` of the sampled
tokens is the step's only synchronisation. States, prompt logprobs, sampling and
the output are the base's (`model_runner_base.py`).

Works on any torch device: the tests lay out inputs, run the Triton kernels through
Triton's interpreter and replay stand-in graphs with device="cpu".
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import numpy as np
import torch

from vllm.attention.backends.triton_attn import (TritonAttentionBackendImpl,
                                                 TritonAttentionMetadata, build_triton_inputs,
                                                 upload)
from vllm.config import VllmConfig
from vllm.core.sched_output import SchedulerOutput
from vllm.forward_context import set_forward_context
from vllm.worker.cuda_graphs import CudaGraphRunner, EagerGraph, TorchCudaGraph
from vllm.worker.flat_layout import (FlatLayout, build_flat_layout, decode_first_layout,
                                     flat_forward_pass, kv_cache_shape, order_batch)
from vllm.worker.model_runner_base import ForwardPass, ModelRunnerBase, PassOutput

logger = logging.getLogger(__name__)


class GPUModelRunner(ModelRunnerBase):
    """Input layout, attention metadata, CUDA graphs and execution on CUDA (the rest:
    the base)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str = "cuda",
                 graph_factory: Optional[Callable[[], Any]] = None) -> None:
        super().__init__(vllm_config, device)
        self.pin_memory = self.device.type == "cuda"
        self.triton = isinstance(self.attn_impl, TritonAttentionBackendImpl)
        self.graph_factory = graph_factory or (
            TorchCudaGraph if self.device.type == "cuda" else EagerGraph)
        """How graphs are made: CUDA graphs on a GPU; the tests pass EagerGraph."""
        self.cudagraphs: Optional[CudaGraphRunner] = None
        """Set by capture_cudagraphs when graphs apply (`graphs_unavailable`)."""

    # -------------------------------------------------------------- setup
    def load_model(self) -> None:
        from vllm.model_executor.model_loader import get_model
        start = time.perf_counter()
        self.model = get_model(self.vllm_config, device=self.device)
        from vllm.model_executor.cpu_offload import offload_layers
        self.cpu_offload = offload_layers(
            self.model, self.vllm_config.cache_config.cpu_offload_gb, self.device)
        if self.cpu_offload.layers and self.device.type == "cuda":
            torch.cuda.empty_cache()  # the freed layers' memory, seen by mem_get_info
        self._load_draft_model(lambda cfg: get_model(cfg, device=self.device), self._draft_pass)
        logger.info("Loading model weights took %.2f s", time.perf_counter() - start)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """torch_sdpa's head-major cache per owned layer (see flat_layout.kv_cache_shape);
        the Triton kernels read the same layout."""
        self.num_kv_blocks = num_blocks
        self.kv_caches = self._allocate_kv_caches(num_blocks, kv_cache_shape)
        self._init_draft_kv_cache(num_blocks, kv_cache_shape)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at the full token budget without KV cache, plus logits for
        max_num_seqs rows: the activation peak the KV cache must leave room for."""
        sc = self.vllm_config.scheduler_config
        n = min(sc.max_num_batched_tokens, self.model_config.max_model_len)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        hidden = self.model(ids, torch.arange(n, device=self.device))
        self.model.compute_logits(hidden[-min(n, sc.max_num_seqs):])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---------------------------------------------------------- CUDA graphs
    def graphs_unavailable(self) -> Optional[str]:
        """Why this engine runs every step eagerly (None: graphs apply)."""
        cfg = self.vllm_config
        if not cfg.compilation_config.cudagraph_capture_sizes:
            return "cudagraph_mode NONE or --enforce-eager"
        if not self.triton:
            return "the attention backend is not TRITON_ATTN"
        reasons = {
            "tensor/pipeline parallel": cfg.parallel_config.world_size > 1,
            "LoRA": cfg.lora_config is not None,
            "speculative decoding": cfg.speculative_config is not None,
            "a multimodal model": self.model_config.is_multimodal_model,
            "a pooling model": getattr(self.model_config, "runner_type", "") == "pooling",
            "INC calibration": self.calibrating,
            "a KV connector": cfg.kv_transfer_config is not None,
            # the first forward would take its scales from the capture's padding rows
            "calculate_kv_scales": cfg.cache_config.calculate_kv_scales,
            # expert routing reads per-expert row counts back to the host
            "MoE layers": self._has_moe_layers(),
            # the mixers read and write their requests' state slots through per-pass
            # metadata (host lists) that a replayed graph would not have
            "state-space layers": self._has_state_layers(),
        }
        found = [name for name, present in reasons.items() if present]
        return f"not captured with {', '.join(found)}" if found else None

    def _has_moe_layers(self) -> bool:
        from vllm.model_executor.layers.fused_moe import FusedMoE
        return self.model is not None and any(isinstance(m, FusedMoE)
                                              for m in self.model.modules())

    def _has_state_layers(self) -> bool:
        return self.model is not None and any(callable(getattr(m, "state_spec", None))
                                              for m in self.model.modules())

    def max_blocks_per_seq(self) -> int:
        return -(-self.model_config.max_model_len // self.block_size)

    @torch.inference_mode()
    def capture_cudagraphs(self, progress: bool = True) -> None:
        """Capture one graph per size (after the KV cache exists: graphs hold its
        address), logging time and memory as vLLM does."""
        reason = self.graphs_unavailable()
        if reason is not None:
            logger.info("CUDA graphs off (%s): every step runs eagerly.", reason)
            self.cudagraphs = None
            return
        sizes = self.vllm_config.compilation_config.cudagraph_capture_sizes
        self.cudagraphs = CudaGraphRunner(
            sizes, self.vllm_config.compilation_config.cudagraph_mode == "FULL_DECODE_ONLY",
            self.max_blocks_per_seq(), self.block_size, self.device, self.graph_factory)
        free_before = self._free_memory()
        seconds = self.cudagraphs.capture_all(self._graph_forward, progress)
        used = free_before - self._free_memory()
        logger.info("Graph capturing finished in %.0f secs, took %.2f GiB (%d sizes, "
                    "1..%d tokens)", seconds, used / 2**30, len(sizes), max(sizes))

    @torch.inference_mode()
    def estimate_cudagraph_memory(self) -> int:
        """Bytes the graphs will hold, measured before the KV cache is sized: the
        largest and the smallest size captured on a one-block stand-in cache (all
        rows padding, so nothing reads it), then freed. Graphs share one pool, so
        the largest holds the activations and each further graph adds about what
        the smallest added. 0 when graphs do not apply or off a GPU."""
        sizes = self.vllm_config.compilation_config.cudagraph_capture_sizes
        if self.graphs_unavailable() is not None or self.device.type != "cuda":
            return 0
        real_caches, real_blocks = self.kv_caches, self.num_kv_blocks
        probe = CudaGraphRunner(sizes, False, self.max_blocks_per_seq(), self.block_size,
                                self.device, self.graph_factory)
        try:
            self.initialize_kv_cache(1)
            base = self._free_memory()
            pool = probe.capture(max(sizes), self._graph_forward)
            largest = base - self._free_memory()
            if len(sizes) > 1:
                probe.capture(min(sizes), self._graph_forward, pool)
            each = max(0, base - self._free_memory() - largest)
        finally:
            probe.drop()
            del probe
            self.kv_caches, self.num_kv_blocks = real_caches, real_blocks
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        estimate = largest + each * (len(sizes) - 1)
        logger.info("CUDA graphs: %.2f GiB estimated for %d sizes (largest %.2f GiB, "
                    "%.1f MiB each further)", estimate / 2**30, len(sizes), largest / 2**30,
                    each / 2**20)
        return estimate

    def _graph_forward(self, ids: torch.Tensor, pos: torch.Tensor,
                       md: TritonAttentionMetadata) -> torch.Tensor:
        with set_forward_context(md, self.kv_caches, self.attn_impl):
            return self.model(ids, pos)

    def _free_memory(self) -> int:
        """Free device memory, the allocator's cached blocks released first: a capture
        releases them itself (torch.cuda.graph empties the cache), so a reading with
        them held made the graphs' memory come out negative (seen on an H200: "took
        -0.14 GiB", an estimate of -0.03 GiB for the largest graph)."""
        if self.device.type != "cuda":
            return 0
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(self.device)[0]

    def _release_kv_cache(self) -> None:
        """Sleep: the graphs point at the cache (and weights) being freed."""
        if self.cudagraphs is not None:
            self.cudagraphs.drop()

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore, then capture again once both weights and cache are back."""
        super().wake_up(tags)
        if self.cudagraphs is not None and not self.sleeping_tags:
            self.capture_cudagraphs(progress=False)

    # ------------------------------------------------------------- inputs
    def _prepare_inputs(self, so: SchedulerOutput) -> list[ForwardPass]:
        """One token-major pass: Triton's sequences, or decodes (row-wise) then SDPA
        prefills."""
        if self.triton:
            req_ids = list(so.num_scheduled_tokens)
            flat = build_flat_layout(self.requests, req_ids, so.num_scheduled_tokens, 0,
                                     self.block_size, self.num_draft_tokens)
            return [self._triton_pass(flat, req_ids)]
        req_ids, num_row_wise = order_batch(self.requests, so.num_scheduled_tokens,
                                            lambda req_id, n: n == 1)
        flat = build_flat_layout(self.requests, req_ids, so.num_scheduled_tokens,
                                 num_row_wise, self.block_size, self.num_draft_tokens)
        return [self._flat_pass(flat, req_ids)]

    def _draft_pass(self, seqs: dict, num_new: dict[str, int]) -> ForwardPass:
        """A draft model's pass (speculative decoding)."""
        if self.triton:  # the proposer reads attn_metadata and the logits rows
            fwd = self._triton_pass(*decode_first_layout(seqs, num_new, self.block_size,
                                                         lambda r, n: False))
            logits_rows, inputs, *_ = fwd.platform_data
            fwd.attn_metadata = upload(inputs, self.block_size, self._to_device)
            fwd.platform_data = logits_rows
            return fwd
        return self._flat_pass(*decode_first_layout(seqs, num_new, self.block_size,
                                                    lambda r, n: n == 1))

    def _flat_pass(self, flat: FlatLayout, req_ids: list[str]) -> ForwardPass:
        return flat_forward_pass(flat, req_ids, self.block_size, self.device, False,
                                 self._to_device)

    def _triton_pass(self, flat: FlatLayout, req_ids: list[str]) -> ForwardPass:
        """Every request one sequence (flat.prefills, since no row is row-wise).
        `platform_data`: (sampling rows, host inputs, host token ids and positions, the
        graph size that will replay the step or None); the device metadata is built,
        and the ids and positions uploaded, only for eager steps (`_execute_pass`)."""
        seqs = flat.prefills
        inputs = build_triton_inputs(flat.slots, [s.query_len for s in seqs],
                                     [s.context_len + s.query_len for s in seqs],
                                     flat.prefill_block_ids, self.block_size)
        ids = np.asarray(flat.token_ids, dtype=np.int64)
        pos = np.asarray(flat.positions, dtype=np.int64)
        size = self.cudagraphs.size_for(inputs) if self.cudagraphs is not None else None
        if size is None:
            input_ids, positions = self._to_device(ids), self._to_device(pos)
        else:  # the replay fills the graph's static buffers itself: nothing to upload
            input_ids, positions = self.cudagraphs.step_inputs(inputs.num_tokens)
        return ForwardPass(
            input_ids=input_ids, positions=positions,
            attn_metadata=None, req_ids=req_ids, row_offsets=flat.row_offsets,
            num_tokens=flat.num_tokens, num_rows=len(flat.token_ids),
            sample_req_ids=flat.sample_req_ids,
            platform_data=(flat.logits_indices, inputs, ids, pos, size))

    def _to_device(self, values: list[int] | np.ndarray) -> torch.Tensor:
        """The values on the device (int64 for lists), staged in pinned memory and
        copied async."""
        host = (torch.from_numpy(values) if isinstance(values, np.ndarray)
                else torch.tensor(values, dtype=torch.long))
        if self.pin_memory:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    # ---------------------------------------------------------- execution
    def _execute_pass(self, fwd: ForwardPass) -> Optional[PassOutput]:
        """torch_sdpa: the base's. Triton: a graph replay when one serves the step
        (and nothing in the pass needs an eager forward), else an eager forward."""
        if not self.triton:
            return super()._execute_pass(fwd)
        logits_rows, inputs, ids, pos, size = fwd.platform_data
        if size is not None and (fwd.lora_mapping is not None
                                 or fwd.inputs_embeds is not None):
            # graphs_unavailable keeps graphs off for LoRA and multimodal models, whose
            # passes read the ids before this point (they were not uploaded).
            raise RuntimeError("a CUDA graph was chosen for a pass with LoRA or input "
                               "embeddings; graphs_unavailable should have ruled it out")
        if size is not None:
            hidden = self.cudagraphs.replay(size, inputs, ids, pos)
        else:
            fwd.attn_metadata = upload(inputs, self.block_size, self._to_device)
            hidden = self._forward(fwd)
            if hidden is None:
                return None
        logits = None
        if fwd.sample_req_ids:
            logits = self.model.compute_logits(self._rows(hidden, logits_rows))
        return PassOutput(hidden_states=hidden, sample_logits=logits)

"""The CUDA model runner: token-major layout and torch_sdpa metadata on a GPU.

The layout is the CPU runner's (`flat_layout.py`) without the native kernel: each
decode is one row-wise request (decodes first, grouped by context length by the
torch backend), every prefill an SDPA prefill. The host-side lists are staged in
pinned memory and copied with non_blocking=True, so the copies overlap the
metadata work that follows; the first `.tolist()` of the sampled tokens is the
step's only synchronisation. States, prompt logprobs, sampling and the output are
the base's (`model_runner_base.py`). CUDA graphs are not captured yet (every pass
runs eagerly).
"""
from __future__ import annotations

import logging
import time
import torch

from vllm.config import VllmConfig
from vllm.core.sched_output import SchedulerOutput
from vllm.worker.flat_layout import (FlatLayout, build_flat_layout, decode_first_layout,
                                     flat_forward_pass, kv_cache_shape, order_batch)
from vllm.worker.model_runner_base import ForwardPass, ModelRunnerBase

logger = logging.getLogger(__name__)


class GPUModelRunner(ModelRunnerBase):
    """Input layout, attention metadata and execution on CUDA (the rest: the base).

    Works on any torch device (the tests lay out inputs with device="cpu"); pinned
    staging is used only for CUDA.
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str = "cuda") -> None:
        super().__init__(vllm_config, device)
        self.pin_memory = self.device.type == "cuda"

    # -------------------------------------------------------------- setup
    def load_model(self) -> None:
        from vllm.model_executor.model_loader import get_model
        start = time.perf_counter()
        self.model = get_model(self.vllm_config, device=self.device)
        self._load_draft_model(lambda cfg: get_model(cfg, device=self.device), self._draft_pass)
        logger.info("Loading model weights took %.2f s", time.perf_counter() - start)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """torch_sdpa's head-major cache per owned layer (see flat_layout.kv_cache_shape)."""
        self.num_kv_blocks = num_blocks
        self.kv_caches = self._allocate_kv_caches(kv_cache_shape(
            num_blocks, self.block_size, self._kv_heads_per_rank(),
            self.model_config.get_head_size(), self._kv_parts()))
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

    # ------------------------------------------------------------- inputs
    def _prepare_inputs(self, so: SchedulerOutput) -> list[ForwardPass]:
        """One token-major pass: decodes (row-wise), then SDPA prefills."""
        req_ids, num_row_wise = order_batch(self.requests, so.num_scheduled_tokens,
                                            lambda req_id, n: n == 1)
        flat = build_flat_layout(self.requests, req_ids, so.num_scheduled_tokens,
                                 num_row_wise, self.block_size, self.num_draft_tokens)
        return [self._flat_pass(flat, req_ids)]

    def _draft_pass(self, seqs: dict, num_new: dict[str, int]) -> ForwardPass:
        """A draft model's pass (speculative decoding): decodes row-wise first."""
        return self._flat_pass(*decode_first_layout(seqs, num_new, self.block_size,
                                                    lambda r, n: n == 1))

    def _flat_pass(self, flat: FlatLayout, req_ids: list[str]) -> ForwardPass:
        return flat_forward_pass(flat, req_ids, self.block_size, self.device, False,
                                 self._to_device)

    def _to_device(self, values: list[int]) -> torch.Tensor:
        """An int64 tensor on the device, staged in pinned memory and copied async."""
        host = torch.tensor(values, dtype=torch.long)
        if self.pin_memory:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

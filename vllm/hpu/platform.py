"""The Intel Gaudi (HPU) platform, real or fake.

On the fake HPU (VLLM_USE_FAKE_HPU=1 or no habana_frameworks) the HPU code path
runs unchanged but tensors live on the CPU. `device_type` stays "hpu" (it names the
backend), so runners must place tensors on `torch_device` ("hpu" on Gaudi, "cpu"
on the fake HPU), never on `device_type`.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from vllm import envs
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)


class HpuPlatform(Platform):
    _enum = PlatformEnum.HPU
    device_name = "hpu"
    device_type = "hpu"
    dist_backend = "hccl"
    supported_dtypes = (torch.bfloat16, torch.float32)

    def __init__(self) -> None:
        # Gaudi's runtime settings, before the bridge is imported. The HPU build's
        # platform plugin has applied them already; a platform chosen without it
        # (VLLM_TARGET_DEVICE=hpu on another build) needs them all the same. A second
        # call sets nothing.
        from vllm.hpu.plugin import apply_runtime_settings
        apply_runtime_settings()
        from vllm.hpu import habana
        self.is_fake = habana.is_fake_hpu()
        self.torch_device = habana.torch_device_type()
        # HCCL exists only on Gaudi; the fake HPU's processes talk over gloo.
        self.dist_backend = "gloo" if self.is_fake else "hccl"
        self._ops_bound = False

    def bind_custom_ops(self) -> None:
        """The HPU kernels of the custom ops and the kernel table (vllm/hpu/ops.py),
        bound by the worker's device initialization or the first layer built,
        whichever comes first (also by the HPU build's `register_ops` plugin). Not when
        the platform is built: a process that only reads the platform (a server's
        frontend, the config) imports no model code."""
        if not self._ops_bound:
            from vllm.hpu.ops import register_hpu_ops
            register_hpu_ops()
            self._ops_bound = True

    def lazy_graph_mode(self) -> bool:
        from vllm.hpu import habana
        return habana.is_lazy()

    def default_block_size(self) -> int:
        return 128  # 16/32 under-use Gaudi's matrix engine

    def get_worker_cls(self) -> str:
        return "vllm.hpu.worker.HPUWorker"

    attn_backends = {"HPU_ATTN": "vllm.hpu.attention.HPUAttentionImpl"}

    def resolve_auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        """bf16 for fp16/fp32 checkpoints: Gaudi's native 16-bit type."""
        if config_dtype in (torch.float16, torch.float32):
            return torch.bfloat16
        return config_dtype if config_dtype in self.supported_dtypes else torch.bfloat16

    def check_and_update_config(self, vllm_config: "VllmConfig") -> None:
        super().check_and_update_config(vllm_config)
        from vllm.hpu import habana
        from vllm.hpu.warmup import check_warmup_knobs
        check_warmup_knobs()  # at start-up, not after the warmup's compile phase
        parallel = vllm_config.parallel_config
        # The bridge's is_lazy() is the one source of truth for the mode (the runner's
        # execution mode and the workers' mark_step before collectives use it too).
        lazy_graphs = habana.is_lazy() and not vllm_config.model_config.enforce_eager
        if parallel.world_size > 1 and lazy_graphs and not envs.PT_HPU_ENABLE_LAZY_COLLECTIVES:
            # Workers are spawned after this point, so they inherit the setting.
            os.environ["PT_HPU_ENABLE_LAZY_COLLECTIVES"] = "true"
            logger.warning("Tensor/pipeline parallel with HPU graphs needs "
                           "PT_HPU_ENABLE_LAZY_COLLECTIVES=true; setting it.")
        if vllm_config.cache_config.calculate_kv_scales:
            raise ValueError(
                "calculate_kv_scales is not supported on HPU: the warmed graphs hold the KV "
                "cache scales as constants, fixed before the first request. Use a checkpoint "
                "with k_scale/v_scale, or measure scales with INC (--quantization inc).")
        _whole_prompts_without_cache(vllm_config)
        if vllm_config.cache_config.block_size != 128:
            logger.info("block_size=%d on HPU; 128 uses Gaudi's matrix engine best.",
                        vllm_config.cache_config.block_size)

    def mem_get_info(self) -> tuple[int, int]:
        from vllm.hpu import habana
        return habana.mem_get_info()

    def synchronize(self) -> None:
        from vllm.hpu import habana
        habana.synchronize()


def _whole_prompts_without_cache(vllm_config: "VllmConfig") -> None:
    """Chunk prompts only where the runner has buckets for the chunks.

    A later chunk of a prompt attends to its earlier chunks as context blocks. The
    runner builds prompt buckets with context only when prefix caching is on or the
    token budget is shorter than max_model_len (where chunking is the only way a
    long prompt runs). Otherwise every prompt fits one step whole, and chunking would
    only cut prompts to fill a step's leftover budget: shapes with context that no
    bucket covers, compiled while serving. There a prompt that does not fit what is
    left of a step waits for the next one instead.
    """
    sc, mc = vllm_config.scheduler_config, vllm_config.model_config
    if (sc.enable_chunked_prefill and not vllm_config.cache_config.enable_prefix_caching
            and sc.max_num_batched_tokens >= mc.max_model_len):
        sc.enable_chunked_prefill = False
        logger.info("Chunked prefill off on HPU: every prompt fits one step "
                    "(max_num_batched_tokens=%d >= max_model_len=%d) and without prefix "
                    "caching no prompt bucket has context blocks.",
                    sc.max_num_batched_tokens, mc.max_model_len)

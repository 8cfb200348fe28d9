"""The CPU model runner: token-major layout, torch_sdpa / native attention metadata.

The batch is flattened token-major with no padding (`flat_layout.py`), row-wise
requests first: every decode and, with the native kernel, the prefills whose length
bucket the start-up measurement (prefill_choice.py) gave to the paged decode kernel;
decodes ordered by context length. Other prefills are marked for the native blocked
prefill kernel or SDPA, again by that measurement. Logits are computed only at rows
that sample (the last token of a request that has caught up with its known tokens);
prompt logprobs, sampling and the output are the base's (`model_runner_base.py`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Optional

import numpy as np
import torch

from vllm.cpu import prefill_choice
from vllm.cpu.autotune import serving_threads
from vllm.cpu.prefill_choice import FLASH, ROWWISE, SDPA, PrefillPlan
from vllm.attention.backends.torch_sdpa import NATIVE_PREFILL_MAX_LEN
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.multimodal.inputs import bidirectional_span_ids
from vllm.cpu import cpu_ops
from vllm.cpu.attention import CpuAttentionImpl
from vllm.worker.flat_layout import (FlatLayout, build_flat_layout, decode_first_layout,
                                     flat_forward_pass, kv_cache_shape, order_batch)
from vllm.cpu.threads import ThreadGovernor, make_governor
from vllm.worker.kv_cache_alloc import note_step
from vllm.worker.model_runner_base import ForwardPass, ModelRunnerBase

logger = logging.getLogger(__name__)


class CPUModelRunner(ModelRunnerBase):
    """Input layout, attention metadata and execution on CPU (the rest: the base)."""

    supports_hybrid_kv_cache = True

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str = "cpu") -> None:
        super().__init__(vllm_config, device)
        # Decode attention by the native kernel (vllm/cpu) where it can run.
        self.native_attention = (
            self.device.type == "cpu" and self.dtype in cpu_ops.DTYPE_CODES
            and isinstance(self.attn_impl, CpuAttentionImpl)
            # MLA attends in its own layer (attention/mla.py), not the native kernels
            and not getattr(self.model_config, "use_mla", False)
            and cpu_ops.usable(torch.empty(0, dtype=self.dtype)))
        self.prefill_plan: Optional[PrefillPlan] = None
        """Prefill attention kernel by length, measured after loading (prefill_choice)."""
        self.thread_governor: Optional[ThreadGovernor] = None
        """Made at the first step, on the thread that runs the forward."""
        self._governor_made = False
        if self.device.type == "cpu":
            keep_freed_memory_mapped()

    def execute_model(self, scheduler_output: SchedulerOutput
                      ) -> Optional[ModelRunnerOutput]:
        """The base's step, with the thread team first sized to the free cores."""
        if self.device.type == "cpu":
            note_step()  # background KV cache commits yield to the steps
            if not self._governor_made:
                self.thread_governor, self._governor_made = make_governor(), True
            if self.thread_governor is not None:
                self.thread_governor.before_step()
        return super().execute_model(scheduler_output)

    # -------------------------------------------------------------- setup
    def load_model(self) -> None:
        start = time.perf_counter()
        self.model = self._load_weights(self.vllm_config)
        # (a model without attention heads, Mamba2, has no prefill attention to plan)
        if self.native_attention and hasattr(self.model_config.hf_text_config,
                                             "num_attention_heads"):
            tp = self.vllm_config.parallel_config.tensor_parallel_size
            heads = max(1, self.model_config.hf_text_config.num_attention_heads // tp)
            self.prefill_plan = prefill_choice.choose_plan(
                heads, self._kv_heads_per_rank(), self.model_config.get_head_size(),
                self.dtype)
        from vllm.lora.models import create_lora_manager
        self.lora_manager = create_lora_manager(self.model, self.vllm_config, self.device,
                                                static_shapes=False)
        self._load_draft_model(self._load_weights, self._draft_pass)
        logger.info("Loading model weights took %.2f s", time.perf_counter() - start)

    def _load_weights(self, vllm_config: VllmConfig) -> torch.nn.Module:
        """A model of `vllm_config`, loaded on one thread, its linears packed."""
        from vllm.model_executor.model_loader import get_model
        with _no_thread_team(self.device):
            model = get_model(vllm_config, device=self.device)
            if self.device.type == "cpu":
                from vllm.cpu.gemm import pack_linear_weights
                pack_linear_weights(model)
        return model

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One [2, kv_heads, num_blocks * block_size, head_size] tensor per owned layer
        (head-major: see vllm/attention/backends/torch_sdpa.py).

        The list is indexed by global layer index; layers of other PP stages get an
        empty placeholder. Zero-filled so masked-out slots never hold NaNs.
        """
        self.num_kv_blocks = num_blocks
        self.kv_caches = self._allocate_kv_caches(num_blocks, kv_cache_shape)
        self._init_draft_kv_cache(num_blocks, kv_cache_shape)

    def _weights_restored(self) -> None:
        """The packed copies were dropped with the weights: pack again, as at load."""
        if self.device.type == "cpu":
            from vllm.cpu.gemm import pack_linear_weights
            with _no_thread_team(self.device):
                pack_linear_weights(self.model)

    # ------------------------------------------------------------- inputs
    def _prefill_kind(self, total_len: int) -> str:
        """The attention kernel of a prefill whose sequence is `total_len` tokens long
        after this step: the measured plan, or without the prefill kernel the fixed
        rule (rowwise up to NATIVE_PREFILL_MAX_LEN tokens, then SDPA)."""
        if not self.native_attention:
            return SDPA
        if self.prefill_plan is None:
            return ROWWISE if total_len <= NATIVE_PREFILL_MAX_LEN else SDPA
        return self.prefill_plan.kind_for(total_len)

    def _is_row_wise(self, req_id: str, n: int) -> bool:
        """Whether this request's n new tokens go through the paged single-query
        kernel, one row per token: every decode, draft verification (speculative
        decoding: each row then computes exactly what a decode step would), and
        prefills where that kernel is the choice for their length (`_prefill_kind`)."""
        if n == 1 or (self.native_attention and req_id in self.num_draft_tokens):
            return True
        if getattr(self.model_config, "is_encoder_only", False):
            return False  # a whole prompt, attended bidirectionally (encoder_attention.py)
        if self._image_spans(req_id, n) is not None:
            return False  # images attended both ways: the masked SDPA path
        return self._prefill_kind(self.requests[req_id].num_computed_tokens + n) == ROWWISE

    def _image_spans(self, req_id: str, n: int) -> Optional[np.ndarray]:
        """The image of each position of a request whose n new tokens reach into an
        image its model attends both ways (Gemma 3), else None (bidirectional_span_ids)."""
        st = self.requests[req_id]
        if not st.mm_inputs or not getattr(self.model, "bidirectional_mm", False):
            return None
        return bidirectional_span_ids(st.mm_inputs, st.num_computed_tokens, n)

    def _prepare_inputs(self, so: SchedulerOutput) -> list[ForwardPass]:
        """One token-major pass without padding (see flat_layout.py)."""
        req_ids, num_row_wise = order_batch(self.requests, so.num_scheduled_tokens,
                                            self._is_row_wise)
        flat = build_flat_layout(self.requests, req_ids, so.num_scheduled_tokens,
                                 num_row_wise, self.block_size, self.num_draft_tokens)
        for req_id, seq in zip(req_ids[num_row_wise:], flat.prefills):
            spans = self._image_spans(req_id, seq.query_len)
            if spans is not None:
                seq.mm_groups = torch.from_numpy(spans)
            seq.flash = (spans is None and
                         self._prefill_kind(seq.context_len + seq.query_len) == FLASH)
        fwd = self._flat_pass(flat, req_ids)
        fwd.group_attn_metadata = self._group_metadata(so, req_ids, num_row_wise, flat)
        return [fwd]

    def _group_metadata(self, so: SchedulerOutput, req_ids: list[str], num_row_wise: int,
                        flat: FlatLayout) -> Optional[list]:
        """The metadata of KV cache groups 1.. (vllm/kv_cache_spec.py): the same rows,
        each group's own slots and block tables."""
        config = self.kv_cache_config
        if config is None or len(config.kv_cache_groups) < 2:
            return None
        metadata = []
        for group in range(1, len(config.kv_cache_groups)):
            layout = build_flat_layout(self.requests, req_ids, so.num_scheduled_tokens,
                                       num_row_wise, self.block_size, self.num_draft_tokens,
                                       group=group)
            for seq, ref in zip(layout.prefills, flat.prefills):
                seq.flash, seq.mm_groups = ref.flash, ref.mm_groups
            metadata.append(self._flat_pass(layout, req_ids).attn_metadata)
        return metadata

    def _draft_pass(self, seqs: dict, num_new: dict[str, int]) -> ForwardPass:
        """A draft model's pass (speculative decoding): decodes row-wise first."""
        k = self.spec_decode.config.num_speculative_tokens
        return self._flat_pass(*decode_first_layout(
            seqs, num_new, self.block_size,
            lambda r, n: n == 1 or (self.native_attention and n <= k + 1)))

    def _flat_pass(self, flat: FlatLayout, req_ids: list[str]) -> ForwardPass:
        return flat_forward_pass(flat, req_ids, self.block_size, self.device,
                                 self.native_attention, self._long_tensor)

    def _long_tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


@contextlib.contextmanager
def _no_thread_team(device: torch.device) -> Iterator[None]:
    """Load on one thread, so this thread starts no OpenMP thread team.

    A server builds the engine on its main thread and then steps it on another one.
    Each thread that runs a parallel region gets its own OpenMP team, and once the
    process holds more OpenMP threads than cores, libgomp stops spin-waiting between
    regions (it "throttles"): every one of the thousand small parallel regions of a
    step then pays a futex wake-up. With 2 cores that made served decode steps ~1.4x
    slower than offline ones. Loading single-threaded costs well under a second.
    """
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with serving_threads(threads):  # kernel timings still use the serving count
            yield
    finally:
        torch.set_num_threads(threads)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory_mapped() -> bool:
    """Stop glibc from returning each freed activation buffer to the OS.

    By default every allocation above 128 KiB is its own mmap, unmapped on free, so
    every prefill-sized intermediate tensor is page-faulted in again, zeroed by the
    kernel, on each use: 5-7x the cost of the op itself for a [512, 576] bf16 tensor.
    Serving from the heap and never trimming it (what tcmalloc, recommended for
    vLLM on CPU, does anyway) keeps those pages. A no-op where glibc is absent.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) or libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        return bool(ok) and bool(libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):
        return False

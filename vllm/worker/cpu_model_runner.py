"""Runs one scheduled step on CPU (also used for CUDA): inputs, forward, sampling.

The batch is flattened token-major with no padding, decodes first (see
torch_sdpa.py for why), and logits are computed only at rows that sample (the last
token of a request that has caught up with its known tokens) and at prompt rows
whose logprobs were asked for.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from vllm.attention.backends.torch_sdpa import (NATIVE_PREFILL_MAX_LEN, PrefillSeq,
                                                TorchSDPABackendImpl, build_metadata)
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.forward_context import set_forward_context
from vllm.native import cpu_ops
from vllm.sample.logprobs import compute_prompt_logprobs
from vllm.sample.metadata import (SamplingMetadata, SamplingRow, greedy_sample,
                                  needs_only_argmax)
from vllm.sample.ops.bitmask import apply_grammar_bitmask
from vllm.sample.sampler import Sampler
from vllm.sequence import IntermediateTensors
from vllm.worker.kv_cache_alloc import zeroed_tensors
from vllm.worker.request_state import CachedRequestState, RequestStates

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: object
    req_ids: list[str]
    logits_indices: list[int]
    """Batch row of each sampling request's last token."""
    sampling_req_ids: list[str]
    prompt_lp_rows: dict[str, tuple[list[int], list[int], bool]]
    """req_id -> (batch rows, next-token targets, prompt finished) for prompt logprobs."""


class CPUModelRunner:

    def __init__(self, vllm_config: VllmConfig, device: torch.device | str = "cpu") -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.block_size = vllm_config.cache_config.block_size
        self.device = torch.device(device)
        self.dtype = self.model_config.torch_dtype
        self.requests = RequestStates(self.device)
        self.sampler = Sampler()
        self.model: Optional[torch.nn.Module] = None
        self.lora_manager = None
        self.kv_caches: list[torch.Tensor] = []
        from vllm.platforms import current_platform
        self.attn_impl = _load_attn_impl(current_platform.get_attn_backend_cls())
        # Decode attention by the native kernel (vllm/native) where it can run.
        self.native_attention = (
            self.device.type == "cpu" and self.dtype in cpu_ops.DTYPE_CODES
            and isinstance(self.attn_impl, TorchSDPABackendImpl)
            and cpu_ops.usable(torch.empty(0, dtype=self.dtype)))
        if self.device.type == "cpu":
            keep_freed_memory_mapped()

    # -------------------------------------------------------------- setup
    def load_model(self) -> None:
        from vllm.model_executor.model_loader import get_model
        start = time.perf_counter()
        with _no_thread_team(self.device):
            self.model = get_model(self.vllm_config, device=self.device)
            if self.device.type == "cpu":
                from vllm.model_executor.layers.cpu_gemm import pack_linear_weights
                pack_linear_weights(self.model)
        from vllm.lora.models import create_lora_manager
        self.lora_manager = create_lora_manager(self.model, self.vllm_config, self.device,
                                                static_shapes=False)
        logger.info("Loading model weights took %.2f s", time.perf_counter() - start)

    def get_kv_cache_block_bytes(self) -> int:
        """Bytes of one KV block across all layers this rank holds."""
        mc = self.model_config
        num_layers = len(self._owned_layer_ids())
        kv_heads = self._kv_heads_per_rank()
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * num_layers * self.block_size * kv_heads * mc.get_head_size() * elem

    def _kv_heads_per_rank(self) -> int:
        tp = self.vllm_config.parallel_config.tensor_parallel_size
        return max(1, self.model_config.get_num_kv_heads() // tp)

    def _owned_layer_ids(self) -> list[int]:
        model = self.model
        start = getattr(model, "start_layer", None)
        end = getattr(model, "end_layer", None)
        if start is None and model is not None and hasattr(model, "model"):
            start = getattr(model.model, "start_layer", None)
            end = getattr(model.model, "end_layer", None)
        if start is None:
            return list(range(self.model_config.get_num_layers()))
        return list(range(start, end))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One [2, kv_heads, num_blocks * block_size, head_size] tensor per owned layer
        (head-major: see vllm/attention/backends/torch_sdpa.py).

        The list is indexed by global layer index; layers of other PP stages get an
        empty placeholder. Zero-filled so masked-out slots never hold NaNs.
        """
        shape = (2, self._kv_heads_per_rank(), num_blocks * self.block_size,
                 self.model_config.get_head_size())
        owned = set(self._owned_layer_ids())
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        caches = iter(zeroed_tensors(shape, self.dtype, self.device, len(owned)))
        self.kv_caches = [next(caches) if i in owned else empty
                          for i in range(self.model_config.get_num_layers())]

    # ------------------------------------------------------------ execute
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> Optional[ModelRunnerOutput]:
        """One step. Only the driver (TP rank 0 of the last PP stage) returns an output."""
        self.requests.update(so)
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        inputs = self._prepare_inputs(so)
        pp = get_pp_group()
        intermediate = None
        if not pp.is_first_rank:
            intermediate = IntermediateTensors(pp.recv_tensor_dict(device=self.device))
        self._set_lora_mapping(inputs.req_ids, so)
        try:
            with set_forward_context(inputs.attn_metadata, self.kv_caches, self.attn_impl):
                hidden = self.model(inputs.input_ids, inputs.positions, intermediate)
        finally:
            if self.lora_manager is not None:
                self.lora_manager.clear_mapping()
        if not pp.is_last_rank:
            pp.send_tensor_dict(hidden.tensors)
            return None
        return self._sample_and_collect(inputs, hidden, so)

    def _set_lora_mapping(self, req_ids: list[str], so: SchedulerOutput) -> None:
        """Each batch row's adapter slot (rows follow `req_ids`, n rows per request)."""
        if self.lora_manager is None:
            return
        lora_requests = [self.requests[r].lora_request for r in req_ids]
        if not any(lora_requests):
            return
        slots = self.lora_manager.step_token_slots(
            lora_requests, [so.num_scheduled_tokens[r] for r in req_ids])
        self.lora_manager.set_token_slots(slots, self.device)

    @property
    def is_driver(self) -> bool:
        """The rank that samples; the others learn the tokens from the next SchedulerOutput."""
        return get_tp_group().is_first_rank and get_pp_group().is_last_rank

    def _is_row_wise(self, req_id: str, n: int) -> bool:
        """Whether this request's n new tokens go through the paged single-query
        kernel, one row per token: every decode, and with the native kernel also short
        prefills (see NATIVE_PREFILL_MAX_LEN)."""
        if n == 1:
            return True
        return (self.native_attention and
                self.requests[req_id].num_computed_tokens + n <= NATIVE_PREFILL_MAX_LEN)

    def _order_batch(self, so: SchedulerOutput) -> tuple[list[str], int]:
        """(request order, how many of them are row-wise): decodes first, shortest
        context first (the torch backend groups decodes of similar length), then
        row-wise prefills, then the other prefills, each in scheduling order."""
        decodes, short, rest = [], [], []
        for r, n in so.num_scheduled_tokens.items():
            (decodes if n == 1 else short if self._is_row_wise(r, n) else rest).append(r)
        decodes.sort(key=lambda r: self.requests[r].num_computed_tokens)
        return decodes + short + rest, len(decodes) + len(short)

    def _prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        bs = self.block_size
        req_ids, num_row_wise = self._order_batch(so)
        num_sched = so.num_scheduled_tokens
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        row_lens: list[int] = []
        row_tables: list[tuple[list[int], int]] = []  # (block ids, rows) per request
        prefills: list[PrefillSeq] = []
        prefill_blocks: list[list[int]] = []
        logits_indices, sampling_ids = [], []
        prompt_lp_rows: dict[str, tuple[list[int], list[int], bool]] = {}
        offset = 0
        for i, req_id in enumerate(req_ids):
            st = self.requests[req_id]
            n = num_sched[req_id]
            start = st.num_computed_tokens
            if n == 1:
                # One token: plain ints are cheaper than numpy for a single element.
                tokens.append(st.token_ids[start])
                positions.append(start)
                slots.append(st.block_ids[start // bs] * bs + start % bs)
            else:
                tokens.extend(st.token_ids[start:start + n])
                positions.extend(range(start, start + n))
                block_ids = np.asarray(st.block_ids, dtype=np.int64)
                p = np.arange(start, start + n)
                slots.extend((block_ids[p // bs] * bs + p % bs).tolist())
            if i < num_row_wise:
                # Row r of this request attends to positions [0, start + r].
                row_lens.extend(range(start + 1, start + n + 1))
                row_tables.append((st.block_ids, n))
            else:
                prefills.append(PrefillSeq(query_start=offset, query_len=n, context_len=start))
                prefill_blocks.append(st.block_ids)
            if start + n == st.num_tokens:
                logits_indices.append(offset + n - 1)
                sampling_ids.append(req_id)
            if st.wants_prompt_logprobs:
                prompt_lp_rows[req_id] = self._prompt_logprob_rows(st, start, n, offset)
            offset += n
        decode_lens = np.asarray(row_lens, dtype=np.int64) if row_lens else None
        decode_table = _row_block_table(row_tables, decode_lens, bs) if row_lens else None
        md = build_metadata(torch.tensor(slots, dtype=torch.long, device=self.device),
                            decode_table, decode_lens, prefills,
                            prefill_blocks, bs, self.device, native=self.native_attention)
        return StepInputs(
            input_ids=torch.tensor(tokens, dtype=torch.long, device=self.device),
            positions=torch.tensor(positions, dtype=torch.long, device=self.device),
            attn_metadata=md, req_ids=req_ids, logits_indices=logits_indices,
            sampling_req_ids=sampling_ids, prompt_lp_rows=prompt_lp_rows)

    @staticmethod
    def _prompt_logprob_rows(st: CachedRequestState, start: int, n: int,
                             offset: int) -> tuple[list[int], list[int], bool]:
        """Rows whose next token is a prompt token (position p predicts p + 1)."""
        num_prompt = len(st.prompt_token_ids)
        end = min(start + n, num_prompt - 1)
        rows = list(range(offset, offset + max(0, end - start)))
        targets = st.prompt_token_ids[start + 1:end + 1]
        return rows, targets, start + n >= num_prompt

    def _sample_and_collect(self, inputs: StepInputs, hidden: torch.Tensor,
                            so: SchedulerOutput) -> Optional[ModelRunnerOutput]:
        sampled: dict[str, list[int]] = {r: [] for r in inputs.req_ids}
        logprobs_out: dict[str, tuple[list[int], list[float], int]] = {}
        if inputs.logits_indices:
            logits = self.model.compute_logits(self._rows(hidden, inputs.logits_indices))
        prompt_lps = self._prompt_logprobs(inputs, hidden)
        if not self.is_driver:
            return None
        if inputs.logits_indices:
            # Structured outputs: tokens the grammar forbids -> -inf (others pay nothing).
            apply_grammar_bitmask(logits, inputs.sampling_req_ids,
                                  so.structured_output_request_ids, so.grammar_bitmask)
            states = [self.requests[r] for r in inputs.sampling_req_ids]
            lp_lists = None
            if all(needs_only_argmax(st.sampling_params, len(st.output_token_ids))
                   for st in states):
                token_ids = greedy_sample(logits).tolist()
            else:
                rows = [self._sampling_row(st) for st in states]
                out = self.sampler(logits, SamplingMetadata.build(rows, logits.shape[-1],
                                                                  self.device))
                token_ids = out.sampled_token_ids.tolist()
                lp = out.logprobs_tensors
                if lp is not None:
                    lp_lists = (lp.logprob_token_ids.tolist(), lp.logprobs.tolist(),
                                lp.selected_token_ranks.tolist())
            for i, (req_id, st) in enumerate(zip(inputs.sampling_req_ids, states)):
                st.append_token(token_ids[i])
                sampled[req_id] = [token_ids[i]]
                k = st.sampling_params.logprobs
                if lp_lists is not None and k is not None:
                    logprobs_out[req_id] = (lp_lists[0][i][:k + 1], lp_lists[1][i][:k + 1],
                                            lp_lists[2][i])
        return ModelRunnerOutput(
            req_ids=inputs.req_ids, sampled_token_ids=[sampled[r] for r in inputs.req_ids],
            logprobs=[logprobs_out.get(r) for r in inputs.req_ids] if logprobs_out else None,
            prompt_logprobs=prompt_lps)

    def _rows(self, hidden: torch.Tensor, indices: list[int]) -> torch.Tensor:
        """hidden[indices]; no copy when they are all rows in order (a decode-only step)."""
        if len(indices) == hidden.shape[0] and indices[-1] == len(indices) - 1:
            return hidden
        return hidden[torch.tensor(indices, device=self.device)]

    def _prompt_logprobs(self, inputs: StepInputs, hidden: torch.Tensor) -> dict:
        result = {}
        for req_id, (rows, targets, done) in inputs.prompt_lp_rows.items():
            st = self.requests[req_id]
            if not rows:
                result[req_id] = ([], [], [])
            else:
                logits = self.model.compute_logits(hidden[torch.tensor(rows)])
                t = compute_prompt_logprobs(logits, torch.tensor(targets, device=self.device),
                                            st.sampling_params.prompt_logprobs)
                result[req_id] = (t.logprob_token_ids.tolist(), t.logprobs.tolist(),
                                  t.selected_token_ranks.tolist())
            if done:
                st.wants_prompt_logprobs = False
        return result

    @staticmethod
    def _sampling_row(st: CachedRequestState) -> SamplingRow:
        return SamplingRow(params=st.sampling_params, prompt_token_ids=st.prompt_token_ids,
                           output_token_ids=st.output_token_ids, generator=st.generator)


def _row_block_table(tables: list[tuple[list[int], int]], seq_lens: np.ndarray,
                     block_size: int) -> np.ndarray:
    """[rows, max_blocks] int64: each request's block ids (as many as its longest row
    needs) repeated for each of its rows, zero padded."""
    width = -(-int(seq_lens.max()) // block_size)
    table = np.zeros((len(seq_lens), width), dtype=np.int64)
    row = 0
    for blocks, count in tables:
        needed = -(-int(seq_lens[row + count - 1]) // block_size)
        table[row:row + count, :needed] = blocks[:needed]
        row += count
    return table


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


def _load_attn_impl(qualname: str):
    import importlib
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)()

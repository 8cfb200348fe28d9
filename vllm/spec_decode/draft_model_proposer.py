"""Drafts from a small model of the same tokenizer, run in the target's worker.

The draft model gets its own KV cache with the target's block layout: the same
block ids and slots (`block_table[p // bs] * bs + p % bs`), its own layer shapes,
so it needs no block manager of its own. Per request the proposer remembers which
tokens the draft cache holds (`_cached`); at each step it:

1. catches up on the request's known tokens the draft has not seen (the prompt at
   first, then the tokens the target just emitted) in one pass for all requests,
   and takes the argmax at the last one: draft d_0;
2. feeds d_0 .. d_{k-2} back one decode pass at a time for d_1 .. d_{k-1}.

Accepted drafts are then already in the draft cache; the KV of rejected ones is
overwritten later (`_cached` is cut at the first token that differs). The drafts'
own positions lie past the request's known tokens: the scheduler reserves those
slots (`num_lookahead_tokens`). Greedy drafts keep the rejection rule exact (see
rejection_sampler.py). The passes are laid out by the platform runner
(`make_pass`: its unpadded token-major layout, CPU and CUDA).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from vllm.distributed.parallel_state import single_rank_groups
from vllm.forward_context import set_forward_context
from vllm.sample.metadata import greedy_sample

logger = logging.getLogger(__name__)


@dataclass
class _DraftSeq:
    """What the flat layout reads of a request, for one draft pass."""
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class DraftModelProposer:
    vllm_config: Any
    """The target's config; the draft's is derived from it (`draft_vllm_config`)."""
    num_speculative_tokens: int
    block_size: int
    device: torch.device
    model: Any = None
    kv_caches: list[torch.Tensor] = field(default_factory=list)
    make_pass: Callable[..., Any] = None
    """(sequences by request id, new tokens per request) -> the platform's ForwardPass,
    whose `platform_data` are the logits rows of `sample_req_ids` (set by the runner)."""
    attn_impl: Any = None
    _cached: dict[str, list[int]] = field(default_factory=dict)

    # -------------------------------------------------------------- setup
    def draft_vllm_config(self) -> Any:
        """The target's config with the draft's model config (no LoRA, no speculation,
        one rank: the draft runs whole on the driver rank, TP 1)."""
        spec = self.vllm_config.speculative_config
        parallel = dataclasses.replace(self.vllm_config.parallel_config,
                                       tensor_parallel_size=1, pipeline_parallel_size=1)
        return dataclasses.replace(self.vllm_config, model_config=spec.draft_model_config,
                                   parallel_config=parallel, lora_config=None,
                                   speculative_config=None)

    def load(self, load_fn: Callable[[Any], Any]) -> None:
        """Load the draft with the runner's loader (`load_fn(vllm_config) -> model`)."""
        with single_rank_groups():  # whole on this rank, beside a TP-sharded target
            self.model = load_fn(self.draft_vllm_config())
        logger.info("Draft model %s loaded for speculative decoding (k=%d)",
                    self.vllm_config.speculative_config.model, self.num_speculative_tokens)

    def block_bytes(self, dtype: torch.dtype) -> int:
        """KV bytes of one block of the draft (it shares the target's block count)."""
        mc = self.vllm_config.speculative_config.draft_model_config
        elem = torch.tensor([], dtype=dtype).element_size()
        return (2 * mc.get_num_layers() * self.block_size * mc.get_num_kv_heads()
                * mc.get_head_size() * elem)

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def initialize_kv_cache(self, num_blocks: int, dtype: torch.dtype,
                            cache_shape: Callable[..., tuple[int, ...]],
                            allocate: Callable[..., list[torch.Tensor]]) -> None:
        """`cache_shape(num_blocks, block_size, kv_heads, head_size)`: the platform's
        per-layer shape; `allocate(shape, dtype, device, count)`: zeroed caches."""
        if not self.loaded:
            return  # a rank that does not sample: it never proposes
        mc = self.vllm_config.speculative_config.draft_model_config
        shape = cache_shape(num_blocks, self.block_size, mc.get_num_kv_heads(),
                            mc.get_head_size())
        self.kv_caches = allocate(shape, dtype, self.device, mc.get_num_layers())
        self._cached.clear()

    def forget(self, req_id: str) -> None:
        """The request finished or lost its blocks (preemption): its draft KV is gone."""
        self._cached.pop(req_id, None)

    # ------------------------------------------------------------ propose
    def propose_batch(self, states: Sequence[Any], max_drafts: Sequence[int]
                      ) -> list[list[int]]:
        ids = [st.req_id for st in states]
        limits = [min(self.num_speculative_tokens, m, self._slots_left(st),
                      self._context_left(st)) for st, m in zip(states, max_drafts)]
        seqs = {}
        for st in states:
            known = list(st.token_ids)
            seen = _common_prefix(self._cached.get(st.req_id, []), known)
            seqs[st.req_id] = _DraftSeq(known, min(seen, len(known) - 1), st.block_ids)
        drafts: dict[str, list[int]] = {r: [] for r in ids}
        active = [r for r, lim in zip(ids, limits) if lim > 0]
        while active:
            tokens = self._step(active, seqs)
            for req_id, token in zip(active, tokens):
                drafts[req_id].append(token)
                seq = seqs[req_id]
                seq.num_computed_tokens = seq.num_tokens
                seq.token_ids = seq.token_ids + [token]
            active = [r for r, lim in zip(ids, limits) if len(drafts[r]) < lim and r in active]
        for req_id in ids:
            seq = seqs[req_id]
            # KV is in the draft cache for every token it has computed.
            self._cached[req_id] = seq.token_ids[:seq.num_computed_tokens]
        return [drafts[r] for r in ids]

    def _context_left(self, state: Any) -> int:
        """Drafts the draft model's context still holds: k drafts feed positions up to
        n + k - 2 (n known tokens), which must stay below its max_model_len (a draft
        with a shorter context than the target stops proposing there, as in vLLM)."""
        max_len = self.vllm_config.speculative_config.draft_model_config.max_model_len
        n = len(state.token_ids)
        return max(0, max_len - n + 1) if n <= max_len else 0

    def _slots_left(self, state: Any) -> int:
        """Drafts whose input positions have reserved slots: d_j is fed at position
        n + j (n known tokens) only to get d_{j+1}, so k drafts need k - 1 slots."""
        return len(state.block_ids) * self.block_size - len(state.token_ids) + 1

    @torch.inference_mode()
    def _step(self, req_ids: list[str], seqs: dict[str, _DraftSeq]) -> list[int]:
        """One draft pass: each request's uncomputed tokens; the argmax after each."""
        num_new = {r: seqs[r].num_tokens - seqs[r].num_computed_tokens for r in req_ids}
        fwd = self.make_pass(seqs, num_new)
        with single_rank_groups(), \
                set_forward_context(fwd.attn_metadata, self.kv_caches, self.attn_impl):
            hidden = self.model(fwd.input_ids, fwd.positions)
        rows = torch.tensor(fwd.platform_data, device=hidden.device)
        tokens = dict(zip(fwd.sample_req_ids,
                          greedy_sample(self.model.compute_logits(hidden[rows])).tolist()))
        return [tokens[r] for r in req_ids]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

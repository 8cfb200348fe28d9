"""Paged attention from plain torch ops: the base of the CPU backend (vllm/cpu/attention.py,
which adds the native kernels) and the fallback CUDA backend.

KV cache layout per layer: `[2, num_kv_heads, num_slots, head_size]` (K then V),
head-major so that gathering a set of slots gives each head's keys as one
contiguous `[tokens, head_size]` matrix: the batched matmuls below then read the
gathered block directly (a token-major cache would need a transposing copy of
every gathered K and V, in every layer, on every step).

The runner orders the batch decode-first: rows with one new token ("decodes") come
first, sorted by context length, and are computed in a few groups of similar length
(`group_decodes`). A group's context slots (padded to its longest, with a 0/-inf
bias where lengths differ) are built once per step. Keys are gathered with one
`index_select` and scored with one batched matmul; the values are never gathered:
`embedding_bag` with the attention probabilities as per-sample weights sums the
weighted V rows straight out of the cache (the gather of V plus its matmul cost 3x
more, mostly the extra pass over memory the cache does not hold).

Where the native CPU kernels run (vllm/cpu/attention.py, the CPU backend: a CPU
float32/bf16 cache), decodes
skip all of the above: one kernel call per layer walks each sequence's block table
directly (no padding, no grouping, no gathered copies), and K/V are written to the
cache by another. The runner then builds only the int32 block table and lengths, and
also sends short prefills that way, one row per token (NATIVE_PREFILL_MAX_LEN): in
the metadata a "decode" is any row of that kernel.

The remaining sequences ("prefills": a whole prompt or a chunk of one) go, where
prefill_choice.py measured it fastest for their length, through the native blocked
prefill kernel (vllm/cpu/prefill_ops.cpp: all of them in one call per layer,
straight from the paged cache, context included); otherwise one by one through
`scaled_dot_product_attention`: causal when nothing precedes them in the
cache, with an explicit mask over the gathered context otherwise. Slots, biases,
masks and the value index are built once per step and shared by every layer.

Layers with a sliding window, a logit soft-cap, ALiBi slopes or attention sinks
(GPT-OSS) take none of the paths above: the native decode kernel and `_decode` know no
per-head bias, sink, window or cap, so their decodes (and the native path's short prefills, which are decode
rows too) go through `_masked_decode` and their prefills through
`masked_attention`, both explicit float32 scores in torch ops.

An fp8 cache (`--kv-cache-dtype fp8`, vllm/attention/fp8_kv.py) stores K / k_scale and
V / v_scale quantized; the native decode kernel reads it directly (a 256-entry table
per format, scales applied once per row). Without the native kernel its decodes take
`_masked_decode` (the gathered rows dequantized to float32: `embedding_bag` cannot
read fp8); prefills take SDPA (the native prefill kernel reads float caches only) over
the dequantized context; a prefill's own new K/V go through quantize-dequantize
first, so every path attends to what the cache holds. The fused native decode layer
(vllm/cpu/fused_decode.py) takes bf16 caches only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from vllm.attention.fp8_kv import dequantize_kv, is_fp8, quantize_kv
from vllm.attention.ops.encoder_attention import encoder_attention
from vllm.attention.ops.masked_attention import masked_attention, softmax_with_sinks


@dataclass
class PrefillSeq:
    query_start: int
    query_len: int
    context_len: int
    """Tokens of this sequence already in the cache before this step."""
    slots: Optional[torch.Tensor] = None
    """[context_len + query_len] cache slots of the whole sequence (only when
    context_len > 0)."""
    mask: Optional[torch.Tensor] = None
    """[query_len, context_len + query_len] bool, True = may attend."""
    flash: bool = False
    """Attended by the native prefill kernel (prefill_choice.py chose it for its
    length) instead of SDPA, in layers without a window, soft-cap or ALiBi."""
    mm_groups: Optional[torch.Tensor] = None
    """[context_len + query_len] int64: the image each position belongs to (-1 text),
    for a model whose image tokens attend to each other both ways (Gemma 3); positions
    of one image see each other whatever their order. None: causal."""


@dataclass
class FlashPrefills:
    """The native prefill kernel's view of the step's `flash` prefills (int32)."""
    block_table: torch.Tensor
    """[num_flash, max_blocks] block ids of each sequence."""
    query_start: torch.Tensor
    query_len: torch.Tensor
    context_len: torch.Tensor


@dataclass
class DecodeGroup:
    """Decodes [start, end) of the batch, their contexts padded to one length.

    The runner sorts decodes by context length, so each group holds similar lengths
    and pads little (see `group_decodes`).
    """
    start: int
    end: int
    max_len: int
    slots: torch.Tensor
    """[(end - start) * max_len] context slots, row-major, padding -> slot 0."""
    bias: Optional[torch.Tensor] = None
    """[end - start, max_len] float32: 0 for context, -inf for padding; None when no
    row is padded."""
    _derived: dict = field(default_factory=dict, repr=False)
    """Tensors derived for one cache layout, built by the first layer, reused by all."""

    def bias_for(self, num_kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """The bias laid out as the scores, `[kv_heads * rows, 1, max_len]`; a
        broadcastable zero when nothing is padded."""
        key = ("bias", num_kv_heads, dtype)
        bias = self._derived.get(key)
        if bias is None:
            if self.bias is None:
                bias = torch.zeros(1, 1, 1, dtype=dtype, device=self.slots.device)
            else:
                n, length = self.bias.shape
                bias = (self.bias.to(dtype).unsqueeze(0).expand(num_kv_heads, n, length)
                        .reshape(num_kv_heads * n, 1, length))
            self._derived[key] = bias
        return bias

    def value_bags(self, num_kv_heads: int, groups: int,
                   num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, offsets) for `embedding_bag` over V viewed as [kv_heads * slots, d].

        One bag per (kv head, decode, query head of the group), in that order (the
        order of the probabilities), holding the rows `head * num_slots + slot` of the
        decode's padded context.
        """
        key = ("bags", num_kv_heads, groups, num_slots)
        bags = self._derived.get(key)
        if bags is None:
            n, length = self.end - self.start, self.max_len
            device = self.slots.device
            heads = torch.arange(num_kv_heads, device=device) * num_slots
            index = heads.view(-1, 1, 1, 1) + self.slots.view(1, n, 1, length)
            index = index.expand(num_kv_heads, n, groups, length).reshape(-1)
            offsets = torch.arange(0, index.numel(), length, device=device)
            bags = (index, offsets)
            self._derived[key] = bags
        return bags


@dataclass
class TorchSDPAMetadata:
    slot_mapping: torch.Tensor
    """[num_tokens] cache slot each new token's K/V is written to."""
    num_decodes: int
    block_size: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSeq] = field(default_factory=list)
    decode_block_table: Optional[torch.Tensor] = None
    """[num_decodes, max_blocks] int32, set instead of decode_groups for the native
    decode kernel."""
    decode_seq_lens: Optional[torch.Tensor] = None
    """[num_decodes] int32 context lengths (new token included), native path only."""
    decode_rows: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    """(block table [num_decodes, max_blocks] int64, context lengths [num_decodes] int64)
    of the decodes, for layers with a sliding window or a soft-cap (`_masked_decode`)."""
    flash: Optional[FlashPrefills] = None
    """The prefills marked `flash`, for one native prefill kernel call per layer."""


NATIVE_PREFILL_MAX_LEN = 512
"""With the native kernel, a prefill (or prefill chunk) whose sequence is at most this
long goes through the paged single-query kernel too, one row per token attending to
its own prefix. For such lengths that beats one `scaled_dot_product_attention` call
per sequence (~0.6 vs ~1.0 ms per layer at 190 tokens, on 2 cores: the flash kernel's
fixed costs dominate short sequences), and the step can stay on the fused layer path.
Its work grows with the square of the length, so longer sequences keep SDPA (at 2048
tokens SDPA is ~2x faster)."""

DECODE_LEN_ALIGN = 32
"""Decode contexts are padded to a multiple of this many tokens.

oneDNN compiles a kernel for every new shape of a bf16 batched matmul, about 0.7 ms
each; a context length that grows by one token per step would pay that on every
step. Padding makes the shape change once every 32 steps, for at most 31 masked
columns per row."""

DECODE_GROUP_MIN_SAVING = 512
"""Split off shorter decodes into their own group only when that avoids at least this
many padded context rows (a group costs ~8 more ops per layer, about as much as
gathering and scoring this many rows)."""


def group_decodes(seq_lens: np.ndarray, align: Optional[int] = None,
                  min_saving: Optional[int] = None) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of decodes to pad to a common length.

    Expects lengths sorted ascending (the runner's order). From the longest down, a
    group takes every decode longer than half of its longest; the shorter rest
    becomes further groups only if keeping them in this one would pad at least
    `min_saving` rows. Defaults: DECODE_LEN_ALIGN, DECODE_GROUP_MIN_SAVING.
    """
    align = DECODE_LEN_ALIGN if align is None else align
    min_saving = DECODE_GROUP_MIN_SAVING if min_saving is None else min_saving
    lens = np.asarray(seq_lens, dtype=np.int64)
    ranges: list[tuple[int, int]] = []
    end = len(lens)
    while end > 0:
        longest = int(lens[end - 1])
        top = -(-longest // align) * align
        start = int(np.searchsorted(lens[:end], longest // 2, side="right"))
        if start > 0 and start * top - int(lens[:start].sum()) < min_saving:
            start = 0
        ranges.append((start, end))
        end = start
    return ranges[::-1]


def context_slots(block_table: np.ndarray, seq_lens: np.ndarray, block_size: int,
                  align: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Slots of positions [0, len) of each row, padded with slot 0 to the longest row
    rounded up to a multiple of `align`.

    block_table: [rows, max_blocks] int64 (entries past a row's blocks unused);
    returns (slots [rows, padded_len], valid [rows, padded_len] bool).
    """
    max_len = -(-int(seq_lens.max()) // align) * align
    pos = np.arange(max_len)
    blocks = np.minimum(pos // block_size, block_table.shape[1] - 1)
    slots = block_table[:, blocks] * block_size + pos % block_size
    valid = pos[None, :] < seq_lens[:, None]
    return np.where(valid, slots, 0), valid


def build_metadata(slot_mapping: torch.Tensor, decode_block_table: Optional[np.ndarray],
                   decode_seq_lens: Optional[np.ndarray], prefills: list[PrefillSeq],
                   prefill_block_ids: Sequence[Sequence[int]], block_size: int,
                   device: torch.device | str, native: bool = False) -> TorchSDPAMetadata:
    """Per-step metadata: decode groups (slots, bias), each chunked prefill's context.

    decode_block_table: [num_decodes, max_blocks] int64 block ids (padding ignored);
    decode_seq_lens: [num_decodes] tokens each decode attends to (including its new
    one), best sorted ascending. native: decodes go to the native kernel (block table
    and lengths as int32 tensors instead of padded groups).
    """
    num_decodes = 0 if decode_seq_lens is None else len(decode_seq_lens)
    md = TorchSDPAMetadata(slot_mapping=slot_mapping, num_decodes=num_decodes,
                           block_size=block_size, prefills=prefills)
    if num_decodes:
        md.decode_rows = (torch.from_numpy(np.asarray(decode_block_table, dtype=np.int64)),
                          torch.from_numpy(np.asarray(decode_seq_lens, dtype=np.int64)))
    if native and num_decodes:
        md.decode_block_table = torch.from_numpy(decode_block_table.astype(np.int32))
        md.decode_seq_lens = torch.from_numpy(np.asarray(decode_seq_lens, dtype=np.int32))
    for start, end in (group_decodes(decode_seq_lens)
                       if num_decodes and md.decode_block_table is None else []):
        slots, valid = context_slots(decode_block_table[start:end],
                                     decode_seq_lens[start:end], block_size,
                                     DECODE_LEN_ALIGN)
        group = DecodeGroup(start=start, end=end, max_len=slots.shape[1],
                            slots=torch.from_numpy(slots.reshape(-1)).to(device))
        if not valid.all():
            bias = np.where(valid, np.float32(0.0), np.float32(-np.inf))
            group.bias = torch.from_numpy(bias).to(device)
        md.decode_groups.append(group)
    if native:
        md.flash = flash_prefills(prefills, prefill_block_ids, block_size)
    for seq, blocks in zip(prefills, prefill_block_ids):
        if seq.mm_groups is not None:
            seq.mm_groups = seq.mm_groups.to(device)
        if seq.context_len == 0 and seq.mm_groups is None:
            continue
        total = seq.context_len + seq.query_len
        if seq.context_len:
            table = np.asarray(blocks[:-(-total // block_size)], dtype=np.int64)[None, :]
            slots, _ = context_slots(table, np.array([total]), block_size)
            seq.slots = torch.from_numpy(slots[0]).to(device)
        q_pos = torch.arange(seq.query_len, device=device)[:, None] + seq.context_len
        k_pos = torch.arange(total, device=device)[None, :]
        seq.mask = k_pos <= q_pos
        if seq.mm_groups is not None:
            seq.mask = seq.mask | same_image(seq.mm_groups[seq.context_len:],
                                             seq.mm_groups)
    return md


def same_image(q_groups: torch.Tensor, k_groups: torch.Tensor) -> torch.Tensor:
    """[Tq, Tk] True where a query and a key are tokens of the same image."""
    return (q_groups[:, None] == k_groups[None, :]) & (q_groups[:, None] >= 0)


def flash_prefills(prefills: list[PrefillSeq], prefill_block_ids: Sequence[Sequence[int]],
                   block_size: int) -> Optional[FlashPrefills]:
    """The native prefill kernel's tensors for the prefills marked `flash` (None if none)."""
    chosen = [(seq, blocks) for seq, blocks in zip(prefills, prefill_block_ids) if seq.flash]
    if not chosen:
        return None
    need = [-(-(seq.context_len + seq.query_len) // block_size) for seq, _ in chosen]
    table = np.zeros((len(chosen), max(need)), dtype=np.int32)
    for row, ((_, blocks), n) in enumerate(zip(chosen, need)):
        table[row, :n] = blocks[:n]
    ints = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    return FlashPrefills(block_table=torch.from_numpy(table),
                         query_start=ints([s.query_start for s, _ in chosen]),
                         query_len=ints([s.query_len for s, _ in chosen]),
                         context_len=ints([s.context_len for s, _ in chosen]))


class TorchSDPABackendImpl:
    """forward(layer, q, k, v, kv_cache, metadata): see vllm.attention.layer.Attention."""

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, md: TorchSDPAMetadata) -> torch.Tensor:
        num_tokens = query.shape[0]
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        q = query.view(num_tokens, hq, d)
        k = key.view(num_tokens, hkv, d)
        v = value.view(num_tokens, hkv, d)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        if is_fp8(kv_cache.dtype):
            return self._forward_fp8(layer, query, key, value, kv_cache, md)
        if not self._write_kv_native(key, value, kv_cache, md.slot_mapping):
            k_cache.index_copy_(1, md.slot_mapping, k.transpose(0, 1))
            v_cache.index_copy_(1, md.slot_mapping, v.transpose(0, 1))
        if _is_masked(layer):
            return self._masked(q, k, v, kv_cache, md, layer, query)
        groups = md.decode_groups
        if md.num_decodes == num_tokens and len(groups) == 1:  # no buffer to fill
            return self._decode(q, k_cache, v_cache, groups[0], layer)
        out = torch.empty(num_tokens, hq * d, dtype=query.dtype, device=query.device)
        if md.decode_block_table is not None:
            nd = md.num_decodes
            self._decode_rows_native(query[:nd], kv_cache, md, layer, out[:nd])
        for group in groups:
            out[group.start:group.end] = self._decode(q[group.start:group.end], k_cache,
                                                      v_cache, group, layer)
        if md.flash is not None:
            self._prefills_native(query, kv_cache, md, layer, out)
        _prefills(out, q, k, v, kv_cache, md, layer, skip_flash=md.flash is not None)
        return out

    def forward_encoder_only(self, layer, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, md: TorchSDPAMetadata) -> torch.Tensor:
        """Bidirectional attention within each sequence of the step, no KV cache.

        The pooling runner never chunks an encoder's prompt and never reuses a cached
        prefix, so each sequence is whole here: a one-token prompt is a decode row (it
        sees only itself), every other prompt a prefill with no context."""
        if any(p.context_len for p in md.prefills):
            raise ValueError("encoder-only attention needs whole prompts (no cached "
                             "context); chunked prefill and prefix caching must be off.")
        seqs = [(i, 1) for i in range(md.num_decodes)]
        seqs += [(p.query_start, p.query_len) for p in md.prefills]
        return encoder_attention(layer, query, key, value, seqs)

    def _forward_fp8(self, layer, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, kv_cache: torch.Tensor,
                     md: TorchSDPAMetadata) -> torch.Tensor:
        """forward() for an fp8 cache: store quantized K/V, attend to them dequantized."""
        num_tokens, cache_dtype = query.shape[0], kv_cache.dtype
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        kq = quantize_kv(key.reshape(num_tokens, hkv * d), layer.k_scale, cache_dtype)
        vq = quantize_kv(value.reshape(num_tokens, hkv * d), layer.v_scale, cache_dtype)
        if not self._write_fp8_kv_native(kq, vq, kv_cache, md.slot_mapping, query.dtype):
            # index_copy_ has no fp8 kernel: copy the bytes
            cache_bytes = kv_cache.view(torch.uint8)
            for i, rows in enumerate((kq, vq)):
                cache_bytes[i].index_copy_(1, md.slot_mapping, rows.view(torch.uint8).view(
                    num_tokens, hkv, d).transpose(0, 1))
        q = query.view(num_tokens, hq, d)
        k = dequantize_kv(kq, layer.k_scale, query.dtype).view(num_tokens, hkv, d)
        v = dequantize_kv(vq, layer.v_scale, query.dtype).view(num_tokens, hkv, d)
        if _is_masked(layer):
            return self._masked(q, k, v, kv_cache, md, layer, query)
        out = torch.empty(num_tokens, hq * d, dtype=query.dtype, device=query.device)
        nd = md.num_decodes
        if nd and md.decode_block_table is not None:
            self._decode_rows_native(query[:nd], kv_cache, md, layer, out[:nd],
                                     layer.k_scale, layer.v_scale)
        elif nd:
            out[:nd] = _masked_decode(q[:nd], kv_cache, md, layer)
        _prefills(out, q, k, v, kv_cache, md, layer, skip_flash=False)
        return out

    @staticmethod
    def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                md: TorchSDPAMetadata, layer, query: torch.Tensor) -> torch.Tensor:
        """Layers with a sliding window, attention soft-cap (Gemma, Mistral-7B-v0.1),
        ALiBi (BLOOM) or sinks (GPT-OSS): explicit scores in float32 (`masked_attention`); decodes read
        only the last `sliding_window` tokens of their context. The native decode
        kernel takes no bias, so ALiBi decodes run here in torch ops."""
        out = torch.empty(query.shape[0], layer.num_heads * layer.head_size,
                          dtype=query.dtype, device=query.device)
        if md.num_decodes:
            out[:md.num_decodes] = _masked_decode(q[:md.num_decodes], kv_cache, md, layer)
        for seq in md.prefills:
            s, e = seq.query_start, seq.query_start + seq.query_len
            q_pos = torch.arange(seq.context_len, seq.context_len + seq.query_len,
                                 device=q.device)
            groups = seq.mm_groups
            q_groups = None if groups is None else groups[seq.context_len:]
            if seq.context_len == 0:
                out[s:e] = masked_attention(layer, q[s:e], k[s:e].flatten(1), v[s:e].flatten(1),
                                            q_pos, q_pos, q_groups, groups)
            else:
                k_pos = torch.arange(seq.context_len + seq.query_len, device=q.device)
                out[s:e] = masked_attention(layer, q[s:e],
                                            _read(kv_cache, 0, seq.slots, layer, q.dtype),
                                            _read(kv_cache, 1, seq.slots, layer, q.dtype),
                                            q_pos, k_pos, q_groups, groups)
        return out

    # The native kernels' hooks: a backend with kernels (vllm/cpu/attention.py)
    # overrides them. Metadata with a decode block table or flash prefills is built
    # only for such a backend (the CPU runner's `native_attention`).
    def _write_kv_native(self, key: torch.Tensor, value: torch.Tensor,
                         kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
        """Store the new K/V rows with a kernel; False: the caller copies them."""
        return False

    def _write_fp8_kv_native(self, kq: torch.Tensor, vq: torch.Tensor, kv_cache: torch.Tensor,
                             slot_mapping: torch.Tensor, dtype: torch.dtype) -> bool:
        """Store quantized K/V rows with a kernel; False: the caller copies the bytes."""
        return False

    def _decode_rows_native(self, query: torch.Tensor, kv_cache: torch.Tensor,
                            md: TorchSDPAMetadata, layer, out: torch.Tensor,
                            k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """The decode rows of `md.decode_block_table` into `out`."""
        raise NotImplementedError(f"{type(self).__name__} has no paged decode kernel")

    def _prefills_native(self, query: torch.Tensor, kv_cache: torch.Tensor,
                         md: TorchSDPAMetadata, layer, out: torch.Tensor) -> None:
        """The prefills of `md.flash` into `out`."""
        raise NotImplementedError(f"{type(self).__name__} has no blocked prefill kernel")

    @staticmethod
    def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                group: DecodeGroup, layer) -> torch.Tensor:
        """One query per sequence against its context; [n, hq, d] -> [n, hq*d].

        Batches are (kv head, sequence) pairs; the `groups` query heads sharing a KV
        head are the rows of one small matmul, so GQA never repeats K or V.
        """
        nd = q.shape[0]
        hkv, d = layer.num_kv_heads, layer.head_size
        groups = layer.num_heads // hkv
        length = group.max_len
        kk = k_cache.index_select(1, group.slots).view(hkv * nd, length, d)
        qq = q.view(nd, hkv, groups, d).transpose(0, 1).reshape(hkv * nd, groups, d)
        scores = torch.baddbmm(group.bias_for(hkv, q.dtype), qq, kk.transpose(1, 2),
                               alpha=layer.scale, beta=0.0 if group.bias is None else 1.0)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v_cache.dtype)
        num_slots = v_cache.shape[1]
        index, offsets = group.value_bags(hkv, groups, num_slots)
        out = F.embedding_bag(index, v_cache.view(hkv * num_slots, d), offsets, mode="sum",
                              per_sample_weights=probs.view(-1))  # [hkv * nd * groups, d]
        return out.view(hkv, nd, groups * d).transpose(0, 1).reshape(nd, hkv * groups * d)


def _read(kv_cache: torch.Tensor, which: int, slots: torch.Tensor, layer,
          dtype: torch.dtype) -> torch.Tensor:
    """K (which=0) or V (1) rows of `slots`, [kv_heads, len(slots), head_size]: as
    stored, or dequantized to `dtype` from an fp8 cache."""
    rows = kv_cache[which].index_select(1, slots)
    if not is_fp8(rows.dtype):
        return rows
    return dequantize_kv(rows, layer.k_scale if which == 0 else layer.v_scale, dtype)


def _prefills(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_cache: torch.Tensor, md: TorchSDPAMetadata, layer, skip_flash: bool) -> None:
    """Each prefill (q/k/v [T, heads, d] of this step) into its rows of `out`: causal
    SDPA on its own K/V without context, else SDPA over the gathered context.
    skip_flash: leave out those the native prefill kernel did."""
    for seq in md.prefills:
        if skip_flash and seq.flash:
            continue
        s, e = seq.query_start, seq.query_start + seq.query_len
        if seq.context_len == 0:
            out[s:e] = _sdpa(q[s:e], k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                             seq.mask, layer.scale, causal=seq.mask is None)
        else:
            kk = _read(kv_cache, 0, seq.slots, layer, q.dtype)
            vv = _read(kv_cache, 1, seq.slots, layer, q.dtype)
            out[s:e] = _sdpa(q[s:e], kk, vv, seq.mask, layer.scale, causal=False)


def _is_masked(layer) -> bool:
    """A layer with a sliding window, chunked attention, a soft-cap, ALiBi or sinks
    (`Attention` attributes)."""
    return (getattr(layer, "sliding_window", None) is not None
            or getattr(layer, "attention_chunk_size", None) is not None
            or getattr(layer, "logits_soft_cap", None) is not None
            or getattr(layer, "alibi_slopes", None) is not None
            or getattr(layer, "sinks", None) is not None)


def _masked_decode(q: torch.Tensor, kv_cache: torch.Tensor, md: TorchSDPAMetadata,
                   layer) -> torch.Tensor:
    """One query per row against its context, [n, hq, d] -> [n, hq * d], with the
    layer's soft-cap, window, ALiBi slopes and sinks (the row's query sits at position
    `len - 1`). Each row gathers only the positions it may see: the
    last `sliding_window` of its context (all of it without a window), padded to the
    longest such span."""
    table, lens = md.decode_rows
    n, device = q.shape[0], q.device
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    span = lens if layer.sliding_window is None else lens.clamp(max=layer.sliding_window)
    chunk = getattr(layer, "attention_chunk_size", None)
    if chunk is not None:  # from the start of the query's chunk
        span = lens - (lens - 1) // chunk * chunk
    width = int(span.max())
    pos = (lens - span)[:, None] + torch.arange(width)[None, :]       # [n, width]
    valid = pos < lens[:, None]
    pos = torch.where(valid, pos, 0)
    slots = (table.gather(1, pos // md.block_size) * md.block_size + pos % md.block_size)
    slots = slots.reshape(-1).to(device)
    kk = _read(kv_cache, 0, slots, layer, torch.float32).view(hkv, n, width, d).float()
    vv = _read(kv_cache, 1, slots, layer, torch.float32).view(hkv, n, width, d).float()
    qq = q.view(n, hkv, hq // hkv, d).permute(1, 0, 2, 3).float()    # [hkv, n, g, d]
    scores = torch.matmul(qq, kk.transpose(-1, -2)) * layer.scale     # [hkv, n, g, width]
    if layer.logits_soft_cap is not None:
        scores = torch.tanh(scores / layer.logits_soft_cap) * layer.logits_soft_cap
    slopes = getattr(layer, "alibi_slopes", None)
    if slopes is not None:
        rel = (pos - (lens - 1)[:, None]).to(device=device, dtype=torch.float32)
        scores = scores + slopes.view(hkv, 1, hq // hkv, 1) * rel[None, :, None, :]
    scores = scores.masked_fill(~valid.to(device)[None, :, None, :], float("-inf"))
    sinks = getattr(layer, "sinks", None)
    probs = softmax_with_sinks(scores, None if sinks is None
                               else sinks.view(hkv, 1, hq // hkv, 1))
    out = torch.matmul(probs, vv)                                     # [hkv, n, g, d]
    return out.permute(1, 0, 2, 3).reshape(n, hq * d).to(q.dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
          scale: float, causal: bool) -> torch.Tensor:
    """q [T, Hq, D], k/v [Hkv, S, D] -> [T, Hq * D]; GQA handled by SDPA's enable_gqa."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
        is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[0])
    return out.squeeze(0).transpose(0, 1).reshape(q.shape[0], -1)

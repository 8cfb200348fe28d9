"""Paged attention for the HPU in static-shape tensor ops.

Gaudi compiles one graph per shape and is slow at data-dependent gathers and
per-sequence loops, so decode attention is "flat": every KV block in the batch is
one row, a one-hot `block_mapping` [N, B] moves data between sequence rows and
block rows with matmuls, and a softmax is assembled from per-block partial results.
All shapes depend only on the bucket (padded batch size B, padded block count N).

KV cache layout, per layer: K and V are two separate tensors, each `[num_blocks *
block_size, num_kv_heads, head_size]` (`HPUKVCache` in the backend). Writes are
`index_copy_` into the whole tensor, never into a view.
Caches must be allocated zeroed (`torch.zeros`): padding rows read blocks that were
never written, and 0 * NaN garbage would poison the matmuls.

An fp8 cache (`--kv-cache-dtype fp8`, vllm/attention/fp8_kv.py) holds K / k_scale and
V / v_scale cast by the Gaudi op `cast_to_fp8_v2` (`quantize_kv`); every read gathers
the fp8 blocks first and converts only those with `cast_from_fp8` (`dequantize_kv`),
so the cache is read at one byte per element.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Sequence

import torch

from vllm.hpu import habana
from vllm.attention.fp8_kv import FP8_DTYPES
from vllm.attention.ops.masked_attention import softmax_with_sinks

# torch marks index_reduce_ "beta" with a UserWarning on CPU; the op is what we want.
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")


def write_to_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store K/V [T, H, D] at `slot = block_id * block_size + pos % block_size`.

    Padded tokens must map to the pad block's slots so they never overwrite real data.
    fp8 rows (already quantized) are copied as bytes: a view of the whole tensor, and
    torch on CPU (the fake HPU) has no fp8 index_copy_.
    """
    if key_cache.dtype in FP8_DTYPES:
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        key, value = key.view(torch.uint8), value.view(torch.uint8)
    key_cache.index_copy_(0, slot_mapping, key)
    value_cache.index_copy_(0, slot_mapping, value)


def quantize_kv(x: torch.Tensor, inv_scale: torch.Tensor, cache_dtype: torch.dtype
                ) -> torch.Tensor:
    """x * inv_scale (= x / scale) saturated to the fp8 cache dtype (Gaudi's cast)."""
    return habana.hpu_ops.cast_to_fp8_v2(x, inv_scale, False, False, cache_dtype)[0]


def dequantize_kv(x: torch.Tensor, scale: Optional[torch.Tensor],
                  dtype: torch.dtype) -> torch.Tensor:
    """Cache rows in `dtype`: fp8 ones times their scale, others as they are."""
    if x.dtype not in FP8_DTYPES:
        return x
    return habana.hpu_ops.cast_from_fp8(x, scale, dtype)


# ---------------------------------------------------------------------------
# Decode: flat paged attention
# ---------------------------------------------------------------------------

class FlatPAMetadata(NamedTuple):
    """Static-shape decode metadata for B padded sequences over N padded blocks.

    No Python scalars live here (they would key a new HPU graph per value); the
    sizes B, N and block_size are the tensors' shapes. A NamedTuple, because Gaudi's
    HPU graph cache hashes tuples element by element (tensors by shape) while a
    dataclass is unhashable to it.
    """
    block_list: Optional[torch.Tensor]
    """[N] physical block ids (pad block for padding); None with contiguous PA, where
    row n *is* physical block n and the KV fetch is the slice cache[:N*block_size]."""
    block_groups: torch.Tensor
    """[N] int64: index of the sequence owning the block row, -1 for padding."""
    block_usage: torch.Tensor
    """[N] int64: tokens used in the block (1 for padding so no row is all -inf)."""
    block_bias: torch.Tensor
    """[N, block_size]: 0 where j < block_usage[n], -inf after."""
    block_mapping: torch.Tensor
    """[N, B]: one_hot(block_groups, B); padding rows are all zero."""
    block_offsets: Optional[torch.Tensor] = None
    """[N] int64: position in its sequence of the block's first token (0 for padding);
    with `block_seq_lens`, what sliding-window layers mask by."""
    block_seq_lens: Optional[torch.Tensor] = None
    """[N] int64: length of the owning sequence (1 for padding)."""


def _checked_lengths(block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                     block_size: int, batch_size: int) -> list[int]:
    """Blocks each sequence uses; ValueError on inconsistent inputs."""
    if len(block_tables) != len(seq_lens):
        raise ValueError(f"block_tables ({len(block_tables)}) and seq_lens ({len(seq_lens)}) "
                         "must have one entry per sequence.")
    if len(seq_lens) > batch_size:
        raise ValueError(f"{len(seq_lens)} sequences do not fit batch_size={batch_size}.")
    counts = []
    for i, (table, n) in enumerate(zip(block_tables, seq_lens)):
        if n < 1:
            raise ValueError(f"seq_lens[{i}] must be >= 1, got {n}.")
        need = -(-n // block_size)
        if len(table) < need:
            raise ValueError(f"block table of sequence {i} has {len(table)} blocks; "
                             f"seq_len {n} needs {need}.")
        counts.append(need)
    return counts


def build_flat_pa_metadata(block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                           block_size: int, batch_size: int, num_blocks: int,
                           pad_block_id: int, contiguous: bool = False,
                           dtype: torch.dtype = torch.float32,
                           device: torch.device | str = "cpu") -> FlatPAMetadata:
    """Decode metadata padded to (batch_size, num_blocks) = the decode bucket.

    `seq_lens` count the tokens in the cache including the one being decoded.
    With `contiguous`, `num_blocks` must exceed the highest physical block id used;
    otherwise it must be >= the total number of blocks of the batch.
    """
    counts = _checked_lengths(block_tables, seq_lens, block_size, batch_size)
    ids, groups, usage, offsets, lens = [], [], [], [], []
    for seq, (table, n, need) in enumerate(zip(block_tables, seq_lens, counts)):
        ids.extend(table[:need])
        groups.extend([seq] * need)
        usage.extend([block_size] * (need - 1) + [n - (need - 1) * block_size])
        offsets.extend(range(0, need * block_size, block_size))
        lens.extend([n] * need)
    if contiguous:
        top = max(ids, default=-1)
        if top >= num_blocks:
            raise ValueError(f"contiguous PA: block id {top} needs num_blocks > {top}, "
                             f"got {num_blocks}.")
        block_list = None
        groups_t = torch.full((num_blocks,), -1, dtype=torch.long)
        usage_t = torch.ones(num_blocks, dtype=torch.long)
        offsets_t = torch.zeros(num_blocks, dtype=torch.long)
        lens_t = torch.ones(num_blocks, dtype=torch.long)
        index = torch.tensor(ids, dtype=torch.long)
        groups_t[index] = torch.tensor(groups, dtype=torch.long)
        usage_t[index] = torch.tensor(usage, dtype=torch.long)
        offsets_t[index] = torch.tensor(offsets, dtype=torch.long)
        lens_t[index] = torch.tensor(lens, dtype=torch.long)
    else:
        if len(ids) > num_blocks:
            raise ValueError(f"the batch uses {len(ids)} blocks; num_blocks={num_blocks} "
                             "is too small.")
        pad = num_blocks - len(ids)
        block_list = torch.tensor(ids + [pad_block_id] * pad, dtype=torch.long, device=device)
        groups_t = torch.tensor(groups + [-1] * pad, dtype=torch.long)
        usage_t = torch.tensor(usage + [1] * pad, dtype=torch.long)
        offsets_t = torch.tensor(offsets + [0] * pad, dtype=torch.long)
        lens_t = torch.tensor(lens + [1] * pad, dtype=torch.long)
    bias = torch.zeros(num_blocks, block_size, dtype=dtype)
    bias.masked_fill_(torch.arange(block_size)[None, :] >= usage_t[:, None], float("-inf"))
    mapping = torch.zeros(num_blocks, batch_size + 1, dtype=dtype)
    mapping[torch.arange(num_blocks), torch.where(groups_t < 0, batch_size, groups_t)] = 1
    return FlatPAMetadata(block_list=block_list, block_groups=groups_t.to(device),
                          block_usage=usage_t.to(device), block_bias=bias.to(device),
                          block_mapping=mapping[:, :batch_size].contiguous().to(device),
                          block_offsets=offsets_t.to(device), block_seq_lens=lens_t.to(device))


def _fetch_blocks(cache: torch.Tensor, block_list: Optional[torch.Tensor], num_blocks: int,
                  block_size: int) -> torch.Tensor:
    """[N, block_size, H, D]: gathered by id, or a slice of the first N (contiguous PA)."""
    heads, dim = cache.shape[1], cache.shape[2]
    if block_list is None:
        return cache[:num_blocks * block_size].view(num_blocks, block_size, heads, dim)
    return cache.view(-1, block_size, heads, dim).index_select(0, block_list)


def grouped_max(block_max: torch.Tensor, block_groups: torch.Tensor,
                batch: int) -> torch.Tensor:
    """[B + 1, ...] maximum of `block_max` [N, ...] over the blocks of each sequence;
    row B collects the padding blocks (group -1), rows without a block stay -inf.

    `index_reduce_(..., "amax")` rather than `scatter_reduce(..., "amax")`: it reduces
    whole rows by one [N] index vector (no index tensor expanded to the data's
    shape), which is the form Gaudi's reference backend uses for this step and runs
    on the device, where the scatter form is one of the ops likely to fall back to
    the CPU. It is exact (a max), so the result equals softmax attention.
    """
    owner = torch.where(block_groups < 0, batch, block_groups)
    seq_max = torch.full((batch + 1, *block_max.shape[1:]), float("-inf"),
                         dtype=block_max.dtype, device=block_max.device)
    return seq_max.index_reduce_(0, owner, block_max, "amax", include_self=True)


def flat_paged_attention(query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, metadata: FlatPAMetadata,
                         scale: float, logits_soft_cap: Optional[float] = None,
                         sliding_window: Optional[int] = None,
                         alibi_slopes: Optional[torch.Tensor] = None,
                         kv_scales: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                         sinks: Optional[torch.Tensor] = None,
                         chunk_size: Optional[int] = None) -> torch.Tensor:
    """Decode attention: query [B, Hq, D] -> [B, Hq, D] over each sequence's cached tokens.

    GQA groups the Hq // Hkv query heads of a KV head instead of repeating K/V.
    The per-block softmax pieces are rescaled to the sequence-wide maximum; the
    sum over blocks is divided out after `block2batch` (identical math to dividing
    each block row, but padding rows never see a 0/0).

    `logits_soft_cap` caps the scores (`cap * tanh(s / cap)`); with `sliding_window`
    tokens before the last `sliding_window` of a sequence are masked, so a block row
    may be masked entirely: its maximum is taken as 0 for the exponent (its
    probabilities are 0) and its rescale factor is exp(-inf) = 0.

    `alibi_slopes` [Hq] adds `slope * (pos - (seq_len - 1))` to each head's scores,
    the positions of a block row coming from `block_offsets` (ALiBi: the query is the
    sequence's last token). The bias is built from metadata tensors only, so the
    graph shape stays the bucket's.

    `kv_scales` (k_scale, v_scale): dequantization scales of fp8 caches, applied to
    the gathered blocks.

    `sinks` [Hq] (GPT-OSS): one more logit per head in every sequence's softmax
    denominator. It joins the sequence-wide maximum and adds `exp(sink - max)` to the
    normaliser after block2batch: a [B, Hkv, G] term, a fixed shape per bucket.
    """
    mapping = metadata.block_mapping                       # [N, B]
    num_blocks, batch = mapping.shape
    block_size = metadata.block_bias.shape[1]
    q_heads, head_dim = query.shape[1], query.shape[2]
    kv_heads = key_cache.shape[1]
    group = q_heads // kv_heads

    # 1. one query row per block (batch2block)
    q = torch.matmul(mapping, (query * scale).reshape(batch, -1))
    q = q.view(num_blocks, kv_heads, group, head_dim)
    # 2. the blocks' keys and values
    k = _fetch_blocks(key_cache, metadata.block_list, num_blocks, block_size)
    v = _fetch_blocks(value_cache, metadata.block_list, num_blocks, block_size)
    if kv_scales is not None:
        k = dequantize_kv(k, kv_scales[0], query.dtype)
        v = dequantize_kv(v, kv_scales[1], query.dtype)
    k = k.permute(0, 2, 3, 1)                              # [N, Hkv, D, bs]
    v = v.permute(0, 2, 1, 3)                              # [N, Hkv, bs, D]
    # 3. per-block partial softmax
    scores = torch.matmul(q, k)
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    scores = scores + metadata.block_bias.view(num_blocks, 1, 1, block_size)
    pos = None
    if sliding_window is not None or alibi_slopes is not None or chunk_size is not None:
        pos = metadata.block_offsets[:, None] + torch.arange(block_size, device=q.device)
    if alibi_slopes is not None:
        # Product in float32, rounded once: bf16 cannot hold positions past 256 exactly.
        rel = (pos - (metadata.block_seq_lens[:, None] - 1)).float()
        bias = alibi_slopes.float().view(1, kv_heads, group, 1) * rel.view(num_blocks, 1, 1,
                                                                           block_size)
        scores = scores + bias.to(scores.dtype)
    if sliding_window is not None:
        outside = pos <= (metadata.block_seq_lens[:, None] - 1 - sliding_window)
        scores = scores.masked_fill(outside.view(num_blocks, 1, 1, block_size), float("-inf"))
    if chunk_size is not None:  # keys before the query's chunk (the query is at len - 1)
        first = (metadata.block_seq_lens[:, None] - 1) // chunk_size * chunk_size
        scores = scores.masked_fill((pos < first).view(num_blocks, 1, 1, block_size),
                                    float("-inf"))
    block_max = scores.amax(dim=-1, keepdim=True)          # [N, Hkv, G, 1]
    exp_max = block_max
    if sliding_window is not None or chunk_size is not None:
        exp_max = torch.where(torch.isinf(block_max), torch.zeros_like(block_max), block_max)
    probs = torch.exp(scores - exp_max)
    block_sum = probs.sum(dim=-1, keepdim=True)
    block_out = torch.matmul(probs, v)                     # [N, Hkv, G, D]
    # 4. sequence-wide maximum; padding rows reduce into an extra dump row B
    seq_max = grouped_max(block_max, metadata.block_groups, batch)
    if sinks is not None:
        sink = sinks.to(seq_max.dtype).view(1, kv_heads, group, 1)
        seq_max = torch.maximum(seq_max, sink)
    owner = torch.where(metadata.block_groups < 0, batch, metadata.block_groups)
    rescale = torch.exp(block_max - seq_max.index_select(0, owner))
    # 5-6. sum the rescaled pieces per sequence (block2batch) and normalise
    mapping_t = mapping.t()
    total = torch.matmul(mapping_t, (block_sum * rescale).view(num_blocks, -1))
    out = torch.matmul(mapping_t, (block_out * rescale).view(num_blocks, -1))
    out = out.view(batch, kv_heads, group, head_dim)
    total = total.view(batch, kv_heads, group, 1)
    if sinks is not None:
        total = total + torch.exp(sink - seq_max[:batch])
    total = total.clamp_min(torch.finfo(out.dtype).tiny)
    return (out / total).view(batch, q_heads, head_dim)


# ---------------------------------------------------------------------------
# Prefill
# ---------------------------------------------------------------------------

FSDPA_GQA_MODES = ("native", "repeat")


def check_fsdpa_gqa(mode: str) -> str:
    """VLLM_HPU_FSDPA_GQA, validated (see `fsdpa_kv`)."""
    if mode not in FSDPA_GQA_MODES:
        raise ValueError(f"VLLM_HPU_FSDPA_GQA must be one of {FSDPA_GQA_MODES}, got {mode!r}.")
    return mode


def fsdpa_kv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             gqa_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V [B, Hkv, S, D] as FusedSDPA should get them for a query [B, Hq, T, D].

    "native": unchanged; current Gaudi software (like torch's SDPA with enable_gqa)
    maps each group of Hq // Hkv query heads onto its KV head. "repeat": each KV
    head repeated Hq // Hkv times (`repeat_interleave` on the head axis, so query
    head h meets KV head h // group as in the native mapping), the form older
    Gaudi software needed; it costs the expanded K/V copy.
    """
    group = query.shape[1] // key.shape[1]
    if gqa_mode == "native" or group == 1:
        return key, value
    return key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)


def prompt_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     query_lens: torch.Tensor, scale: float,
                     gqa_mode: str = "native") -> torch.Tensor:
    """Causal prefill without context: q [B, T, Hq, D], k/v [B, T, Hkv, D] -> [B, T, Hq, D].

    Right padding; `query_lens` [B] are the valid lengths (padded query rows give 0).
    """
    q = query.transpose(1, 2)
    k, v = fsdpa_kv(q, key.transpose(1, 2), value.transpose(1, 2), gqa_mode)
    out = habana.FusedSDPA.apply(q, k, v, None, 0.0, True, scale, "None", False, query_lens,
                              "right")
    return out.transpose(1, 2)


def encoder_prompt_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             query_lens: torch.Tensor, scale: float,
                             gqa_mode: str = "native") -> torch.Tensor:
    """Bidirectional prefill (encoder-only models): q [B, T, Hq, D] -> [B, T, Hq, D].

    Right padding: row i of a sequence sees every key j < its length; an additive
    [B, 1, 1, T] mask (a fixed shape per bucket) hides the padding. A padded batch
    entry (length 0) still sees key 0, so padding never yields NaN."""
    q = query.transpose(1, 2)
    k, v = fsdpa_kv(q, key.transpose(1, 2), value.transpose(1, 2), gqa_mode)
    t = query.shape[1]
    lens = query_lens.to(query.device).clamp(min=1)
    visible = torch.arange(t, device=query.device)[None, :] < lens[:, None]
    mask = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
    mask = mask.masked_fill_(~visible, float("-inf"))[:, None, None, :]
    out = habana.FusedSDPA.apply(q, k, v, mask, 0.0, False, scale, "None", False)
    return out.transpose(1, 2)


def context_attention_mask(context_lens: torch.Tensor, past_len: int, new_len: int,
                           dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, T, past_len + T]: past j < context_len, new part causal."""
    past_ok = torch.arange(past_len, device=context_lens.device)[None, :] < context_lens[:, None]
    rows = torch.arange(new_len, device=context_lens.device)
    causal = rows[None, :] <= rows[:, None]                        # [T, T]
    batch = context_lens.shape[0]
    allowed = torch.cat((past_ok[:, None, :].expand(batch, new_len, past_len),
                         causal[None].expand(batch, new_len, new_len)), dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=context_lens.device)
    return mask.masked_fill_(~allowed, float("-inf")).unsqueeze(1)


def gather_context(cache: torch.Tensor, context_block_list: torch.Tensor,
                   block_size: int) -> torch.Tensor:
    """[B, C * block_size, H, D]: the cached tokens of each sequence's C context blocks."""
    batch, ctx_blocks = context_block_list.shape
    heads, dim = cache.shape[1], cache.shape[2]
    blocks = cache.view(-1, block_size, heads, dim).index_select(0, context_block_list.reshape(-1))
    return blocks.view(batch, ctx_blocks * block_size, heads, dim)


def prompt_attention_with_context(query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, key_cache: torch.Tensor,
                                  value_cache: torch.Tensor, context_block_list: torch.Tensor,
                                  context_lens: torch.Tensor, block_size: int,
                                  scale: float, gqa_mode: str = "native",
                                  kv_scales: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                                  ) -> torch.Tensor:
    """Prefill after a context (prefix-cache hit or earlier chunk).

    q [B, T, Hq, D] and k/v [B, T, Hkv, D] are the new tokens (right padded);
    `context_block_list` [B, C] lists each sequence's context blocks (pad block
    beyond its context), `context_lens` [B] its context tokens. The past K/V is
    gathered in front of the new tokens; past positions at or beyond the context
    length are masked and the new part is causal. Padded query rows stay finite
    (they see at least the first new token) and are ignored by the caller.
    `block_size` is a constant of the engine, so it does not multiply graphs.
    `kv_scales`: as in flat_paged_attention (fp8 caches).
    """
    past_k = gather_context(key_cache, context_block_list, block_size)
    past_v = gather_context(value_cache, context_block_list, block_size)
    if kv_scales is not None:
        past_k = dequantize_kv(past_k, kv_scales[0], query.dtype)
        past_v = dequantize_kv(past_v, kv_scales[1], query.dtype)
    k = torch.cat((past_k, key), dim=1).transpose(1, 2)            # [B, Hkv, S, D]
    v = torch.cat((past_v, value), dim=1).transpose(1, 2)
    mask = context_attention_mask(context_lens, past_k.shape[1], query.shape[1], query.dtype)
    q = query.transpose(1, 2)
    k, v = fsdpa_kv(q, k, v, gqa_mode)
    out = habana.FusedSDPA.apply(q, k, v, mask, 0.0, False, scale, "None", False, None, "right")
    return out.transpose(1, 2)


def prompt_attention_masked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor,
                            scale: float, logits_soft_cap: Optional[float],
                            sliding_window: Optional[int],
                            alibi_slopes: Optional[torch.Tensor] = None,
                            sinks: Optional[torch.Tensor] = None,
                            q_groups: Optional[torch.Tensor] = None,
                            k_groups: Optional[torch.Tensor] = None,
                            chunk_size: Optional[int] = None) -> torch.Tensor:
    """Prefill for layers with a soft-cap, a sliding window, ALiBi slopes [Hq]
    (`slope * (k_pos - q_pos)` added per head) or sinks [Hq] (one more logit per head in
    each softmax denominator), explicit float32 scores.

    q [B, T, Hq, D], k/v [B, S, Hkv, D]; q_pos [B, T] and k_pos [B, S] are positions in
    the sequence, k_valid [B, S] marks keys that exist (context blocks beyond a
    sequence's context are not). A key is seen when valid, not after the query and,
    with a window, within the last `sliding_window` positions. q_groups [B, T] /
    k_groups [B, S] (image of each position, -1 text): tokens of one image also see each
    other's later positions (Gemma 3). Padded query rows see at least the first key, so
    they stay finite.
    """
    group = query.shape[2] // key.shape[2]
    q = query.transpose(1, 2).float()                                   # [B, Hq, T, D]
    k = key.transpose(1, 2).float().repeat_interleave(group, dim=1)     # [B, Hq, S, D]
    v = value.transpose(1, 2).float().repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    if alibi_slopes is not None:
        rel = (k_pos[:, None, :] - q_pos[:, :, None]).float()          # [B, T, S]
        scores = scores + alibi_slopes.float().view(1, -1, 1, 1) * rel[:, None]
    allowed = k_pos[:, None, :] <= q_pos[:, :, None]
    if q_groups is not None:
        allowed = allowed | ((q_groups[:, :, None] == k_groups[:, None, :])
                             & (q_groups[:, :, None] >= 0))
    allowed = allowed & k_valid[:, None, :]
    if sliding_window is not None:
        allowed &= k_pos[:, None, :] > q_pos[:, :, None] - sliding_window
    if chunk_size is not None:  # chunked local attention: the query's own chunk
        allowed &= (k_pos // chunk_size)[:, None, :] == (q_pos // chunk_size)[:, :, None]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = softmax_with_sinks(scores, None if sinks is None else sinks.view(1, -1, 1, 1))
    out = torch.matmul(probs, v)                                        # [B, Hq, T, D]
    return out.transpose(1, 2).to(query.dtype)

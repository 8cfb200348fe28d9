"""What each layer keeps in the KV cache, and how layers share the cache's memory.

A layer's `KVCacheSpec` says what one block of its cache holds: K and V for
`block_size` tokens (`FullAttentionSpec`), the same for a layer that only ever looks
at the last `sliding_window` tokens (`SlidingWindowSpec`), or MLA's one latent row per
token (`MLAAttentionSpec`). The runner collects the specs from the model's attention
layers once, after loading (`collect_kv_cache_specs`, vllm/worker/kv_cache_layout.py:
the scheduler reads this module and must not reach model code); block sizing, allocation, the
scheduler's block tables, KV I/O and the HPU cache all read them instead of asking the
model config whether it is MLA. A layer kind with other per-request state (a Mamba
layer's fixed-size state) is one more subclass: its page size and how many blocks a
request holds are the two facts the rest of the engine reads.

Layers with the same spec form groups (`KVCacheGroupSpec`). Every group has its own
block table per request, all drawn from one pool of `num_blocks` blocks, and the cache
is `KVCacheTensor`s, each shared by one layer of every group: block id b of tensor j is
the memory of layer j of whichever group block b was given to. So a sliding-window
group, whose requests hold only the blocks of their window, leaves the rest of the
pool to the full-attention group (vLLM's hybrid KV cache manager). Sharing needs the
same page size in every group and groups of one size: kinds are cut into groups of
the smallest kind's layer count (the last group of a kind may be shorter).

State-space layers (`MambaSpec`: a Mamba2 mixer's conv and SSM states) keep no
blocks: each running request holds one state slot, the same size whatever its length,
in tensors of their own (vllm/worker/state_cache.py). They are kept out of the groups
(`KVCacheConfig.state_specs`); block sizing charges a request's state bytes to the
blocks of a full-length request, so the block count and the maximum-concurrency log
line account for them.

Without sliding-window savings (`hybrid=False`, or one kind of layer) there is one
group, every layer has its own tensor, and sliding-window layers are treated as full
attention: the layout of a cache without groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's cache, per block of `block_size` tokens."""
    block_size: int
    kind = "base"

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer."""
        raise NotImplementedError

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The most blocks one request of `max_model_len` tokens holds at once, with at
        most `max_num_batched_tokens` tokens computed in a step."""
        raise NotImplementedError


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    """KV heads of this rank."""
    head_size: int
    dtype: torch.dtype
    kind = "attention"

    @property
    def num_parts(self) -> int:
        """Tensors cached per token and head: K and V."""
        return 2

    @property
    def page_size_bytes(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return self.num_parts * self.block_size * self.num_kv_heads * self.head_size * elem

    @property
    def tensor_shape_key(self) -> tuple:
        """What the allocated tensor looks like: layers with equal keys can share one."""
        return (self.num_parts, self.block_size, self.num_kv_heads, self.head_size, self.dtype)


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Every token of the sequence stays in the cache."""
    kind = "full_attention"

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return _cdiv(max_model_len, self.block_size)


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """A query at position p attends to positions (p - sliding_window, p]: older blocks
    are freed (their entries in the block table become the null block)."""
    sliding_window: int
    kind = "sliding_window"

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        # The window behind the first new token, plus a step's new tokens, written
        # before the blocks falling out of the window are freed; one more block where
        # the window does not start at a block boundary.
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return min(_cdiv(tokens, self.block_size) + 1, _cdiv(max_model_len, self.block_size))

    def as_full(self) -> FullAttentionSpec:
        return FullAttentionSpec(self.block_size, self.num_kv_heads, self.head_size, self.dtype)


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent row (`kv_lora_rank + rope` wide) per
    token, K and V at once (vllm/attention/mla.py)."""
    kind = "mla"

    @property
    def num_parts(self) -> int:
        return 1


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A state-space layer: per request, a conv state (the last `conv_kernel - 1`
    inputs of the causal conv1d) and an SSM state, whatever the request's length.
    Shapes are one request's, of this rank."""
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype
    kind = "mamba"

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one request's state (one slot) of this layer."""
        return (_numel(self.conv_shape) * _elem(self.conv_dtype)
                + _numel(self.ssm_shape) * _elem(self.ssm_dtype))

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return 0  # a state slot, not pool blocks


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _elem(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def is_state(spec: KVCacheSpec) -> bool:
    return isinstance(spec, MambaSpec)


@dataclass
class KVCacheGroupSpec:
    """Layers that share one block table per request."""
    layer_ids: list[int]
    """Global layer indices (the index into the runner's KV cache list)."""
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheTensor:
    """One allocated cache tensor and the layers (at most one per group) it serves."""
    shared_by: list[int]


@dataclass
class KVCacheConfig:
    """How the whole model's KV cache is laid out: groups and shared tensors."""
    kv_cache_groups: list[KVCacheGroupSpec]
    kv_cache_tensors: list[KVCacheTensor]
    num_blocks: int = 0
    """Blocks in the one pool every group draws from (set once sized)."""
    layer_specs: dict[int, KVCacheSpec] = field(default_factory=dict)
    """The spec each layer was given (a sliding layer's may be full attention here)."""
    state_specs: dict[int, MambaSpec] = field(default_factory=dict)
    """State-space layers (no blocks: one state slot per running request)."""

    def state_slots(self, num_blocks: int, max_model_len: int, block_size: int,
                    max_num_seqs: int) -> int:
        """State slots (requests running at once) a pool of `num_blocks` pays for: each
        block was charged a full-length request's share of the state, so the pool holds
        the states of `num_blocks // ceil(max_model_len / block_size)` requests; at most
        `max_num_seqs`, at least 1. The engine caps max_num_seqs to it."""
        per_request = _cdiv(max_model_len, block_size)
        return max(1, min(max_num_seqs, num_blocks // per_request))

    def state_bytes_per_request(self, layer_ids: Optional[Iterable[int]] = None) -> int:
        """Bytes of one request's state slot across the state layers of `layer_ids`."""
        owned = None if layer_ids is None else set(layer_ids)
        return sum(s.page_size_bytes for i, s in self.state_specs.items()
                   if owned is None or i in owned)

    @property
    def is_hybrid(self) -> bool:
        """More than one group, or a group that frees blocks outside its window."""
        return (len(self.kv_cache_groups) > 1
                or any(isinstance(g.kv_cache_spec, SlidingWindowSpec)
                       for g in self.kv_cache_groups))

    def group_of_layer(self) -> dict[int, int]:
        return {layer: g for g, group in enumerate(self.kv_cache_groups)
                for layer in group.layer_ids}

    def block_bytes(self, layer_ids: Optional[Iterable[int]] = None) -> int:
        """Bytes of one block id across the tensors serving `layer_ids` (default all)."""
        owned = None if layer_ids is None else set(layer_ids)
        total = 0
        for tensor in self.kv_cache_tensors:
            layers = [i for i in tensor.shared_by if owned is None or i in owned]
            if layers:
                total += max(self.layer_specs[i].page_size_bytes for i in layers)
        return total

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks of the pool one request of `max_model_len` tokens may hold at once."""
        return sum(g.kv_cache_spec.max_blocks_per_request(max_model_len,
                                                          max_num_batched_tokens)
                   for g in self.kv_cache_groups)

    def describe(self) -> str:
        """One log line's worth: each group's kind and layer count."""
        parts = []
        for group in self.kv_cache_groups:
            spec = group.kv_cache_spec
            window = f" {spec.sliding_window}" if isinstance(spec, SlidingWindowSpec) else ""
            parts.append(f"{spec.kind}{window} x{len(group.layer_ids)}")
        if self.state_specs:
            parts.append(f"mamba state x{len(self.state_specs)} "
                         f"({self.state_bytes_per_request()} bytes per request)")
        return f"{len(self.kv_cache_groups)} group(s) [{', '.join(parts)}], " \
               f"{len(self.kv_cache_tensors)} tensors"


def get_kv_cache_config(specs: dict[int, KVCacheSpec], hybrid: bool = True,
                        num_blocks: int = 0) -> KVCacheConfig:
    """Groups and tensors for `specs` (every layer of the model: all pipeline stages).

    `hybrid`: sliding-window layers keep only their window (their own groups, sharing
    tensors with the full-attention groups); else they are treated as full attention.
    """
    state_specs = {i: s for i, s in specs.items() if is_state(s)}
    specs = {i: s for i, s in specs.items() if not is_state(s)}
    config = _attention_config(specs, hybrid, num_blocks)
    config.state_specs = state_specs
    return config


def _attention_config(specs: dict[int, KVCacheSpec], hybrid: bool,
                      num_blocks: int) -> KVCacheConfig:
    if not specs:  # a pure state-space model: blocks only count tokens
        return KVCacheConfig([], [], num_blocks, {})
    if not hybrid or not _can_share(specs):
        specs = {i: s.as_full() if isinstance(s, SlidingWindowSpec) else s
                 for i, s in specs.items()}
    kinds: dict[KVCacheSpec, list[int]] = {}
    for i in sorted(specs):
        kinds.setdefault(specs[i], []).append(i)
    if len(kinds) == 1:
        ((spec, layers),) = kinds.items()
        return KVCacheConfig([KVCacheGroupSpec(layers, spec)],
                             [KVCacheTensor([i]) for i in layers], num_blocks, dict(specs))
    if len({s.page_size_bytes for s in kinds}) > 1:
        raise ValueError("Layers with different KV cache page sizes cannot share one "
                         f"block pool: {sorted({s.page_size_bytes for s in kinds})} bytes.")
    size = min(len(layers) for layers in kinds.values())
    groups = []
    # Full-attention groups first: group 0's table covers the whole sequence, which
    # is what code that reads one table (KV connectors, the draft model) needs.
    for spec in sorted(kinds, key=lambda s: isinstance(s, SlidingWindowSpec)):
        layers = kinds[spec]
        groups += [KVCacheGroupSpec(layers[k:k + size], spec)
                   for k in range(0, len(layers), size)]
    tensors = [KVCacheTensor([g.layer_ids[j] for g in groups if j < len(g.layer_ids)])
               for j in range(size)]
    return KVCacheConfig(groups, tensors, num_blocks, dict(specs))


def _can_share(specs: dict[int, KVCacheSpec]) -> bool:
    """Groups can share tensors only when every layer's tensor looks the same."""
    keys = {getattr(s, "tensor_shape_key", None) for s in specs.values()}
    return len(keys) == 1 and None not in keys


def is_sliding(spec: KVCacheSpec) -> bool:
    return isinstance(spec, SlidingWindowSpec)


__all__ = ["KVCacheSpec", "AttentionSpec", "FullAttentionSpec", "SlidingWindowSpec",
           "MLAAttentionSpec", "MambaSpec", "KVCacheGroupSpec", "KVCacheTensor", "KVCacheConfig",
           "get_kv_cache_config", "is_sliding", "is_state"]

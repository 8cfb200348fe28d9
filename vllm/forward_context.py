"""The one piece of state shared by every attention layer during a forward pass.

Lifetime: the model runner enters `set_forward_context(...)` around exactly one
`model(...)` call; attention layers read it with `get_forward_context()`. Outside
that block there is no context, and `Attention` falls back to plain causal
attention over the whole input (used by profiling runs and unit tests).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch


@dataclass
class ForwardContext:
    attn_metadata: Any
    """Backend-specific metadata built by the model runner for this step."""
    kv_caches: list[torch.Tensor]
    """One KV cache tensor per attention layer of this rank, indexed by layer index."""
    attn_impl: Any
    """The backend the runner built `attn_metadata` for: the platform's, which the
    Attention layers chose when they were built (attention/selector.py)."""
    group_metadata: list[Any] = field(default_factory=list)
    """Metadata of KV cache groups 1.. (vllm/kv_cache_spec.py: each group has its own
    block tables); empty with one group."""
    layer_group: dict[int, int] = field(default_factory=dict)
    """Layer index -> its KV cache group (layers not listed: group 0)."""
    rope_tables: dict[int, tuple] = field(default_factory=dict)
    """Rotary cos/sin tables gathered for this pass's positions, by rotary module
    (every layer shares one module and one positions tensor). They live for this one
    pass only: a CUDA or HPU graph is captured in a pass of its own, so the gather is
    recorded in the graph; a table kept from an earlier call on the same static
    positions buffer would be baked into the graph with that call's positions."""
    wait_for_layer: Optional[Callable[[int], None]] = None
    """Set while a KV connector loads this step's KV layer by layer (`kv_layer_gate`):
    each attention layer calls it with its index before it reads its cache."""


    def metadata_for(self, layer_idx: int) -> Any:
        """The attention metadata of the layer's KV cache group."""
        if not self.group_metadata:
            return self.attn_metadata
        group = self.layer_group.get(layer_idx, 0)
        return self.attn_metadata if group == 0 else self.group_metadata[group - 1]


_forward_context: Optional[ForwardContext] = None
_layer_gate: Optional[Callable[[int], None]] = None


@contextmanager
def kv_layer_gate(wait: Optional[Callable[[int], None]]) -> Iterator[None]:
    """Lifetime: the model runner enters it around each forward pass of a step while a KV
    connector copies the step's KV in (vllm/kv_transfer/offloading_worker.py); every
    forward context made inside carries `wait` as `wait_for_layer`. None: no gate. Not
    for passes that cannot call out (a replayed graph): the runner waits for every
    layer before those."""
    global _layer_gate
    prev = _layer_gate
    _layer_gate = wait
    try:
        yield
    finally:
        _layer_gate = prev


def get_forward_context() -> Optional[ForwardContext]:
    return _forward_context


@contextmanager
def set_forward_context(attn_metadata: Any, kv_caches: list[torch.Tensor],
                        attn_impl: Any, group_metadata: Optional[list[Any]] = None,
                        layer_group: Optional[dict[int, int]] = None) -> Iterator[None]:
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata, kv_caches, attn_impl,
                                      group_metadata or [], layer_group or {},
                                      wait_for_layer=_layer_gate)
    try:
        yield
    finally:
        _forward_context = prev

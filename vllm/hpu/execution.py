"""How the HPU runner executes the model: HPU graphs, lazy, torch.compile or eager.

| PT_HPU_LAZY_MODE | enforce_eager | mode |
|---|---|---|
| 1 | False | HPU graphs: lazy mode, one graph captured per warmed bucket |
| 1 | True  | lazy: ops accumulate into a lazy graph cut by `mark_step()` |
| 0 | False | torch.compile (backend `hpu_backend` on Gaudi) |
| 0 | True  | eager |

torch.compile is regional: every submodule that contains no attention layer
(embedding, norms, projections, MLPs, rotary) is compiled with `dynamic=False`,
while attention and the glue between layers run eagerly. Attention reads the
per-pass metadata from the forward context, a global that changes every step;
tracing it would recompile every step. Identical layers share their compiled
code, so a bucket costs one compile per region type. On the fake HPU the backend
is `fake_hpu_backend` (vllm/hpu/habana/fake_compile.py): dynamo traces and guards exactly
as with a real backend and the graph runs eagerly (inductor's C++ code generation
would take minutes per bucket on a CPU); during warmup (`warmup_context`) its
regions return zeros of their traced shapes instead of doing the CPU arithmetic.
"""
from __future__ import annotations

import contextlib
import enum
import logging
from typing import Any, Callable, ContextManager, Optional, Union

import torch
from torch import nn

from vllm.hpu import habana
from vllm.attention import Attention
from vllm.forward_context import set_forward_context
from vllm.sequence import IntermediateTensors

logger = logging.getLogger(__name__)


class ExecutionMode(enum.Enum):
    HPU_GRAPHS = "HPU graphs"
    LAZY = "lazy"
    TORCH_COMPILE = "torch.compile"
    EAGER = "eager"

    @classmethod
    def select(cls, lazy: bool, enforce_eager: bool) -> "ExecutionMode":
        if lazy:
            return cls.LAZY if enforce_eager else cls.HPU_GRAPHS
        return cls.EAGER if enforce_eager else cls.TORCH_COMPILE

    @property
    def is_lazy(self) -> bool:
        return self in (ExecutionMode.HPU_GRAPHS, ExecutionMode.LAZY)


CompileBackend = Union[str, Callable[..., Any]]


def compile_backend() -> CompileBackend:
    """Gaudi's dynamo backend on hardware; `fake_hpu_backend` on the fake HPU."""
    return habana.compile_backend()


def backend_name(backend: CompileBackend) -> str:
    return backend if isinstance(backend, str) else backend.__name__


def warmup_context(mode: ExecutionMode) -> ContextManager[None]:
    """Wraps the warmup's dummy passes: on the fake HPU in torch.compile mode the
    compiled regions trace and guard every bucket shape but skip the arithmetic
    (nothing of it is kept; on Gaudi it is nearly free, on the CPU it was most of
    the warmup); anywhere else a no-op."""
    if mode is ExecutionMode.TORCH_COMPILE:
        return habana.warmup_regions()
    return contextlib.nullcontext()


class HPUModelAdapter(nn.Module):
    """The unit an HPU graph records: one model call inside its forward context.

    Everything that varies per pass is an argument (token ids, positions, the
    attention metadata, the KV caches and, with LoRA, each row's adapter slot), so the
    graph's key is their signature. Returns the hidden states `[rows, hidden]`.
    """

    def __init__(self, model: nn.Module, attn_impl: Any, lora_batch: Any = None) -> None:
        super().__init__()
        self.model = model
        self.attn_impl = attn_impl
        self.lora_batch = lora_batch
        """The LoRA layers' shared per-pass mapping (vllm/lora/punica.py), or None."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any,
                kv_caches: list[torch.Tensor], lora_slots: Optional[torch.Tensor] = None,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        """Hidden states; on a pipeline stage before the last, its IntermediateTensors
        (a later stage gets the previous one's as `intermediate_tensors`). A
        multimodal model's prompt passes bring `inputs_embeds` (images merged in)."""
        args = (input_ids, positions) if intermediate_tensors is None else (
            input_ids, positions, intermediate_tensors)
        kwargs = {} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        with set_forward_context(attn_metadata, kv_caches, self.attn_impl):
            if lora_slots is None or self.lora_batch is None:
                return self.model(*args, **kwargs)
            self.lora_batch.set_indices(lora_slots)  # inside the graph: an input
            try:
                return self.model(*args, **kwargs)
            finally:
                self.lora_batch.clear()


def _contains_attention(module: nn.Module) -> bool:
    return any(isinstance(m, Attention) for m in module.modules())


def _raise_recompile_limits(limit: int) -> None:
    """Dynamo falls back to eager after a few shapes; every bucket is one shape."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def compile_regions(module: nn.Module, backend: CompileBackend, max_shapes: int = 1024) -> int:
    """Compile (in place) the largest submodules without attention; returns how many."""
    _raise_recompile_limits(max_shapes)
    count = 0
    for child in module.children():
        if _contains_attention(child):
            count += compile_regions(child, backend, max_shapes)
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            child.compile(backend=backend, dynamic=False)
            count += 1
    return count


def prepare_forward_module(model: nn.Module, attn_impl: Any, mode: ExecutionMode,
                           lora_batch: Any = None) -> nn.Module:
    """The adapter, wrapped for the mode (called as in `run_forward`)."""
    adapter = HPUModelAdapter(model, attn_impl, lora_batch)
    if mode is ExecutionMode.HPU_GRAPHS:
        return habana.wrap_in_hpu_graph(adapter, disable_tensor_cache=True)
    if mode is ExecutionMode.TORCH_COMPILE:
        backend = compile_backend()
        regions = compile_regions(model, backend)
        logger.info("torch.compile (backend %r, dynamic=False): %d regions compiled per "
                    "bucket shape; attention runs eagerly.", backend_name(backend), regions)
    return adapter


def run_forward(module: nn.Module, mode: ExecutionMode, use_graph: bool,
                input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any,
                kv_caches: list[torch.Tensor], lora_slots: Optional[torch.Tensor] = None,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
    """One forward pass; in lazy modes the graph is cut before and after it.

    `lora_slots` (`[rows]`, -1: no adapter) and `intermediate_tensors` (a later
    pipeline stage's input) are passed on only when given, so a runner without LoRA
    or pipeline parallelism keeps the graph signature it always had."""
    extra = () if lora_slots is None else (lora_slots,)
    kwargs: dict[str, Any] = ({} if intermediate_tensors is None else
                              {"intermediate_tensors": intermediate_tensors})
    if inputs_embeds is not None:
        kwargs["inputs_embeds"] = inputs_embeds
    if mode.is_lazy:
        habana.mark_step()
    if mode is ExecutionMode.HPU_GRAPHS:
        hidden = module(input_ids, positions, attn_metadata, kv_caches, *extra, **kwargs,
                        bypass_hpu_graphs=not use_graph)
    else:
        hidden = module(input_ids, positions, attn_metadata, kv_caches, *extra, **kwargs)
    if mode.is_lazy:
        habana.mark_step()
    return hidden

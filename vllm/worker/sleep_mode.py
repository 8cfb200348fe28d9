"""Sleep mode (vLLM's `LLM.sleep` / `wake_up`): give the device memory back while idle.

- level 1: the weights go to host memory and the KV cache is freed. `wake_up` moves
  the weights back and allocates a fresh (zeroed) KV cache.
- level 2: the weights are discarded too. `wake_up` allocates them again and reloads
  them from the checkpoint through the model loader (`load_weights_into`), so the
  model is the one that was loaded at start.

The model's modules stay: only each parameter's storage changes (`param.data`), so
the layers, their wrappers (HPU graph, compiled regions) and every reference to a
parameter object remain valid; what runs after the wake-up is the same code on
tensors of the same shapes. On a CPU device, level 1 moves nothing (the weights are
in host memory already). Buffers (rotary tables and the like, which checkpoints do
not hold) always stay.

Tags, as in vLLM: "weights" and "kv_cache" can be woken up separately
(`wake_up(tags=["weights"])`, then `["kv_cache"]`), e.g. to update the weights
before the KV cache takes memory again.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

SLEEP_TAGS = ("weights", "kv_cache")
SLEEP_LEVELS = (1, 2)


def check_sleep_level(level: int) -> None:
    if level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level={level!r}: choose 1 (weights offloaded to host "
                         "memory, KV cache freed) or 2 (weights and KV cache freed).")


def check_wake_tags(tags: Optional[list[str]]) -> tuple[str, ...]:
    """The tags to wake up (all when None); ValueError naming an unknown one."""
    if tags is None:
        return SLEEP_TAGS
    unknown = sorted(set(tags) - set(SLEEP_TAGS))
    if unknown:
        raise ValueError(f"wake_up tags={unknown}: the tags are {list(SLEEP_TAGS)}.")
    return tuple(t for t in SLEEP_TAGS if t in tags)


@dataclass
class SleepingWeights:
    """What a worker keeps of its weights while asleep."""
    level: int
    shapes: dict[str, tuple[torch.Size, torch.dtype]] = field(default_factory=dict)
    """Level 2: each parameter's shape and dtype (its storage is gone)."""


def _parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter once (tied ones under their first name)."""
    return dict(model.named_parameters())


def release_weights(model: nn.Module, level: int, device: torch.device) -> SleepingWeights:
    """Level 1: move the parameters to host memory (a no-op on a CPU device); level 2:
    drop their storage. Derived copies (the CPU kernels' packed weights) are dropped."""
    from vllm.cpu.gemm import drop_packed_weights
    drop_packed_weights(model)
    _forget_prepared_layer_calls(model)
    state = SleepingWeights(level)
    for name, param in _parameters(model).items():
        if level == 2:
            state.shapes[name] = (param.shape, param.dtype)
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        elif param.device.type != "cpu":
            param.data = param.data.to("cpu")
    return state


def return_freed_host_memory() -> bool:
    """Hand the heap's free pages back to the OS (glibc `malloc_trim`).

    The CPU runner keeps freed memory mapped for speed (cpu_model_runner.py:
    `keep_freed_memory_mapped`), so released weights would otherwise stay in this
    process's heap, reusable by it but not by anyone else. False without glibc."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _forget_prepared_layer_calls(model: nn.Module) -> None:
    """Fused decoder stacks keep prepared native calls (weight pointers, packed copies):
    they would keep the packed copies alive, and are rebuilt from the restored weights."""
    from vllm.model_executor.layers.decoder_stack import DecoderStack
    for module in model.modules():
        if isinstance(module, DecoderStack):
            module.state.clear()


def restore_weights(model: nn.Module, state: SleepingWeights, device: torch.device,
                    vllm_config) -> None:
    """Undo `release_weights`: back to `device`, or reallocated and reloaded (level 2)."""
    params = _parameters(model)
    if state.level == 1:
        for param in params.values():
            if param.device != device:
                param.data = param.data.to(device)
        return
    for name, param in params.items():
        shape, dtype = state.shapes[name]
        param.data = torch.empty(shape, dtype=dtype, device=device)
    from vllm.model_executor.model_loader import load_weights_into
    load_weights_into(model, vllm_config, device)


def check_level2_supported(vllm_config) -> None:
    """Level 2 reloads the checkpoint into the built model: refused where the model's
    parameters no longer have their load-time layout (quantized weights are rewritten
    after loading; LoRA wraps the layers whose weights the loader fills)."""
    mc = vllm_config.model_config
    if getattr(mc, "quant_config", None) is not None:
        raise ValueError(f"sleep(level=2) reloads the weights from the checkpoint, which is "
                         f"not supported with quantization={mc.quant_config.name!r}; use "
                         "level=1.")
    if vllm_config.lora_config is not None:
        raise ValueError("sleep(level=2) reloads the weights from the checkpoint, which is "
                         "not supported with enable_lora=True; use level=1.")

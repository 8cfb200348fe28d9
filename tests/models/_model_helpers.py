"""Shared by the model tests (also imported by the TP/PP worker processes)."""
from __future__ import annotations

import torch


def make_vllm_config(path: str, dtype: str = "float32", tp: int = 1, pp: int = 1,
                     load_format: str = "auto"):
    from vllm.config import (CacheConfig, DeviceConfig, LoadConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.transformers_utils.config import create_model_config
    return VllmConfig(create_model_config(model=path, dtype=dtype), CacheConfig(),
                      SchedulerConfig(),
                      ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp),
                      DeviceConfig(device="cpu"), LoadConfig(load_format=load_format))


def prompt_ids(n: int = 40, vocab: int = 49152, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen)


@torch.no_grad()
def full_prompt_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of every position, with no forward context (plain causal attention)."""
    positions = torch.arange(input_ids.numel())
    return model.compute_logits(model(input_ids, positions))


@torch.no_grad()
def hf_logits(path: str, input_ids: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model(input_ids[None]).logits[0]

"""Helpers of the weight-update tests: a second checkpoint of the same model, greedy runs."""
from __future__ import annotations

import os
import shutil

PROMPTS = [
    "The capital of France is a city where the river runs under many old bridges and",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2) # and",
    "Once upon a time, there was a quiet village at the edge of a great dark forest, and",
]
"""Longer than two 16-token blocks: a stale prefix-cache hit would change the tokens."""
MAX_TOKENS = 12


def make_other_checkpoint(src: str, dst: str, seed: int = 1) -> str:
    """A copy of the checkpoint at `src` with every tensor changed (same names, shapes
    and dtypes): what a trainer's next step would publish."""
    import torch
    from safetensors.torch import load_file, save_file
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    gen = torch.Generator().manual_seed(seed)
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            state = load_file(os.path.join(src, name))
            new = {k: (v + 0.5 * v.std() * torch.randn(v.shape, generator=gen)).to(v.dtype)
                   if v.dim() >= 2 else v for k, v in state.items()}
            save_file(new, os.path.join(dst, name), metadata={"format": "pt"})
    return dst


def checkpoint_tensors(path: str) -> dict:
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


def greedy(llm, prompts=PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params,
                                                               use_tqdm=False)]


def update_by_shm(llm, tensors: dict, batches: int = 2) -> None:
    """One update session sending `tensors` in `batches` shared-memory segments."""
    from vllm.distributed.weight_transfer import pack_into_shared_memory
    items = list(tensors.items())
    llm.start_weight_update()
    step = -(-len(items) // batches)
    for i in range(0, len(items), step):
        shm, info = pack_into_shared_memory(items[i:i + step])
        try:
            llm.update_weights({"update_info": info})
        finally:
            shm.close()
            shm.unlink()

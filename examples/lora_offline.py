"""Two LoRA adapters and the base model in one batch (offline).

Makes two random PEFT adapters for the default model (needs `pip install peft`), then
generates with each prompt's own adapter; pass your adapters' directories instead.
"""
from __future__ import annotations

import sys
import tempfile

from vllm import LLM, SamplingParams
from vllm.config import DEFAULT_MODEL
from vllm.transformers_utils.config import resolve_model_path
from vllm.lora.request import LoRARequest


def random_adapter(model_path: str, out_dir: str, seed: int) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    import peft.tuners.lora.inc as inc
    inc.is_inc_available = lambda: False  # plain torch layers, whatever else is installed
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    model.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    paths = sys.argv[1:3]
    if not paths:
        tmp = tempfile.mkdtemp()
        base = resolve_model_path(DEFAULT_MODEL)
        paths = [random_adapter(base, f"{tmp}/a{i}", seed=i) for i in range(2)]
    llm = LLM(enable_lora=True, max_loras=2, max_lora_rank=16)
    loras = [None] + [LoRARequest(f"adapter{i}", i + 1, p) for i, p in enumerate(paths)]
    prompts = ["The capital of France is"] * len(loras)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16),
                        lora_request=loras)
    for lora, out in zip(loras, outs):
        print(f"{lora.lora_name if lora else 'base':>9}: {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()

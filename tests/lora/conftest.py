"""Fixtures for LoRA tests: random adapters made with `peft` (the reference) on a base."""
from __future__ import annotations

import os

import pytest
import torch

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "List three benefits of regular exercise:",
]

# (name, LoraConfig kwargs): ranks, targets, alpha and rsLoRA differ between adapters.
ADAPTERS = [
    ("sql", dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"])),
    ("poet", dict(r=16, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True)),
    ("chat", dict(r=4, lora_alpha=32, target_modules=["o_proj", "gate_proj", "down_proj"],
                  rank_pattern={"down_proj": 2}, alpha_pattern={"o_proj": 4})),
    ("math", dict(r=8, lora_alpha=8, target_modules=["k_proj", "up_proj"])),
    ("code", dict(r=2, lora_alpha=4, target_modules=["q_proj", "gate_proj"])),
]


def _plain_torch_peft() -> None:
    """peft dispatches to Intel Neural Compressor layers whenever that package is
    importable (even for plain nn.Linear); our references are plain torch models."""
    import peft.tuners.lora.inc as inc
    inc.is_inc_available = lambda: False


def make_peft_adapter(base_path: str, out_dir: str, seed: int, scale: float = 1.0,
                      **lora_kwargs) -> str:
    """Save a peft LoRA adapter with random (non-zero) A and B for the model at base_path."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    _plain_torch_peft()
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora_kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
    model.save_pretrained(out_dir)
    return out_dir


def peft_model(base_path: str, adapter_dir: str):
    """peft's own model: the base in float32 with the saved adapter applied (unmerged)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    _plain_torch_peft()
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()


def greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt_ids]),
                             attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                             temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="session")
def qwen2_base(tiny_model_factory) -> str:
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="session")
def qwen2_adapters(qwen2_base, tmp_path_factory) -> dict[str, str]:
    """name -> adapter directory, for every entry of ADAPTERS on the tiny Qwen2."""
    root = tmp_path_factory.mktemp("qwen2-adapters")
    return {name: make_peft_adapter(qwen2_base, os.path.join(root, name), seed=i, scale=2.0,
                                    **kw)
            for i, (name, kw) in enumerate(ADAPTERS)}

MAX_TOKENS = 10


@pytest.fixture(scope="session")
def qwen2_prompt_ids(qwen2_base) -> list[list[int]]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(qwen2_base)
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="session")
def qwen2_references(qwen2_base, qwen2_adapters, qwen2_prompt_ids) -> dict:
    """name -> peft's greedy tokens per prompt; None -> the base model's (transformers)."""
    from transformers import AutoModelForCausalLM
    refs = {}
    base = AutoModelForCausalLM.from_pretrained(qwen2_base, dtype=torch.float32).eval()
    refs[None] = [greedy(base, ids, MAX_TOKENS) for ids in qwen2_prompt_ids]
    for name, path in qwen2_adapters.items():
        model = peft_model(qwen2_base, path)
        refs[name] = [greedy(model, ids, MAX_TOKENS) for ids in qwen2_prompt_ids]
    return refs

"""Fixtures for engine tests: one fp32 LLM on the default model, and HF references."""
from __future__ import annotations

import gc

import pytest
import torch

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "List three benefits of regular exercise:",
    "The quick brown fox",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "Translate to French: Good morning, how are you?",
]

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name a primary color."}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
]


@pytest.fixture(scope="session")
def default_llm():
    from vllm import LLM
    llm = LLM(dtype="float32", max_model_len=1024, max_num_seqs=64,
              kv_cache_memory_bytes=256 << 20)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="session")
def hf_default_model():
    """transformers' own model on the same weights (the converted GGUF directory)."""
    from transformers import AutoModelForCausalLM
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(DEFAULT_MODEL),
                                                 dtype=torch.float32)
    return model.eval()


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_id=None):
    """HF greedy continuation (no padding) and each step's log-softmax."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             eos_token_id=eos_token_id, pad_token_id=0, temperature=None,
                             top_p=None, top_k=None)
    new_ids = out.sequences[0, len(prompt_ids):].tolist()
    logprobs = [torch.log_softmax(step[0].double(), -1) for step in out.logits]
    return new_ids, logprobs

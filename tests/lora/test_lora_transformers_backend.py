"""LoRA on the Transformers modeling backend: the backend's linear layers are ours, so
the LoRA wrappers attach by the checkpoint's module names. An OLMo 2 model (no native
class) serves two peft adapters and the base in one batch with peft's greedy tokens, on
CPU and on the fake HPU (static-shape LoRA, 0 compiles after warmup)."""
from __future__ import annotations

import os

import pytest

from tests.lora.conftest import greedy, make_peft_adapter, peft_model

TARGETS = {"a": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"]),
           "b": dict(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])}
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def setup(tiny_model_factory, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base = tiny_model_factory("olmo2")
    root = tmp_path_factory.mktemp("olmo2-adapters")
    adapters = {n: make_peft_adapter(base, os.path.join(root, n), seed=i, scale=2.0, **kw)
                for i, (n, kw) in enumerate(TARGETS.items())}
    tok = AutoTokenizer.from_pretrained(base)
    ids = [tok.encode(p) for p in PROMPTS]
    refs = {None: [greedy(AutoModelForCausalLM.from_pretrained(base).eval(), i, MAX_TOKENS)
                   for i in ids]}
    for name, path in adapters.items():
        model = peft_model(base, path)
        refs[name] = [greedy(model, i, MAX_TOKENS) for i in ids]
    return base, adapters, ids, refs


def _run(base: str, adapters: dict, ids: list, **kwargs) -> dict:
    """Every prompt with each adapter and with none, all in one generate call."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    llm = LLM(base, dtype="float32", max_model_len=128, enable_lora=True, max_lora_rank=8,
              max_loras=2, model_impl="transformers", kv_cache_memory_bytes=16 << 20,
              **kwargs)
    try:
        names = [None, *adapters]
        requests = {n: (LoRARequest(n, i + 1, adapters[n]) if n else None)
                    for i, n in enumerate(names)}
        jobs = [(n, p) for n in names for p in ids]
        outs = llm.generate([{"prompt_token_ids": p} for _, p in jobs],
                            SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                           ignore_eos=True),
                            lora_request=[requests[n] for n, _ in jobs], use_tqdm=False)
        got: dict = {}
        for (n, _), o in zip(jobs, outs):
            got.setdefault(n, []).append(list(o.outputs[0].token_ids))
        compiles = getattr(llm.llm_engine.engine_core.executor.worker.model_runner,
                           "num_compiles_after_warmup", 0)
    finally:
        llm.llm_engine.shutdown()
    return got, compiles


def test_adapters_match_peft_on_cpu(setup):
    base, adapters, ids, refs = setup
    got, _ = _run(base, adapters, ids)
    assert got == refs
    assert got["a"] != got[None] and got["b"] != got[None]


def test_adapters_on_fake_hpu_without_compiles(setup):
    from tests.hpu.conftest import platform_env
    base, adapters, ids, refs = setup
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_PROMPT_BS_BUCKET_MAX="4",
                      VLLM_PROMPT_SEQ_BUCKET_MAX="128", VLLM_DECODE_BS_BUCKET_MAX="16"):
        got, compiles = _run(base, adapters, ids, max_num_seqs=16)
    assert got == refs and compiles == 0

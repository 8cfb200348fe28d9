"""More architectures end to end: greedy tokens identical to transformers for 32 new
tokens on 6 prompts (fp32), top-5 logprobs within 1e-3, through the whole engine
(paged KV cache, chunked batches), on tiny random-weight checkpoints."""
from __future__ import annotations

import gc

import pytest
import torch

from tests.engine.conftest import PROMPTS, hf_greedy
from vllm import LLM, SamplingParams

NEW_TOKENS = 32
PROMPT_COUNT = 6


def greedy_with_logprobs(llm: LLM, prompt_ids: list[list[int]]):
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params,
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs]


def assert_matches_transformers(path: str, results, prompt_ids) -> None:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for ids, (tokens, logprobs) in zip(prompt_ids, results):
        ref_ids, ref_lps = hf_greedy(hf, ids, NEW_TOKENS)
        assert tokens == ref_ids, f"prompt {ids[:6]}..."
        for step, (lp_dict, ref) in enumerate(zip(logprobs, ref_lps)):
            vals, tids = ref.topk(5)
            for tid, val in zip(tids.tolist(), vals.tolist()):
                assert tid in lp_dict, f"step {step}: token {tid} not in our top-5"
                assert abs(lp_dict[tid].logprob - val) < 1e-3, (step, tid)


def run_engine(path: str, **kwargs) -> tuple[list[list[int]], list]:
    llm = LLM(model=path, dtype="float32", max_model_len=512, kv_cache_memory_bytes=32 << 20,
              block_size=16, **kwargs)
    tok = llm.get_tokenizer()
    prompt_ids = [tok.encode(p) for p in PROMPTS[:PROMPT_COUNT]]
    results = greedy_with_logprobs(llm, prompt_ids)
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return prompt_ids, results


CASES = {
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),
    # One dense layer (mlp_only_layers) beside a sparse one; no top-k renormalization.
    "qwen2_moe-dense-layer": ("qwen2_moe", dict(mlp_only_layers=[0])),
    "qwen3_moe": ("qwen3_moe", {}),
    "phi3": ("phi3", {}),
    # LongRoPE: short factors below 256 positions, attention factor from 1024 / 256.
    "phi3-longrope-partial": ("phi3", dict(
        original_max_position_embeddings=256, max_position_embeddings=1024,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                             partial_rotary_factor=0.5, short_factor=[1.0, 1.5, 2.0, 4.0],
                             long_factor=[2.0, 3.0, 5.0, 9.0]))),
    "granite": ("granite", {}),
    # Windows shorter than prompt + output: decodes and prefills see only the window.
    "gemma2-window": ("gemma2", dict(sliding_window=8)),
    "gemma3-window": ("gemma3", dict(sliding_window=8, layer_types=["sliding_attention",
                                                                     "full_attention"])),
    "mistral-window": ("mistral", dict(sliding_window=8)),
    "qwen2-window-upper-layer": ("qwen2", dict(use_sliding_window=True, sliding_window=6,
                                               max_window_layers=1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_and_logprobs_match_transformers(case, tiny_model_factory):
    arch, overrides = CASES[case]
    path = tiny_model_factory(arch, **overrides)
    prompt_ids, results = run_engine(path)
    assert_matches_transformers(path, results, prompt_ids)


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "torch-ops"])
def test_window_and_soft_cap_with_chunked_prefill(native, tiny_model_factory, monkeypatch):
    """Prompts longer than the window, prefilled in 16-token chunks (later chunks attend
    to the cached context through the window), with and without the native kernels."""
    monkeypatch.setenv("VLLM_CPU_NATIVE_OPS", "1" if native else "0")
    path = tiny_model_factory("gemma2", sliding_window=8)
    llm = LLM(model=path, dtype="float32", max_model_len=512, kv_cache_memory_bytes=32 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=4)
    tok = llm.get_tokenizer()
    prompt_ids = [tok.encode(" ".join(PROMPTS[i:i + 3]))[:n]
                  for i, n in ((0, 40), (3, 23), (5, 33))]
    results = greedy_with_logprobs(llm, prompt_ids)
    llm.llm_engine.shutdown()
    assert_matches_transformers(path, results, prompt_ids)

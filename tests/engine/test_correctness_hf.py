"""Greedy tokens identical to transformers, logprobs close: the default model and tiny ones."""
from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import CHATS, PROMPTS, hf_greedy
from vllm import LLM, SamplingParams

MAX_TOKENS = 64


def _chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_default_model_greedy_matches_transformers(default_llm, hf_default_model):
    tok = default_llm.get_tokenizer()
    prompt_ids = [tok.encode(p) for p in PROMPTS] + [_chat_ids(tok, c) for c in CHATS]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = default_llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params,
                                use_tqdm=False)
    assert len(outs) == len(prompt_ids) >= 8
    for ids, out in zip(prompt_ids, outs):
        ref_ids, ref_lps = hf_greedy(hf_default_model, ids, MAX_TOKENS)
        ours = out.outputs[0]
        assert ours.token_ids == ref_ids, f"prompt {ids[:8]}..."
        assert len(ours.logprobs) == MAX_TOKENS
        for step, (lp_dict, ref) in enumerate(zip(ours.logprobs, ref_lps)):
            top_vals, top_ids = ref.topk(5)
            for tid, val in zip(top_ids.tolist(), top_vals.tolist()):
                assert tid in lp_dict, f"step {step}: token {tid} missing from top-5"
                assert abs(lp_dict[tid].logprob - val) < 1e-3
            assert lp_dict[ref_ids[step]].rank == 1


def test_default_model_chat_stops_at_eos(default_llm, hf_default_model):
    """LLM.chat applies the template and stops at <|im_end|> like HF generate."""
    tok = default_llm.get_tokenizer()
    out = default_llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=48),
                           use_tqdm=False)[0]
    ref_ids, _ = hf_greedy(hf_default_model, _chat_ids(tok, CHATS[0]), 48,
                           eos_token_id=tok.eos_token_id)
    assert out.outputs[0].token_ids == ref_ids
    if ref_ids[-1] == tok.eos_token_id:
        assert out.outputs[0].finish_reason == "stop"
        assert "<|im_end|>" not in out.outputs[0].text
    assert "4" in out.outputs[0].text


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "llama"])
def test_tiny_models_greedy_match_transformers(arch, tiny_model_factory):
    from transformers import AutoModelForCausalLM
    overrides = {}
    if arch == "llama":
        overrides = dict(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 256},
                         tie_word_embeddings=True)
    path = tiny_model_factory(arch, **overrides)
    llm = LLM(model=path, dtype="float32", max_model_len=512, kv_cache_memory_bytes=32 << 20,
              block_size=16)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = llm.get_tokenizer()
    prompts = PROMPTS[:4]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=3)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        ref_ids, ref_lps = hf_greedy(hf, ids, 32)
        assert out.outputs[0].token_ids == ref_ids, f"{arch}: {prompt!r}"
        for lp_dict, ref in zip(out.outputs[0].logprobs, ref_lps):
            for tid, val in zip(*[t.tolist() for t in reversed(ref.topk(3))]):
                assert abs(lp_dict[tid].logprob - val) < 1e-3

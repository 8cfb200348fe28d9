"""LLM.beam_search against transformers' generate(num_beams=4, do_sample=False)."""
from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import PROMPTS
from vllm import LLM
from vllm.beam_search import run_beam_search
from vllm.sampling_params import BeamSearchParams

WIDTH, NEW = 4, 10


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    from transformers import AutoModelForCausalLM
    path = tiny_model_factory("qwen2")
    llm = LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20,
              block_size=16, enable_prefix_caching=True)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield llm, hf
    llm.llm_engine.shutdown()


def hf_beams(hf, ids: list[int], eos, length_penalty: float = 1.0):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), num_beams=WIDTH, do_sample=False,
                          max_new_tokens=NEW, num_return_sequences=WIDTH,
                          length_penalty=length_penalty, early_stopping=False,
                          eos_token_id=eos, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True, temperature=None, top_p=None,
                          top_k=None)
    seqs = []
    for row in out.sequences.tolist():
        gen = row[len(ids):]
        if eos is not None and eos in gen:  # padded after the hypothesis ended
            gen = gen[:gen.index(eos) + 1]
        seqs.append(gen)
    return seqs, out.sequences_scores.tolist()


def test_beam_search_matches_transformers_without_eos(tiny):
    llm, hf = tiny
    tok = llm.get_tokenizer()
    prompts = PROMPTS[:4]
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=WIDTH, max_tokens=NEW,
                                                     ignore_eos=True))
    assert len(outs) == 4
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        ref_seqs, ref_scores = hf_beams(hf, ids, eos=None)
        ours = [s.tokens[len(ids):] for s in out.sequences]
        assert ours == ref_seqs, prompt
        assert [s.finish_reason for s in out.sequences] == ["length"] * WIDTH
        for seq, score in zip(out.sequences, ref_scores):
            assert seq.tokens[:len(ids)] == ids
            assert abs(seq.score - score) < 1e-4
            assert abs(seq.cum_logprob / NEW - score) < 1e-4
            assert seq.text == tok.decode(seq.tokens[len(ids):], skip_special_tokens=True)
            assert len(seq.logprobs) == NEW


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_beam_search_with_eos_and_length_penalty_matches_transformers(tiny, length_penalty):
    """EOS = a token the beams produce early, so hypotheses finish at different lengths
    and the length penalty decides between them."""
    llm, hf = tiny
    tok = llm.get_tokenizer()
    prompts = PROMPTS[4:8]
    prompt_ids = [tok.encode(p) for p in prompts]
    # The token the best HF beam of the first prompt emits second becomes the EOS.
    eos = hf_beams(hf, prompt_ids[0], eos=None)[0][0][1]

    def generate(batch, params):
        return llm.generate([{"prompt_token_ids": t} for t in batch], params, use_tqdm=False)

    params = BeamSearchParams(beam_width=WIDTH, max_tokens=NEW, length_penalty=length_penalty)
    outs = run_beam_search(prompt_ids, params, eos, generate, tok.decode)
    finished_early = 0
    for ids, out in zip(prompt_ids, outs):
        ref_seqs, ref_scores = hf_beams(hf, ids, eos=eos, length_penalty=length_penalty)
        ours = [s.tokens[len(ids):] for s in out.sequences]
        assert ours == ref_seqs
        for seq, score in zip(out.sequences, ref_scores):
            assert abs(seq.score - score) < 1e-4
        finished_early += sum(s.finish_reason == "stop" for s in out.sequences)
    if length_penalty == 0.0:  # raw sums: short hypotheses win
        assert finished_early > 0


def test_beams_share_prefix_blocks(tiny):
    llm, _ = tiny
    before = llm.llm_engine.get_stats().prefix_cache_hits
    llm.beam_search([PROMPTS[0] * 3], BeamSearchParams(beam_width=2, max_tokens=4))
    assert llm.llm_engine.get_stats().prefix_cache_hits > before


def test_beam_search_params_are_checked(tiny):
    llm, _ = tiny
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(["hi"], {"beam_width": 2})

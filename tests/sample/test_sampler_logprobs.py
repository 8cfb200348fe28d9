"""Logprobs and ranks from the sampler and for prompts, against a float64 reference."""
from __future__ import annotations

import torch

from vllm.engine.logprobs_utils import RequestLogprobs, make_logprob_dict
from vllm.sample.logprobs import LogprobsLists, compute_prompt_logprobs
from vllm.sample.metadata import SamplingMetadata, SamplingRow
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import build_metadata
from vllm.sampling_params import SamplingParams


def quantized_logits(rows, vocab, seed=0):
    """Logits on a 0.25 grid: exact ties exist, distinct values are well separated."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-40, 40, (rows, vocab), generator=g).float() / 4


def reference(logits, token_ids):
    lp = torch.log_softmax(logits.double(), dim=-1)
    chosen = lp.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    ranks = (lp > chosen.unsqueeze(1)).sum(-1) + 1
    return lp, chosen, ranks


def test_sample_logprobs_are_raw_and_ranked():
    logits = quantized_logits(16, 300)
    params = [SamplingParams(temperature=0.7, top_k=5, presence_penalty=1.0, logprobs=4),
              SamplingParams(temperature=0.0, logprobs=2), SamplingParams()]
    rows = [SamplingRow(params[i % 3], [1, 2], [3, 3]) for i in range(16)]
    md = build_metadata(rows, 300, "cpu")
    assert md.max_num_logprobs == 4
    out = Sampler()(logits.clone(), md)
    t = out.logprobs_tensors
    assert t.logprob_token_ids.shape == (16, 5) and t.logprobs.shape == (16, 5)
    assert torch.equal(t.logprob_token_ids[:, 0], out.sampled_token_ids)
    lp, chosen, ranks = reference(logits, out.sampled_token_ids)
    # Raw logprobs: temperature, top-k and penalties do not change them.
    assert torch.allclose(t.logprobs[:, 0].double(), chosen, atol=1e-5)
    assert torch.equal(t.selected_token_ranks, ranks)
    top_values = lp.topk(4, dim=-1).values
    assert torch.allclose(t.logprobs[:, 1:].double(), top_values, atol=1e-5)
    assert torch.allclose(lp.gather(1, t.logprob_token_ids[:, 1:]), top_values, atol=1e-5)


def test_rank_counts_strictly_greater_entries():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    params = SamplingParams(temperature=0.0, logprobs=0, allowed_token_ids=[0])
    md = build_metadata([SamplingRow(params, [], [])], 4, "cpu")
    t = Sampler()(logits.clone(), md).logprobs_tensors
    assert t.logprob_token_ids.tolist() == [[0]]  # logprobs=0: only the sampled token
    assert t.selected_token_ranks.tolist() == [3]  # two tied entries above it


def test_prompt_logprobs_match_reference():
    logits = quantized_logits(12, 200, seed=3)
    targets = torch.randint(0, 200, (12,))
    t = compute_prompt_logprobs(logits, targets, num_logprobs=3)
    lp, chosen, ranks = reference(logits, targets)
    assert torch.equal(t.logprob_token_ids[:, 0], targets)
    assert torch.allclose(t.logprobs[:, 0].double(), chosen, atol=1e-5)
    assert torch.equal(t.selected_token_ranks, ranks)
    assert torch.allclose(t.logprobs[:, 1:].double(), lp.topk(3, dim=-1).values, atol=1e-5)
    bf = compute_prompt_logprobs(logits.to(torch.bfloat16), targets, 0)
    assert bf.logprobs.dtype == torch.float32 and bf.logprobs.shape == (12, 1)


def test_make_logprob_dict_cuts_to_request_k_and_decodes():
    d = make_logprob_dict([7, 7, 3, 9], [-0.5, -0.5, -1.0, -2.0], 1, num_logprobs=2,
                          decode=lambda t: f"<{t}>")
    assert list(d) == [7, 3]
    assert (d[7].rank, d[3].rank, d[3].logprob, d[3].decoded_token) == (1, 2, -1.0, "<3>")
    d = make_logprob_dict([5, 7, 3], [-4.0, -0.5, -1.0], 12, num_logprobs=2)
    assert list(d) == [5, 7, 3] and d[5].rank == 12 and d[5].decoded_token is None


def test_request_logprobs_accumulate():
    acc = RequestLogprobs(num_logprobs=1, num_prompt_logprobs=0, decode=str)
    acc.add_sample(LogprobsLists([[4, 2, 1]], [[-1.5, -0.1, -0.2]], [3]))
    acc.add_sample(LogprobsLists([[2, 2, 1]], [[-0.25, -0.25, -0.2]], [1]))
    assert acc.cumulative_logprob == -1.75
    assert [list(d) for d in acc.logprobs] == [[4, 2], [2]]
    acc.add_prompt(LogprobsLists([[8, 1], [9, 1]], [[-3.0, -1.0], [-2.0, -1.0]], [5, 4]))
    acc.add_prompt(LogprobsLists([[6, 1]], [[-1.0, -1.0]], [1]))
    assert acc.prompt_logprobs[0] is None
    assert [list(d) for d in acc.prompt_logprobs[1:]] == [[8], [9], [6]]
    assert acc.prompt_logprobs[1][8].rank == 5
    none = RequestLogprobs(None, None)
    assert none.add_sample(LogprobsLists([[1]], [[-1.0]], [1])) == []
    assert none.logprobs is None and none.cumulative_logprob is None
    assert none.prompt_logprobs is None

"""The rejection sampler: greedy verification, and a chi-square test that speculative
sampling emits the target distribution whatever the drafts."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from vllm.sample.metadata import SamplingMetadata, make_generator
from vllm.sample.sampler import Sampler
from vllm.spec_decode.rejection_sampler import NO_DRAFT, rejection_sample


def _drafts(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor([t for r in rows for t in (*r, NO_DRAFT)])


def test_greedy_accepts_while_the_draft_is_the_argmax():
    V = 5
    # Request 0: 3 drafts, argmaxes 1 2 3 4 -> drafts 1 2 0 rejected at position 2.
    # Request 1: no drafts. Request 2: 2 drafts, both right -> bonus.
    argmax = [1, 2, 3, 4, 0, 2, 4, 1]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), V).float()
    out = rejection_sample(Sampler(), logits, None, _drafts([[1, 2, 0], [], [2, 4]]),
                           [3, 0, 2])
    assert out.output_token_ids == [[1, 2, 3], [0], [2, 4, 1]]
    assert out.num_accepted == [2, 0, 2]
    assert out.logprobs is None


def _random_md(num_rows: int, V: int, top_k: int = 0, logprobs=None,
               generators=None) -> SamplingMetadata:
    return SamplingMetadata(num_rows=num_rows, vocab_size=V, all_greedy=False,
                            all_random=True, temperature=torch.full((num_rows,), 0.7),
                            top_k=torch.full((num_rows,), top_k) if top_k else None,
                            max_num_logprobs=logprobs, generators=generators or {})


def _target(logits: torch.Tensor, top_k: int = 0) -> np.ndarray:
    scaled = logits / 0.7
    if top_k:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled.double(), -1).numpy()


@pytest.mark.parametrize("top_k", [0, 3])
def test_random_sampling_emits_the_target_distribution(top_k):
    """N requests with 2 drafts each, drawn from a skewed law unrelated to the target
    (often wrong, sometimes outside top-k): the first emitted token follows p_0, and
    the second (emitted only after draft 0 was accepted) follows p_1. (Uniform drafts
    would hide a wrong resampling rule by symmetry.)"""
    torch.manual_seed(0)
    V, N, k = 6, 20000, 2
    base = torch.randn(k + 1, V) * 1.5
    logits = base.repeat(N, 1)
    draft_law = torch.tensor([0.5, 0.25, 0.1, 0.1, 0.05, 0.0])
    drafts = torch.multinomial(draft_law, N * k, replacement=True).view(N, k)
    draft_ids = torch.cat([drafts, torch.full((N, 1), NO_DRAFT)], 1).flatten()
    out = rejection_sample(Sampler(), logits.clone(), _random_md(N * (k + 1), V, top_k),
                           draft_ids, [k] * N)
    first = np.array([t[0] for t in out.output_token_ids])
    second = np.array([t[1] for t in out.output_token_ids if len(t) > 1])
    for tokens, p in ((first, _target(base[0], top_k)), (second, _target(base[1], top_k))):
        counts = np.bincount(tokens, minlength=V)
        keep = p > 0
        assert counts[~keep].sum() == 0  # nothing outside top-k is ever emitted
        expected = p[keep] * len(tokens)
        assert chisquare(counts[keep], expected).pvalue > 1e-3, (counts, expected)
    accepted = np.mean([n for n in out.num_accepted])
    assert 0.1 < accepted < 1.9  # drafts are accepted sometimes, not always


def test_seeded_rows_are_reproducible_and_logprobs_are_the_targets():
    V = 8
    logits = torch.randn(3, V)

    def run():
        gen = make_generator(1234)
        md = _random_md(3, V, logprobs=2, generators={0: gen, 1: gen, 2: gen})
        return rejection_sample(Sampler(), logits.clone(), md, _drafts([[3, 5]]), [2])

    a, b = run(), run()
    assert a.output_token_ids == b.output_token_ids
    raw = torch.log_softmax(logits, -1)
    for row, (ids, lps, rank) in enumerate(a.logprobs[0]):
        assert ids[0] == a.output_token_ids[0][row]
        assert lps[0] == pytest.approx(raw[row, ids[0]].item(), abs=1e-5)
        assert ids[1:] == raw[row].topk(2).indices.tolist()

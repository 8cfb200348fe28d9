"""Static-shape sampling for the HPU: same tokens and logprobs as the default sampler."""
from __future__ import annotations

import pytest
import torch

from vllm.sample.metadata import SamplingMetadata, SamplingRow, make_generator
from vllm.sample.ops.topk_topp import apply_top_k_top_p, apply_top_k_top_p_sorted
from vllm.sample.logits_processors.dense import DENSE
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import SamplingState, build_metadata
from vllm.sampling_params import SamplingParams
from vllm.hpu.sampling import (logprobs_bucket, logprobs_buckets, padded_rows,
                                      sampler_signature, static_metadata)

V = 300


def test_sorted_top_k_top_p_equals_windowed():
    torch.manual_seed(0)
    logits = torch.randn(6, V) * 3
    logits[1] = 0.0  # ties everywhere
    top_k = torch.tensor([0, 5, 0, 1, 299, 40])
    top_p = torch.tensor([0.9, 1.0, 1.0, 0.5, 0.999, 0.3])
    ref = apply_top_k_top_p(logits.clone(), top_k, top_p)
    got = apply_top_k_top_p_sorted(logits.clone(), top_k, top_p)
    assert torch.equal(torch.isinf(ref), torch.isinf(got))
    assert torch.equal(ref[~torch.isinf(ref)], got[~torch.isinf(got)])


def _rows(seed_offset: int = 0) -> list[SamplingRow]:
    p = [SamplingParams(temperature=0.0, logprobs=3),
         SamplingParams(temperature=0.8, top_p=0.9, seed=11, logprobs=5),
         SamplingParams(temperature=1.2, top_k=7, seed=5, presence_penalty=0.5,
                        repetition_penalty=1.3, logit_bias={3: 4.0, 9: -2.0}),
         SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[1, 2],
                        frequency_penalty=0.7),
         SamplingParams(temperature=0.7, min_p=0.1, seed=9)]
    hist = [[1, 2, 3], [4, 4, 5], [3, 9, 9, 3], [1, 7], [8]]
    return [SamplingRow(params, h[:1], h[1:],
                        make_generator(params.seed + seed_offset) if params.seed else None)
            for params, h in zip(p, hist)]


def test_static_metadata_samples_like_the_default_sampler():
    """Real rows placed at bucket rows 0, 2, 3, 5, 6 of a batch of 8 (dummy rows
    elsewhere, whole-row penalties, dense bias and min_tokens mask, logprob bucket 8
    for K=5) give the default sampler's tokens, logprobs and ranks."""
    torch.manual_seed(1)
    real = torch.randn(5, V) * 2
    ref = Sampler()(real.clone(), build_metadata(_rows(), V, "cpu"))
    where = [0, 2, 3, 5, 6]
    bucket = torch.randn(8, V) * 2
    bucket[where] = real
    rows = padded_rows(dict(zip(where, _rows())), 8)
    md = static_metadata(rows, V, "cpu")
    inputs = md.logits_inputs
    assert md.max_num_logprobs == 8 and inputs["penalties"].rows.shape[0] == 8
    assert inputs[DENSE].bias.shape == inputs[DENSE].ban.shape == (8, V)
    assert list(inputs) == [DENSE, "penalties"]  # bias and the masks folded
    got = Sampler(static_shapes=True)(bucket, md)
    assert got.sampled_token_ids[where].tolist() == ref.sampled_token_ids.tolist()
    lp_ref, lp_got = ref.logprobs_tensors, got.logprobs_tensors
    assert torch.equal(lp_got.selected_token_ranks[where], lp_ref.selected_token_ranks)
    assert torch.equal(lp_got.logprob_token_ids[where, :6], lp_ref.logprob_token_ids)
    torch.testing.assert_close(lp_got.logprobs[where, :6], lp_ref.logprobs)


def test_signature_depends_on_shapes_not_on_the_requests():
    """Two batches of the same bucket with different knobs (seeds, top-p on or off,
    logprobs 3 or 4, penalties, logit_bias, min_tokens, allowed_token_ids) key the same
    graph, so warmup covers them all; a new batch size or logprob bucket does not."""
    def sig(params: list[SamplingParams], size: int = 4):
        rows = {i: SamplingRow(p, (1,), (2,), make_generator(p.seed) if p.seed else None)
                for i, p in enumerate(params)}
        batch = SamplingState(size)  # the batch's state (its penalty count table)
        return sampler_signature(torch.zeros(size, V), static_metadata(
            padded_rows(rows, size), V, "cpu", sampling=batch))
    a = sig([SamplingParams(temperature=0.5, seed=1, logprobs=3), SamplingParams()])
    b = sig([SamplingParams(temperature=0.0, logprobs=4),
             SamplingParams(top_p=0.5, min_p=0.2, top_k=3)])
    assert a == b
    assert sig([SamplingParams(logprobs=5)]) != a
    assert sig([SamplingParams(logprobs=3)], size=8) != a
    for knobs in ({"presence_penalty": 1.0}, {"repetition_penalty": 1.3},
                  {"logit_bias": {3: 5.0, 7: -2.0}}, {"min_tokens": 4, "stop_token_ids": [2]},
                  {"allowed_token_ids": [1, 2, 3]}):
        assert sig([SamplingParams(logprobs=3, **knobs)]) == a, knobs


def test_logprob_buckets():
    assert [logprobs_bucket(k, V) for k in (None, 0, 1, 3, 5, 16, 17)] == [
        None, 0, 1, 4, 8, 16, 32]
    assert logprobs_bucket(200, V) == 256 and logprobs_bucket(280, V) == V
    assert logprobs_buckets(20, V) == [0, 1, 2, 4, 8, 16, 32]
    assert logprobs_buckets(-1, 10) == [0, 1, 2, 4, 8, 10]

"""Sampler: every parameter changes the outcome the way vLLM's does.

Statistical tests draw many rows in one batch with a fixed global seed and compare
empirical frequencies with the exact target distribution; the bounds are loose enough
to be stable and tight enough that ignoring the parameter fails them.
"""
from __future__ import annotations

import pytest
import torch

from vllm.sample import sampler as sampler_module
from vllm.sample.metadata import SamplingMetadata, SamplingRow, make_generator
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import build_metadata
from vllm.sampling_params import SamplingParams

NUM_DRAWS = 20000
TOLERANCE = 0.02  # total-variation distance allowed between empirical and exact


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def run(rows, logits):
    md = build_metadata(rows, logits.shape[1], "cpu")
    return Sampler()(logits.clone(), md)


def empirical(params, logits_row, draws=NUM_DRAWS, prompt=(), output=()):
    rows = [SamplingRow(params, list(prompt), list(output)) for _ in range(draws)]
    out = run(rows, logits_row.unsqueeze(0).repeat(draws, 1))
    counts = torch.bincount(out.sampled_token_ids, minlength=logits_row.numel())
    return counts.double() / draws


def tv(p, q):
    return 0.5 * (p.double() - q.double()).abs().sum().item()


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])


def test_temperature_one_matches_softmax():
    freq = empirical(SamplingParams(temperature=1.0), LOGITS)
    assert tv(freq, torch.softmax(LOGITS.double(), -1)) < TOLERANCE


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_reshapes_distribution(temperature):
    target = torch.softmax(LOGITS.double() / temperature, -1)
    assert tv(target, torch.softmax(LOGITS.double(), -1)) > 5 * TOLERANCE  # meaningful
    freq = empirical(SamplingParams(temperature=temperature), LOGITS)
    assert tv(freq, target) < TOLERANCE


def test_greedy_is_argmax_and_skips_random_machinery(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("random sampling used for an all-greedy batch")
    monkeypatch.setattr(sampler_module, "random_sample", boom)
    logits = torch.randn(64, 100)
    rows = [SamplingRow(SamplingParams(temperature=0.0), [], []) for _ in range(64)]
    md = build_metadata(rows, 100, "cpu")
    assert md.all_greedy and md.temperature is None
    out = Sampler()(logits.clone(), md)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs_tensors is None


def test_top_k_one_equals_greedy():
    logits = torch.randn(200, 500) * 3
    rows = [SamplingRow(SamplingParams(temperature=1.3, top_k=1), [], []) for _ in range(200)]
    out = run(rows, logits)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


def test_top_k_keeps_only_k_most_likely():
    freq = empirical(SamplingParams(top_k=2), LOGITS)
    target = torch.softmax(LOGITS[:2].double(), -1)
    assert freq[2:].sum() == 0
    assert tv(freq[:2], target) < TOLERANCE


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    freq = empirical(SamplingParams(top_p=0.7), logits)
    assert freq[2:].sum() == 0  # 0.5 + 0.3 >= 0.7: the rest is dropped
    assert tv(freq[:2], torch.tensor([0.625, 0.375])) < TOLERANCE
    freq = empirical(SamplingParams(top_p=0.9), logits)
    assert freq[3] == 0 and freq[2] > 0.1


def test_top_k_then_top_p_on_renormalized_mass():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # After top_k=3: [4/9, 3/9, 2/9]; top_p=0.75 then needs the first two (7/9 >= 0.75).
    freq = empirical(SamplingParams(top_k=3, top_p=0.75), probs.log())
    assert freq[2:].sum() == 0
    assert tv(freq[:2], torch.tensor([4 / 7, 3 / 7])) < TOLERANCE


def test_min_p_drops_unlikely_tokens():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    freq = empirical(SamplingParams(min_p=0.2), probs.log())  # threshold 0.1
    assert freq[3] == 0
    assert tv(freq[:3], probs[:3] / probs[:3].sum()) < TOLERANCE


def test_unseeded_rows_differ():
    logits = torch.zeros(2, 1000)
    rows = [SamplingRow(SamplingParams(), [], []) for _ in range(2)]
    draws = [run(rows, logits).sampled_token_ids for _ in range(10)]
    assert any(d[0] != d[1] for d in draws)
    assert len({int(d[0]) for d in draws}) > 1


def _seeded_sequence(seed, batch_builder, steps=8):
    gen = make_generator(seed)
    logits = torch.zeros(1, 1000)
    tokens = []
    for step in range(steps):
        target = SamplingRow(SamplingParams(seed=seed), [], list(tokens), gen)
        rows, index = batch_builder(target, step)
        batch = logits.repeat(len(rows), 1)
        tokens.append(int(run(rows, batch).sampled_token_ids[index]))
    return tokens


def test_seed_reproducible_whatever_the_batch_mates():
    alone = _seeded_sequence(42, lambda row, step: ([row], 0))

    def crowded(row, step):
        mates = [SamplingRow(SamplingParams(), [], []) for _ in range(step % 3 + 1)]
        mates.append(SamplingRow(SamplingParams(temperature=0.0), [], []))
        mates.append(SamplingRow(SamplingParams(seed=7), [], [], make_generator(7)))
        rows = mates[:1] + [row] + mates[1:]
        return rows, 1

    assert _seeded_sequence(42, crowded) == alone
    assert _seeded_sequence(43, lambda row, step: ([row], 0)) != alone


def test_mixed_batch_greedy_rows_stay_greedy():
    logits = torch.randn(6, 300)
    rows = [SamplingRow(SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0), [], [])
            for i in range(6)]
    md = build_metadata(rows, 300, "cpu")
    assert not md.all_greedy and not md.all_random
    out = Sampler()(logits.clone(), md).sampled_token_ids
    assert torch.equal(out[0::2], logits[0::2].argmax(-1))


def processed(params, logits, prompt=(), output=()):
    """Logits after constraints, bias and penalties (what greedy's argmax sees)."""
    rows = [SamplingRow(p, list(prompt), list(output)) for p in params]
    md = build_metadata(rows, logits.shape[1], "cpu")
    return Sampler.apply_logit_processing(logits.clone().float(), md)


def test_repetition_penalty_hf_semantics():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    # token 0 in the prompt, token 1 in the output, tokens 2/3 unseen.
    out = processed([SamplingParams(repetition_penalty=2.0)], logits, prompt=[0], output=[1, 1])
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, 2.0, -2.0, 1.0]]))
    # Greedy changes: token 0 (prompt) drops from 3.0 to 1.5, below token 2.
    logits = torch.tensor([[3.0, 0.0, 2.0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    out = run([SamplingRow(params, [0], [])], logits)
    assert int(out.sampled_token_ids[0]) == 2


def test_frequency_and_presence_penalties_count_output_only():
    logits = torch.zeros(1, 5)
    history = dict(prompt=[4], output=[1, 1, 1, 2])
    out = processed([SamplingParams(frequency_penalty=0.5)], logits, **history)
    assert torch.allclose(out, torch.tensor([[0.0, -1.5, -0.5, 0.0, 0.0]]))
    out = processed([SamplingParams(presence_penalty=0.7)], logits, **history)
    assert torch.allclose(out, torch.tensor([[0.0, -0.7, -0.7, 0.0, 0.0]]))
    out = processed([SamplingParams(presence_penalty=-1.0, frequency_penalty=1.0)], logits,
                    output=[3, 3])
    assert torch.allclose(out, torch.tensor([[0.0, 0.0, 0.0, -1.0, 0.0]]))


def test_penalties_leave_other_rows_untouched():
    logits = torch.randn(3, 50)
    params = [SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams()]
    out = processed(params, logits, prompt=[1, 2], output=[3, 3, 4])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    expected = logits[1].clone()
    expected[3] -= 2.0
    expected[4] -= 1.0
    assert torch.allclose(out[1], expected)


def test_penalties_change_sampling():
    freq = empirical(SamplingParams(presence_penalty=2.0), torch.zeros(4), output=[0, 1])
    # exp(-2) weight for tokens 0 and 1: p = e^-2 / (2 e^-2 + 2) each.
    w = torch.tensor([torch.e ** -2, torch.e ** -2, 1.0, 1.0], dtype=torch.float64)
    assert tv(freq, w / w.sum()) < TOLERANCE


def test_logit_bias_moves_greedy_and_sampling():
    logits = torch.randn(4, 100)
    params = SamplingParams(temperature=0.0, logit_bias={"17": 100.0})
    out = run([SamplingRow(params, [], []) for _ in range(4)], logits)
    assert torch.all(out.sampled_token_ids == 17)
    freq = empirical(SamplingParams(logit_bias={0: -100, 5: 3.0}), LOGITS)
    target = torch.softmax(LOGITS.double() + torch.tensor([-100, 0, 0, 0, 0, 3.0]), -1)
    assert freq[0] == 0 and tv(freq, target) < TOLERANCE


def test_allowed_token_ids_restrict_sampling():
    freq = empirical(SamplingParams(allowed_token_ids=[3, 5]), LOGITS)
    assert freq[[0, 1, 2, 4]].sum() == 0
    target = torch.softmax(LOGITS[[3, 5]].double(), -1)
    assert tv(freq[[3, 5]], target) < TOLERANCE
    # Another row of the same batch is not constrained.
    logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    rows = [SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=[2]), [], []),
            SamplingRow(SamplingParams(temperature=0.0), [], [])]
    assert run(rows, logits).sampled_token_ids.tolist() == [2, 0]


def test_min_tokens_masks_stop_tokens_until_reached():
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[4])
    params.update_from_generation_config({}, eos_token_id=0)
    logits = torch.tensor([[9.0, 1.0, 2.0, 0.0, 8.0]])
    for output, expected in [([], 2), ([2, 2], 2), ([2, 2, 2], 0)]:
        out = run([SamplingRow(params, [1], output)], logits)
        assert int(out.sampled_token_ids[0]) == expected, output
    freq = empirical(SamplingParams(min_tokens=2, stop_token_ids=[0]), LOGITS, output=[1])
    assert freq[0] == 0 and freq[1] > 0


def test_bfloat16_logits():
    logits = torch.randn(8, 64).to(torch.bfloat16)
    rows = [SamplingRow(SamplingParams(temperature=0.0, logprobs=2), [], [])] * 8
    out = run(rows, logits)
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(-1))
    assert out.logprobs_tensors.logprobs.dtype == torch.float32


def test_penalties_match_dense_reference():
    g = torch.Generator().manual_seed(5)
    vocab = 40
    logits = torch.randn(5, vocab, generator=g) * 3
    params = [SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2),
              SamplingParams(),
              SamplingParams(repetition_penalty=0.8),
              SamplingParams(frequency_penalty=-0.4),
              SamplingParams(presence_penalty=1.1, repetition_penalty=1.2)]
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (12, 5, 30, 7, 0)]
    outputs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (20, 3, 9, 15, 25)]
    rows = [SamplingRow(p, pr, o) for p, pr, o in zip(params, prompts, outputs)]
    md = build_metadata(rows, vocab, "cpu")
    got = Sampler.apply_logit_processing(logits.clone(), md)
    for i, (p, pr, o) in enumerate(zip(params, prompts, outputs)):
        ref = logits[i].clone()
        counts = torch.bincount(torch.tensor(o, dtype=torch.long), minlength=vocab).float()
        seen = counts > 0
        if pr:
            seen |= torch.bincount(torch.tensor(pr), minlength=vocab) > 0
        r = p.repetition_penalty
        ref = torch.where(seen, torch.where(ref > 0, ref / r, ref * r), ref)
        ref = ref - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
        assert torch.allclose(got[i], ref, atol=1e-6), i


def test_seeded_row_without_generator_is_a_caller_error():
    with pytest.raises(ValueError, match="make_generator"):
        build_metadata([SamplingRow(SamplingParams(seed=3), [], [])], 10, "cpu")
    # Greedy rows need no generator even with a seed.
    build_metadata([SamplingRow(SamplingParams(seed=3, temperature=0.0), [], [])], 10,
                           "cpu")


def test_extreme_accepted_knobs_do_not_break_the_float32_columns():
    """SamplingParams accepts temperature=1e300 (vLLM samples uniformly); the persistent
    batch's float32 columns clamp it instead of raising inside the engine loop."""
    params = SamplingParams(temperature=1e300, top_k=10**9, seed=1)
    md = build_metadata([SamplingRow(params, (1, 2), (3,), make_generator(1))], 16,
                                "cpu")
    assert torch.isfinite(md.temperature).all()
    token = Sampler()(torch.randn(1, 16), md).sampled_token_ids
    assert 0 <= int(token[0]) < 16


def test_apply_bad_words_bans_only_completing_tokens():
    from vllm.sample.ops.logit_masks import apply_bad_words
    logits = torch.zeros(2, 10)
    output = [4, 7]
    entries = [(0, [[3], [7, 5], [6, 5], [2, 9, 8]], output), (1, [[4, 7, 1]], output)]
    banned = torch.isneginf(apply_bad_words(logits, entries))
    # Row 0: 3 always; 5 because the output ends with 7; not 8 (needs 2, 9 before it).
    assert banned[0].nonzero().flatten().tolist() == [3, 5]
    assert banned[1].nonzero().flatten().tolist() == [1]
    output.append(2)  # the lists are read live: after [.., 2] the ban on 5 lifts
    banned = torch.isneginf(apply_bad_words(torch.zeros(2, 10), entries))
    assert banned[0].nonzero().flatten().tolist() == [3]


def test_fixed_shapes_fold_bad_words_into_the_mask():
    from vllm.hpu.sampling import fixed_shapes
    from vllm.sample.logits_processors.dense import DENSE
    from vllm.sample.metadata import SamplingRow
    from vllm.sampling_params import SamplingParams
    params = SamplingParams(temperature=0.0, bad_words=["x"])
    params._bad_words_token_ids = [[3], [5, 6]]
    row = SamplingRow(params=params, prompt_token_ids=[1], output_token_ids=[5])
    md = fixed_shapes(build_metadata([row], 10, "cpu"), "cpu")
    assert "bad_words" not in md.logits_inputs
    assert md.logits_inputs[DENSE].ban[0].nonzero().flatten().tolist() == [3, 6]

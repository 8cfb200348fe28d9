"""The persistent input batch against from-scratch builds: rows, tensors, penalty counts
and the cached sampling metadata over randomized add / remove / condense / step events."""
from __future__ import annotations

import random
from dataclasses import fields
from typing import Optional

import pytest
import torch

from vllm.core.sched_output import NewRequestData
from vllm.sample.logits_processors.dense import DenseForms
from vllm.sample.metadata import PADDING_ROW, SamplingMetadata, SamplingRow, make_generator
from vllm.sample.ops.penalties import PenaltyInputs
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import build_metadata
from vllm.sampling_params import SamplingParams
from vllm.hpu.sampling import fixed_shapes, static_metadata
from vllm.worker.input_batch import InputBatch
from vllm.worker.request_state import CachedRequestState

V = 64
MAX_REQS = 8

KNOBS = [dict(temperature=0.0),
         dict(temperature=0.0, logprobs=2),
         dict(temperature=0.8, top_p=0.9),
         dict(temperature=1.1, top_k=5, seed=3),
         dict(temperature=0.7, min_p=0.2, seed=11),
         dict(temperature=1.0, presence_penalty=0.5, repetition_penalty=1.3),
         dict(temperature=0.0, frequency_penalty=0.7, logprobs=1),
         dict(temperature=0.9, repetition_penalty=0.8, frequency_penalty=-0.3, seed=5),
         dict(temperature=0.0, min_tokens=3, stop_token_ids=[1, 2]),
         dict(temperature=0.6, logit_bias={3: 2.0, 7: -1.0}, allowed_token_ids=[3, 4, 7, 9]),
         dict(temperature=0.0, repetition_penalty=1.5, min_tokens=2, stop_token_ids=[4])]


def _state(req_id: str, rng: random.Random, output_len: int = 0) -> CachedRequestState:
    params = SamplingParams(**rng.choice(KNOBS))
    prompt = [rng.randrange(V + 4) for _ in range(rng.randrange(1, 12))]  # a few OOV ids
    new = NewRequestData(req_id=req_id, prompt_token_ids=prompt,
                         output_token_ids=[rng.randrange(V) for _ in range(output_len)],
                         sampling_params=params, block_ids=[0], num_computed_tokens=0,
                         wants_prompt_logprobs=False)
    return CachedRequestState.from_new_request(new, "cpu")


def _fresh(states: list[Optional[CachedRequestState]], static: bool) -> SamplingMetadata:
    """The from-scratch reference (generators are the states' own)."""
    rows = [PADDING_ROW if s is None else
            SamplingRow(s.sampling_params, s.prompt_token_ids, s.output_token_ids, s.generator)
            for s in states]
    if static:
        return static_metadata(rows, V, "cpu")
    return build_metadata(rows, V, "cpu")


def _penalty_view(pen: Optional[PenaltyInputs], num_rows: int):
    """Per logits row: (token stats, seen tokens, repetition, frequency, presence), or None
    where no penalty applies (fixed shapes give such rows neutral values)."""
    view: list = [None] * num_rows
    if pen is None:
        return view
    for i, (row, table_row) in enumerate(zip(pen.rows.tolist(), pen.table_rows.tolist())):
        if (pen.repetition[i], pen.frequency[i], pen.presence[i]) == (1.0, 0.0, 0.0):
            continue
        view[row] = (pen.token_stats[table_row].tolist(),
                     None if not pen.seen_tokens else sorted(pen.seen_tokens[i].tokens().tolist()),
                     pen.repetition[i].item(), pen.frequency[i].item(), pen.presence[i].item())
    return view


def assert_same_metadata(got: SamplingMetadata, ref: SamplingMetadata) -> None:
    for f in fields(SamplingMetadata):
        a, b = getattr(got, f.name), getattr(ref, f.name)
        if f.name == "logits_inputs":
            assert list(a) == list(b)
            for name in a:
                _assert_same_inputs(a[name], b[name], got.num_rows, name)
        elif f.name == "generators":
            assert a.keys() == b.keys() and all(a[k] is b[k] for k in a)
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            assert a is not None and b is not None and torch.equal(a, b), f.name
        elif isinstance(a, tuple):
            assert b is not None and all(torch.equal(x, y) for x, y in zip(a, b)), f.name
        else:
            assert a == b, f.name


def _assert_same_inputs(a, b, num_rows: int, name: str) -> None:
    """One knob's inputs (`SamplingMetadata.logits_inputs[name]`) compared."""
    if isinstance(a, PenaltyInputs):
        assert _penalty_view(a, num_rows) == _penalty_view(b, num_rows)
    elif isinstance(a, DenseForms):
        assert torch.equal(a.ban, b.ban) and torch.equal(a.bias, b.bias), name
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), name
    elif isinstance(a, tuple):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name
    else:
        assert a == b, name


def _check(batch: InputBatch, states: dict[str, CachedRequestState], rng: random.Random
           ) -> None:
    """Every row's tensors and penalty counts against the states, and the metadata of a
    random layout (a shuffled subset, padding rows in the fixed-shape mode)."""
    assert batch.req_ids == [r for r in batch.req_ids if r is not None]
    assert sorted(batch.req_id_to_index.values()) == list(range(batch.num_reqs))
    penalties = batch.sampling.state_of("penalties")
    tables = penalties.tables
    for req_id, row in batch.req_id_to_index.items():
        st = states[req_id]
        assert batch.sampling.rows[row].output_token_ids is st.output_token_ids
        if tables is not None and penalties.penalized[row]:
            counts = torch.bincount(torch.tensor(st.output_token_ids, dtype=torch.long),
                                    minlength=V)
            prompt = torch.zeros(V, dtype=torch.long)
            prompt[[t for t in st.prompt_token_ids if t < V]] = 1
            assert torch.equal(tables.token_stats[row].long(), 2 * counts + prompt)
            assert sorted(tables.seen[row].tokens().tolist()) == \
                torch.nonzero(counts + prompt).flatten().tolist()
    if not batch.num_reqs:
        return
    req_ids = rng.sample(batch.req_ids, rng.randrange(1, batch.num_reqs + 1))
    static = rng.random() < 0.5
    layout: list[Optional[str]] = list(req_ids)
    if static:
        for _ in range(rng.randrange(3)):
            layout.insert(rng.randrange(len(layout) + 1), None)
    md = batch.sampling_metadata(layout, V, "cpu", finalize=fixed_shapes if static else None)
    if md is None:
        assert all(batch.takes_argmax(r) for r in req_ids)
        return
    assert_same_metadata(md, _fresh([None if r is None else states[r] for r in layout],
                                    static))


@pytest.mark.parametrize("seed", range(6))
def test_random_events_keep_rows_consistent_with_a_fresh_build(seed):
    rng = random.Random(seed)
    batch = InputBatch(MAX_REQS)
    states: dict[str, CachedRequestState] = {}
    next_id = 0
    for _ in range(60):
        event = rng.choice(["add", "add", "remove", "step", "step", "preempt"])
        if event == "add" and batch.num_reqs < MAX_REQS:
            req_id = f"r{next_id}"
            next_id += 1
            states[req_id] = _state(req_id, rng, output_len=rng.randrange(4))
            batch.add_request(states[req_id])
        elif event == "remove" and batch.num_reqs:
            req_id = rng.choice(batch.req_ids)
            batch.remove_request(req_id)
            del states[req_id]
        elif event == "preempt" and batch.num_reqs:
            # Loses its row, keeps its state, samples while away... not: it is not
            # scheduled. Later it gets a row again (maybe another one).
            req_id = rng.choice(batch.req_ids)
            batch.retain_only(set(batch.req_ids) - {req_id})
            batch.condense()
            _check(batch, states, rng)
            batch.add_request(states[req_id])
        elif event == "step" and batch.num_reqs:
            req_ids = batch.req_ids
            tokens = [rng.randrange(V) for _ in req_ids]
            for r, t in zip(req_ids, tokens):
                states[r].append_token(t)
            batch.record_output_tokens(req_ids, tokens)
        batch.condense()
        _check(batch, states, rng)


def _batch_of(knobs: list[dict]) -> tuple[InputBatch, list[CachedRequestState]]:
    batch = InputBatch(MAX_REQS)
    states = []
    for i, k in enumerate(knobs):
        new = NewRequestData(req_id=f"r{i}", prompt_token_ids=[1, 2, 3], output_token_ids=[],
                             sampling_params=SamplingParams(**k), block_ids=[0],
                             num_computed_tokens=0, wants_prompt_logprobs=False)
        states.append(CachedRequestState.from_new_request(new, "cpu"))
        batch.add_request(states[-1])
    return batch, states


def test_metadata_is_reused_until_the_batch_changes():
    batch, states = _batch_of([dict(temperature=0.8, seed=1, frequency_penalty=0.5),
                               dict(temperature=0.0, presence_penalty=1.0)])
    layout = ["r1", "r0"]
    md = batch.sampling_metadata(layout, V, "cpu")
    assert batch.num_metadata_builds == 1
    for step in range(3):  # decode steps: same requests, same layout
        batch.record_output_tokens(layout, [5, 6 + step])
        assert batch.sampling_metadata(layout, V, "cpu") is md
    assert batch.num_metadata_builds == 1
    # ... and the counts it refers to followed the sampled tokens.
    view = _penalty_view(md.logits_inputs.get("penalties"), 2)
    assert view[0][0][5] == 2 * 3 and view[1][0][6:9] == [2, 2, 2]  # 2 x count
    assert view[0][0][1:4] == [1, 1, 1]  # the prompt bit
    joining = _batch_of([dict()] * 3)[1][2]
    batch.add_request(joining)  # a request joins
    layout.append(joining.req_id)
    md2 = batch.sampling_metadata(layout, V, "cpu")
    assert md2 is not md and batch.num_metadata_builds == 2
    batch.remove_request("r0")
    batch.condense()
    assert batch.sampling_metadata(["r1"], V, "cpu") is not md2
    assert batch.num_metadata_builds == 3


def test_a_request_moved_to_another_row_is_read_from_its_new_row():
    """Preempted and resumed into another row, same logits layout: the metadata is
    rebuilt (the penalty counts are read from the request's new row)."""
    batch, states = _batch_of([dict(frequency_penalty=1.0, temperature=0.0)] * 3)
    for i, st in enumerate(states):
        st.append_token(10 + i)
        batch.record_output_tokens([st.req_id], [10 + i])
    layout = ["r2", "r0"]
    batch.sampling_metadata(layout, V, "cpu")
    batch.retain_only({"r1", "r2"})
    batch.condense()  # r2 moves into row 0
    batch.add_request(states[0])  # r0 comes back, into row 2
    assert batch.req_id_to_index == {"r2": 0, "r1": 1, "r0": 2}
    assert_same_metadata(batch.sampling_metadata(layout, V, "cpu"),
                         _fresh([states[2], states[0]], static=False))


def test_metadata_expires_when_min_tokens_is_reached():
    batch, (st,) = _batch_of([dict(temperature=0.0, min_tokens=2, stop_token_ids=[9])])
    md = batch.sampling_metadata(["r0"], V, "cpu")
    assert md is not None and "min_tokens" in md.logits_inputs
    st.append_token(4)
    assert batch.sampling_metadata(["r0"], V, "cpu") is md
    st.append_token(4)
    # min_tokens reached: plain greedy now, the argmax fast path (no metadata).
    assert batch.sampling_metadata(["r0"], V, "cpu") is None
    assert batch.num_metadata_builds == 2


def test_cached_metadata_samples_like_fresh_builds_step_after_step():
    """Same tokens and logprobs as a fresh build every step (own generators of the same
    seeds on both sides), with penalties counted incrementally."""
    knobs = [dict(temperature=0.9, seed=4, frequency_penalty=0.4, logprobs=3),
             dict(temperature=0.0, repetition_penalty=1.4, logprobs=2),
             dict(temperature=1.2, top_k=6, top_p=0.8, seed=8, presence_penalty=0.6),
             dict(temperature=0.7, min_p=0.05)]
    batch, states = _batch_of(knobs)
    _, twins = _batch_of(knobs)
    layout = ["r2", "r0", "r3", "r1"]
    order = [2, 0, 3, 1]
    g = torch.Generator().manual_seed(0)
    for _ in range(12):
        logits = torch.randn(4, V, generator=g) * 3
        md = batch.sampling_metadata(layout, V, "cpu")
        ref_md = _fresh([twins[i] for i in order], static=False)
        torch.manual_seed(7)  # the unseeded rows' shared draw
        got = Sampler()(logits.clone(), md)
        torch.manual_seed(7)
        ref = Sampler()(logits.clone(), ref_md)
        assert torch.equal(got.sampled_token_ids, ref.sampled_token_ids)
        for a, b in zip(got.logprobs_tensors.tolists(), ref.logprobs_tensors.tolists()):
            assert a == b
        tokens = got.sampled_token_ids.tolist()
        for i, t in zip(order, tokens):
            states[i].append_token(t)
            twins[i].append_token(t)
        batch.record_output_tokens(layout, tokens)
    assert batch.num_metadata_builds == 1


def test_fixed_shape_penalties_equal_the_sparse_ones():
    """The HPU's whole-row penalties (padding rows neutral) change the same logits by the
    same amounts as the default path."""
    batch, states = _batch_of([dict(repetition_penalty=1.3, frequency_penalty=0.2),
                               dict(), dict(presence_penalty=-0.5, repetition_penalty=0.7)])
    for i, st in enumerate(states):
        for t in (3, 3, 10 + i, V + 2):
            st.append_token(t)
        batch.record_output_tokens([st.req_id] * 4, [3, 3, 10 + i, V + 2])
    logits = torch.randn(5, V) * 2
    md = batch.sampling_metadata(["r0", "r1", "r2"], V, "cpu")
    static = batch.sampling_metadata(["r0", None, "r1", "r2", None], V, "cpu",
                                     finalize=fixed_shapes)
    ref = Sampler.apply_logit_processing(logits[[0, 2, 3]].clone(), md)
    got = Sampler.apply_logit_processing(logits.clone(), static, static_shapes=True)
    assert torch.equal(got[[0, 2, 3]], ref) and torch.equal(got[[1, 4]], logits[[1, 4]])


def test_request_state_is_built_from_the_new_request_data():
    params = SamplingParams(seed=5)
    new = NewRequestData(req_id="a", prompt_token_ids=[1, 2], output_token_ids=[3],
                         sampling_params=params, block_ids=[7], num_computed_tokens=2,
                         wants_prompt_logprobs=True, lora_request=None)
    st = CachedRequestState.from_new_request(new, "cpu")
    for f in fields(NewRequestData):
        assert getattr(st, f.name) == getattr(new, f.name), f.name
    assert st.prompt_token_ids is not new.prompt_token_ids
    assert st.block_ids is not new.block_ids and st.token_ids == [1, 2, 3]
    st.append_token(9)
    assert new.output_token_ids == [3]
    assert torch.equal(st.generator.get_state(), make_generator(5).get_state())


def test_penalties_on_non_contiguous_logits():
    batch, states = _batch_of([dict(repetition_penalty=1.5, frequency_penalty=0.5)] * 2)
    for st in states:
        st.append_token(7)
        batch.record_output_tokens([st.req_id], [7])
    md = batch.sampling_metadata(["r0", "r1"], V, "cpu")
    logits = torch.randn(V, 2).T  # a non-contiguous view
    got = Sampler.apply_logit_processing(logits.clone(), md)
    ref = Sampler.apply_logit_processing(logits.contiguous(), md)
    assert torch.equal(got, ref) and not torch.equal(ref, logits)


@pytest.mark.parametrize("static", [False, True])
def test_bad_words_follow_the_output_step_by_step(static):
    """A two-token bad word bans its last token only right after its first: the cached
    metadata reads the output live, and fixed shapes (HPU) rebuild their mask per step."""
    params = SamplingParams(temperature=0.0, bad_words=["x"])
    params._bad_words_token_ids = [[5, 6], [9]]
    new = NewRequestData(req_id="r", prompt_token_ids=[1, 2], output_token_ids=[],
                         sampling_params=params, block_ids=[0], num_computed_tokens=0,
                         wants_prompt_logprobs=False)
    state = CachedRequestState.from_new_request(new, "cpu")
    batch = InputBatch(MAX_REQS)
    batch.add_request(state)
    finalize = fixed_shapes if static else None
    logits = torch.zeros(1, V)

    def banned() -> list[int]:
        md = batch.sampling_metadata(["r"], V, "cpu", finalize=finalize)
        out = Sampler.apply_logit_processing(logits.clone(), md, static_shapes=static)
        return torch.isneginf(out[0]).nonzero().flatten().tolist()

    assert banned() == [9]
    state.append_token(5)
    assert banned() == [6, 9]
    state.append_token(7)
    assert banned() == [9]

"""The platform-neutral runner parts without a model: states, persistent batch, layout,
prompt-logprob rows and the feature hooks' refusals."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.sampling_params import SamplingParams
from vllm.cpu.model_runner import CPUModelRunner
from vllm.worker.gpu_model_runner import GPUModelRunner
from vllm.worker.input_batch import InputBatch
from vllm.worker.sampling_stage import prompt_logprob_rows
from vllm.worker.request_state import CachedRequestState

BS = 4


def _config(max_num_seqs: int = 8):
    return SimpleNamespace(
        model_config=SimpleNamespace(torch_dtype=torch.float32),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))


def _new(req_id: str, prompt: list[int], blocks: list[int], computed: int = 0,
         **params) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, output_token_ids=[],
                          sampling_params=SamplingParams(**params), block_ids=blocks,
                          num_computed_tokens=computed,
                          wants_prompt_logprobs=params.get("prompt_logprobs") is not None)


def _so(new=(), cached=(), scheduled=None, finished=()) -> SchedulerOutput:
    scheduled = scheduled or {}
    return SchedulerOutput(scheduled_new_reqs=list(new), scheduled_cached_reqs=list(cached),
                           num_scheduled_tokens=scheduled,
                           total_num_scheduled_tokens=sum(scheduled.values()),
                           finished_req_ids=set(finished))


def _state(req_id: str, **params) -> CachedRequestState:
    return CachedRequestState(req_id=req_id, prompt_token_ids=[1, 2, 3],
                              output_token_ids=[], sampling_params=SamplingParams(**params),
                              block_ids=[0], num_computed_tokens=0,
                              wants_prompt_logprobs=False)


def test_input_batch_rows_persist_and_condense():
    batch = InputBatch(max_num_reqs=4)
    for r in "abcd":
        batch.add_request(_state(r))
    assert batch.req_ids == list("abcd")
    batch.retain_only({"a", "c", "d"})
    assert batch.req_id_to_index["c"] == 2  # rows do not move before condense
    batch.condense()
    assert batch.req_ids == ["a", "d", "c"]
    assert batch.req_id_to_index == {"a": 0, "d": 1, "c": 2}
    batch.remove_request("a")
    batch.remove_request("c")
    batch.condense()
    assert batch.req_ids == ["d"] and batch.req_id_to_index == {"d": 0}
    for r in "xyz":
        batch.add_request(_state(r))
    with pytest.raises(ValueError, match="full"):
        batch.add_request(_state("overflow"))


def test_input_batch_argmax_fast_path_follows_min_tokens():
    batch = InputBatch(max_num_reqs=4)
    greedy = _state("g", temperature=0.0, min_tokens=2)
    batch.add_request(greedy)
    batch.add_request(_state("s", temperature=1.0))
    batch.add_request(_state("lp", temperature=0.0, logprobs=1))
    assert not batch.takes_argmax("g")  # min_tokens still masks EOS
    greedy.append_token(5)
    greedy.append_token(6)
    assert batch.takes_argmax("g")
    assert not batch.takes_argmax("s") and not batch.takes_argmax("lp")
    # The sampler's view shares the state's token lists.
    assert batch.sampling_row("g").output_token_ids is greedy.output_token_ids


@pytest.fixture
def runner():
    return CPUModelRunner(_config(), device="cpu")


def test_update_states_keeps_a_preempted_request(runner):
    runner._update_states(_so(new=[_new("a", [1, 2, 3, 4, 5], [7, 8], seed=3, temperature=1.0),
                                   _new("b", [9, 9], [3])], scheduled={"a": 5, "b": 2}))
    gen = runner.requests["a"].generator
    gen_state = gen.get_state()
    torch.rand(4, generator=gen)  # the request drew from its stream
    runner.requests["a"].append_token(42)
    # a is preempted: not scheduled, not finished. Its state and generator stay.
    runner._update_states(_so(cached=[CachedRequestData("b", [], 2, [11], 2)],
                              scheduled={"b": 1}))
    assert runner.input_batch.req_ids == ["b"]
    assert runner.requests["a"].generator is gen
    assert not torch.equal(gen.get_state(), gen_state)
    # Resumed with a new block table, recomputing from 0.
    runner._update_states(_so(cached=[CachedRequestData("a", [4, 5], 0, [42], 6,
                                                        resumed_from_preemption=True)],
                              scheduled={"a": 6}, finished={"b"}))
    a = runner.requests["a"]
    assert a.block_ids == [4, 5] and a.num_computed_tokens == 0
    assert a.token_ids == [1, 2, 3, 4, 5, 42] and a.generator is gen
    assert set(runner.requests) == {"a"} and runner.input_batch.req_ids == ["a"]


def test_update_states_appends_tokens_sampled_on_another_rank(runner):
    runner._update_states(_so(new=[_new("a", [1, 2, 3], [0])], scheduled={"a": 3}))
    runner._update_states(_so(cached=[CachedRequestData("a", [], 3, [77], 4)],
                              scheduled={"a": 1}))
    assert runner.requests["a"].token_ids == [1, 2, 3, 77]


@pytest.mark.parametrize("runner_cls", [CPUModelRunner, GPUModelRunner])
def test_flat_layout_rows_hold_each_requests_tokens(runner_cls):
    """Every request's rows carry its tokens, positions and cache slots, row-wise first
    (the GPU runner's input preparation runs on any device: here the CPU)."""
    runner = runner_cls(_config(), device="cpu")
    runner._update_states(_so(
        new=[_new("long", list(range(10, 20)), [5, 6, 7]),
             _new("chunk", list(range(30, 39)), [1, 2, 3], computed=4),
             _new("dec", [50, 51, 52], [9])],
        scheduled={"long": 10, "chunk": 5, "dec": 1}))
    runner.requests["dec"].num_computed_tokens = 2  # a decode: one token left
    (fwd,) = runner._prepare_inputs(_so(scheduled={"long": 10, "chunk": 5, "dec": 1}))
    assert fwd.req_ids[0] == "dec"  # decodes first
    owner = fwd.row_request_index()
    for i, req_id in enumerate(fwd.req_ids):
        st = runner.requests[req_id]
        rows = (owner == i).nonzero()[0].tolist()
        positions = list(range(st.num_computed_tokens, st.num_tokens))
        assert rows == list(range(fwd.row_offsets[i], fwd.row_offsets[i] + len(positions)))
        assert fwd.input_ids[rows].tolist() == [st.token_ids[p] for p in positions]
        assert fwd.positions[rows].tolist() == positions
        slots = fwd.attn_metadata.slot_mapping[rows].tolist()
        assert slots == [st.block_ids[p // BS] * BS + p % BS for p in positions]
    assert fwd.sample_req_ids == fwd.req_ids  # all reach their last token
    assert fwd.platform_data == [fwd.row_offsets[i] + fwd.num_tokens[i] - 1
                           for i in range(len(fwd.req_ids))]
    if runner_cls is GPUModelRunner:  # no native kernel: only the decode is row-wise
        assert fwd.attn_metadata.num_decodes == 1
        assert [p.query_len for p in fwd.attn_metadata.prefills] == [10, 5]


def test_prompt_logprob_rows_skip_positions_already_sent():
    st = _state("a")
    st.prompt_token_ids = [10, 11, 12, 13, 14]
    rows, targets, done = prompt_logprob_rows(st, start=0, num_new=3, offset=7)
    assert (rows, targets, done) == ([7, 8, 9], [11, 12, 13], False)
    st.num_prompt_logprobs_sent = 3
    rows, targets, done = prompt_logprob_rows(st, start=0, num_new=5, offset=0)
    assert (rows, targets, done) == ([3], [14], True)


def test_feature_hooks_are_no_ops_when_unused_and_refuse_what_they_cannot_serve(runner):
    runner._update_states(_so(new=[_new("a", [1, 2, 3], [0])], scheduled={"a": 3}))
    (fwd,) = runner._prepare_inputs(_so(scheduled={"a": 3}))
    assert runner.prepare_lora_mapping(fwd) is None
    assert runner.gather_mm_embeddings(fwd) is None
    logits = torch.randn(1, 8)
    assert runner.sampling_stage.apply_logits_processors(logits, ["a"], _so()) is logits
    runner.requests["a"].lora_request = object()
    with pytest.raises(NotImplementedError, match="lora_request"):
        runner.prepare_lora_mapping(fwd)
    runner.requests["a"].mm_inputs = object()
    with pytest.raises(NotImplementedError, match="mm_inputs"):
        runner.gather_mm_embeddings(fwd)
    # The structured-output bitmask masks constrained rows only.
    so = _so()
    so.structured_output_request_ids = {"a": 0}
    so.grammar_bitmask = np.array([[1 << 3]], dtype=np.int32)  # only token 3 allowed
    two = torch.randn(2, 8)
    masked = runner.sampling_stage.apply_logits_processors(two.clone(), ["b", "a"], so)
    assert torch.equal(masked[0], two[0])
    assert masked[1, 3] == two[1, 3] and torch.isinf(masked[1, :3]).all()
    assert torch.isinf(masked[1, 4:]).all()
    so = _so()
    so.scheduled_spec_decode_tokens = {"a": [5, 6]}
    with pytest.raises(NotImplementedError, match="speculative decoding"):
        runner.update_draft_tokens(so)

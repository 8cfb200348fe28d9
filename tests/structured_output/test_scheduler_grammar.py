"""The scheduler side of structured outputs, driven step by step without a model.

Grammars compile in the manager's thread pool while other requests keep being
scheduled; a constrained request gets a bitmask row only on steps where it samples;
its matcher advances on accepted tokens; termination, rejection and compile failure
end the request cleanly.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from vllm.core.sched_output import ModelRunnerOutput
from vllm.core.scheduler import Scheduler
from vllm.engine.arg_utils import EngineArgs
from vllm.request import Request, RequestStatus
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.structured_output import validate_structured_outputs
from vllm.structured_output.manager import StructuredOutputManager


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory):
    return tiny_model_factory("llama")


def make_scheduler(model_dir, **so_config):
    args = EngineArgs(model=model_dir, max_model_len=256, max_num_batched_tokens=64,
                      structured_outputs_config=so_config or None)
    return Scheduler(args.create_engine_config(), num_blocks=64)


def make_request(sched, req_id, prompt, structured=None, max_tokens=16, **kw):
    params = SamplingParams(max_tokens=max_tokens, structured_outputs=structured, **kw)
    so_req = None
    if structured is not None:
        so_req = validate_structured_outputs(structured,
                                             sched.structured_output_manager.config)
    return Request(req_id, prompt, params, eos_token_id=2, max_tokens=max_tokens,
                   structured_output_request=so_req)


def step(sched, tokens: dict[str, int]):
    """One schedule + update; `tokens` gives the token each sampling request 'samples'."""
    so = sched.schedule()
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for r in req_ids:
        req = sched.requests[r]
        samples = req.num_computed_tokens + so.num_scheduled_tokens[r] >= req.num_tokens
        sampled.append([tokens[r]] if samples else [])
    outs = sched.update_from_output(so, ModelRunnerOutput(req_ids=req_ids,
                                                          sampled_token_ids=sampled))
    return so, {o.request_id: o for o in outs}


def allowed(so, req_id, token_id) -> bool:
    row = so.structured_output_request_ids[req_id]
    word = int(so.grammar_bitmask[row, token_id // 32])
    return bool((word >> (token_id % 32)) & 1)


def test_compile_runs_off_the_loop(model_dir, monkeypatch):
    gate = threading.Event()
    original = StructuredOutputManager._compile

    def slow_compile(self, backend, spec):
        assert threading.current_thread() is not threading.main_thread()
        gate.wait(30)
        return original(self, backend, spec)

    monkeypatch.setattr(StructuredOutputManager, "_compile", slow_compile)
    sched = make_scheduler(model_dir)
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(regex="[0-9]+")))
    sched.add_request(make_request(sched, "free", [8, 9, 10]))
    for _ in range(3):  # the free request runs while "c" waits for its grammar
        so, outs = step(sched, {"free": 100})
        assert list(so.num_scheduled_tokens) == ["free"]
        assert so.grammar_bitmask is None and "free" in outs
        assert sched.requests["c"].status == RequestStatus.WAITING_FOR_FSM
    gate.set()
    sched.wait_for_grammars(10)
    so, _ = step(sched, {"free": 100, "c": 0})
    assert "c" in so.num_scheduled_tokens
    assert list(so.structured_output_request_ids) == ["c"]
    assert so.grammar_bitmask.dtype == np.int32
    assert so.grammar_bitmask.shape == (1, (49152 + 31) // 32)


def test_bitmask_rows_follow_the_grammar_and_stop_ends_it(model_dir, default_tokenizer):
    sched = make_scheduler(model_dir)
    tok = default_tokenizer
    choice = StructuredOutputsParams(choice=["yes", "no"])
    sched.add_request(make_request(sched, "c", [5, 6, 7], choice, max_tokens=8))
    sched.add_request(make_request(sched, "free", [8, 9, 10]))
    sched.wait_for_grammars(10)
    yes = tok.encode("yes", add_special_tokens=False)
    assert len(yes) == 1
    so, outs = step(sched, {"c": yes[0], "free": 100})
    assert set(so.structured_output_request_ids) == {"c"}
    assert allowed(so, "c", yes[0])
    assert allowed(so, "c", tok.encode("no", add_special_tokens=False)[0])
    assert not allowed(so, "c", tok.encode("maybe", add_special_tokens=False)[0])
    assert not allowed(so, "c", 2)  # the end token only once the grammar is complete
    so, outs = step(sched, {"c": 2, "free": 101})
    assert allowed(so, "c", 2) and not allowed(so, "c", yes[0])
    assert outs["c"].finish_reason == "stop"
    assert "c" not in sched.requests


def test_grammar_that_cannot_finish_ends_with_length(model_dir, default_tokenizer):
    sched = make_scheduler(model_dir)
    digit = default_tokenizer.encode("7", add_special_tokens=False)[0]
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(regex="[0-9]{10}"), max_tokens=3))
    sched.wait_for_grammars(10)
    for i in range(3):
        so, outs = step(sched, {"c": digit})
        assert not allowed(so, "c", 2)
    assert outs["c"].finish_reason == "length"


def test_rejected_token_aborts_only_that_request(model_dir, default_tokenizer):
    sched = make_scheduler(model_dir)
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(regex="[0-9]+")))
    sched.add_request(make_request(sched, "free", [8, 9, 10]))
    sched.wait_for_grammars(10)
    letter = default_tokenizer.encode("x", add_special_tokens=False)[0]
    so, outs = step(sched, {"c": letter, "free": 100})
    assert outs["c"].finish_reason == "abort"
    assert outs["free"].finish_reason is None
    so, outs = step(sched, {"free": 100})
    assert list(so.num_scheduled_tokens) == ["free"]


def test_failed_compile_ends_the_request(model_dir, monkeypatch):
    def broken(self, key):
        raise ValueError("boom")

    monkeypatch.setattr(StructuredOutputManager, "_compile", broken)
    sched = make_scheduler(model_dir)
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(regex="[0-9]+")))
    sched.wait_for_grammars(10)
    so = sched.schedule()
    assert so.is_empty
    failed = sched.take_failed_outputs()
    assert [(o.request_id, o.finish_reason) for o in failed] == [("c", "abort")]
    assert not sched.has_unfinished_requests()


def test_compiled_grammars_are_cached_by_spec(model_dir):
    sched = make_scheduler(model_dir)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    reqs = [make_request(sched, f"r{i}", [5, 6, 7], StructuredOutputsParams(json=schema))
            for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    futures = {id(r.structured_output_request.compiled) for r in reqs}
    assert len(futures) == 1
    sched.wait_for_grammars(10)
    so, _ = step(sched, {r.request_id: 90 for r in reqs})
    assert len(so.structured_output_request_ids) == 3
    grammars = {id(r.structured_output_request.grammar) for r in reqs}
    assert len(grammars) == 3  # one matcher per request


def test_no_bitmask_on_prefill_chunks_that_do_not_sample(model_dir):
    sched = make_scheduler(model_dir)
    prompt = list(range(10, 110))  # 100 tokens, budget 64: two chunks
    sched.add_request(make_request(sched, "c", prompt, StructuredOutputsParams(regex="a+")))
    sched.wait_for_grammars(10)
    so, outs = step(sched, {"c": 64})
    assert so.num_scheduled_tokens["c"] == 64 and so.grammar_bitmask is None
    so, outs = step(sched, {"c": 64})
    assert "c" in so.structured_output_request_ids


def test_constraint_starts_after_reasoning(model_dir, default_tokenizer):
    sched = make_scheduler(model_dir, reasoning_parser="deepseek_r1")
    tok = default_tokenizer
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(choice=["yes"])))
    sched.wait_for_grammars(10)
    end = tok.encode("</think>", add_special_tokens=False)
    thinking = tok.encode("hmm", add_special_tokens=False) + end
    for t in thinking:
        so, _ = step(sched, {"c": t})
        assert so.grammar_bitmask is None  # free while reasoning
    so, _ = step(sched, {"c": tok.encode("yes", add_special_tokens=False)[0]})
    assert "c" in so.structured_output_request_ids
    assert not allowed(so, "c", tok.encode("hmm", add_special_tokens=False)[0])


def test_constraint_starts_after_a_plugin_parsers_reasoning(model_dir, default_tokenizer,
                                                          tmp_path):
    """--reasoning-parser-plugin reaches the engine: its manager runs the user's file (as
    an engine in its own process must) before resolving the parser name."""
    import sys

    from vllm.reasoning import ReasoningParserManager
    path = tmp_path / "sched_reasoning.py"
    path.write_text("from vllm.reasoning import ReasoningParser, ReasoningParserManager\n"
                    "@ReasoningParserManager.register_module('plugin_think')\n"
                    "class P(ReasoningParser):\n"
                    "    unterminated_is_reasoning = True\n")
    args = EngineArgs(model=model_dir, max_model_len=256, max_num_batched_tokens=64,
                      reasoning_parser="plugin_think", reasoning_parser_plugin=str(path))
    config = args.create_engine_config()
    # What a fresh engine process sees: the name unknown until the file runs again.
    del ReasoningParserManager._parsers["plugin_think"]
    for name in [m for m in sys.modules if m.endswith("sched_reasoning_py")]:
        del sys.modules[name]
    sched = Scheduler(config, num_blocks=64)
    tok = default_tokenizer
    sched.add_request(make_request(sched, "c", [5, 6, 7],
                                   StructuredOutputsParams(choice=["yes"])))
    sched.wait_for_grammars(10)
    for t in tok.encode("hmm</think>", add_special_tokens=False):
        so, _ = step(sched, {"c": t})
        assert so.grammar_bitmask is None
    assert "plugin_think" in ReasoningParserManager.names()
    so, _ = step(sched, {"c": tok.encode("yes", add_special_tokens=False)[0]})
    assert "c" in so.structured_output_request_ids


def test_preempted_request_keeps_its_grammar_state(model_dir, default_tokenizer):
    sched = make_scheduler(model_dir)
    digit = default_tokenizer.encode("7", add_special_tokens=False)[0]
    req = make_request(sched, "c", [5, 6, 7], StructuredOutputsParams(regex="[0-9]{3}"))
    sched.add_request(req)
    sched.wait_for_grammars(10)
    step(sched, {"c": digit})
    step(sched, {"c": digit})
    sched.running.remove(req)
    sched._preempt(req)  # recompute preemption: KV freed, output tokens kept
    so, _ = step(sched, {"c": digit})
    resumed = so.scheduled_cached_reqs[0]  # workers kept its state: only a resume
    assert resumed.resumed_from_preemption and resumed.new_token_ids == [digit, digit]
    so, outs = step(sched, {"c": 2})
    assert allowed(so, "c", 2) and outs["c"].finish_reason == "stop"

"""Grammar size limits (up front) and compile limits (time, memory, cancellation).

A schema past a size limit is a ValueError naming the limit's variable before any
compiler runs; a compile past its time or memory limit fails its request in the engine
(the helper process that ran it is killed, the engine keeps serving); a compile whose
requests all went away stops; when compiles queue, the smallest spec goes first.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import StructuredOutputsParams
from vllm.structured_output import validate_structured_outputs
from vllm.structured_output.backend_types import GrammarSpec
from vllm.structured_output.limits import GrammarLimits, check_spec_limits, count_schema
from vllm.structured_output.manager import StructuredOutputManager

from tests.structured_output.test_scheduler_grammar import make_request, make_scheduler


def props_schema(n: int, pattern: bool = False) -> dict:
    prop = {"type": "string", **({"pattern": "^[a-z]+[0-9]*$"} if pattern else {})}
    return {"type": "object", "properties": {f"p{i}": dict(prop) for i in range(n)}}


def nested(levels: int) -> dict:
    """An array schema whose document nests `levels` dicts deep."""
    schema: dict = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


SLOW = props_schema(1000, pattern=True)
"""Within every size limit, and about 5 s to compile on a 2-core machine (each pattern
is a regex of its own to compile against the vocabulary)."""

HUNGRY = {"enum": ["x" * 40 + str(i) for i in range(10000)]}
"""Within every size limit; its compile grows by about 150 MiB."""


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory):
    return tiny_model_factory("llama")


def limits(**overrides) -> GrammarLimits:
    return GrammarLimits(**{**GrammarLimits.from_env().__dict__, **overrides})


# ------------------------------------------------------------- up front
@pytest.mark.parametrize("schema, variable", [
    (props_schema(5001), "VLLM_STRUCTURED_OUTPUT_MAX_PROPERTIES"),
    ({"enum": list(range(10001))}, "VLLM_STRUCTURED_OUTPUT_MAX_ENUM_VALUES"),
    (props_schema(1001, pattern=True), "VLLM_STRUCTURED_OUTPUT_MAX_PATTERNS"),
    (nested(70), "VLLM_STRUCTURED_OUTPUT_MAX_NESTING"),
])
def test_schema_over_a_limit_is_refused_naming_it(schema, variable):
    params = StructuredOutputsParams(json=schema)
    with pytest.raises(ValueError, match=variable) as info:
        validate_structured_outputs(params, EngineArgs().create_engine_config()
                                    .structured_outputs_config)
    assert str(info.value).startswith("structured_outputs.json: the schema has ")


def test_the_hostile_twenty_thousand_property_tool_schema_is_refused_at_once():
    schema = props_schema(20000, pattern=True)
    start = time.monotonic()
    with pytest.raises(ValueError, match="MAX_PROPERTIES|MAX_SPEC_BYTES"):
        validate_structured_outputs(StructuredOutputsParams(json=schema),
                                    EngineArgs().create_engine_config()
                                    .structured_outputs_config)
    assert time.monotonic() - start < 5  # counting, never compiling


def test_spec_bytes_limit_covers_regexes_and_grammars():
    small = limits(max_spec_bytes=64)
    with pytest.raises(ValueError, match="the regex is 65 bytes.*MAX_SPEC_BYTES"):
        check_spec_limits(GrammarSpec("regex", "a" * 65), small)
    with pytest.raises(ValueError, match="the grammar is"):
        check_spec_limits(GrammarSpec("grammar_ebnf", "root ::= " + '"a" ' * 20), small)
    check_spec_limits(GrammarSpec("regex", "a" * 64), small)


def test_counting_a_schema_nested_far_beyond_the_stack_does_not_recurse():
    deep: dict = {"type": "string"}
    for _ in range(100_000):
        deep = {"type": "object", "properties": {"a": deep}}
    counts = count_schema(deep)
    assert counts.nesting == 200_001 and counts.properties == 100_000


def test_deeply_nested_schema_text_is_a_value_error():
    text = '{"type": "array", "items": ' * 50_000 + "{}" + "}" * 50_000
    with pytest.raises(ValueError, match="nest"):
        validate_structured_outputs(StructuredOutputsParams(json=text),
                                    EngineArgs().create_engine_config()
                                    .structured_outputs_config)


# ------------------------------------------------------------- compiles
def manager(model_dir, monkeypatch, **env) -> StructuredOutputManager:
    for name, value in env.items():
        monkeypatch.setenv(f"VLLM_STRUCTURED_OUTPUT_{name}", str(value))
    return make_scheduler(model_dir).structured_output_manager


def wait_done(future, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert future.done(), "compile did not end"


def test_compile_past_its_time_limit_fails_and_the_pool_keeps_compiling(model_dir,
                                                                         monkeypatch):
    so = manager(model_dir, monkeypatch, COMPILE_TIMEOUT_S=1)
    try:
        slow = so.pool.submit("xgrammar", GrammarSpec("json", json.dumps(SLOW)))
        wait_done(slow, 60)  # helper start (~2 s) + 1 s
        with pytest.raises(ValueError, match="longer than the limit of 1 s "
                                             r"\(VLLM_STRUCTURED_OUTPUT_COMPILE_TIMEOUT_S\)"):
            slow.result()
        fine = so.pool.submit("xgrammar", GrammarSpec("regex", "[0-9]{3}"))
        wait_done(fine, 60)
        grammar = so._backends["xgrammar"].new_grammar(fine.result())
        assert not grammar.is_terminated()
    finally:
        so.shutdown()


def test_compile_past_its_memory_limit_fails_naming_it(model_dir, monkeypatch):
    so = manager(model_dir, monkeypatch, COMPILE_MAX_MEMORY_MB=32, COMPILE_TIMEOUT_S=120)
    try:
        future = so.pool.submit("xgrammar", GrammarSpec("json", json.dumps(HUNGRY)))
        wait_done(future, 150)
        with pytest.raises(ValueError, match="more than the limit of 32 MiB of memory "
                                             r"\(VLLM_STRUCTURED_OUTPUT_COMPILE_MAX_MEMORY_MB\)"):
            future.result()
    finally:
        so.shutdown()


def test_compile_stops_when_its_last_request_goes_away(model_dir, monkeypatch):
    import psutil
    sched = make_scheduler(model_dir)
    so = sched.structured_output_manager
    try:
        params = StructuredOutputsParams(json=SLOW)
        sched.add_request(make_request(sched, "a", [5, 6], params))
        sched.add_request(make_request(sched, "b", [5, 6], params))  # shares the compile
        future = sched.requests["a"].structured_output_request.compiled
        deadline = time.monotonic() + 60
        while not so.pool.helper_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = so.pool.helper_pids()
        helper = psutil.Process(pid)
        while helper.cpu_percent(0.5) < 50 and time.monotonic() < deadline:
            pass  # loading, then compiling: busy either way
        from vllm.request import RequestStatus
        sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
        time.sleep(0.5)
        assert helper.is_running() and not future.done()  # "b" still waits
        sched.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
        time.sleep(3.0)  # a killed helper's successor loads meanwhile
        procs = [psutil.Process(p) for p in {pid, *so.pool.helper_pids()}
                 if psutil.pid_exists(p)]
        for p in procs:
            p.cpu_percent(None)
        time.sleep(1.0)
        busy = sum(p.cpu_percent(None) for p in procs
                   if p.is_running() and p.status() != "zombie")
        assert busy < 20, busy  # nothing compiles any more
        assert future.done()  # nobody waits for it: cancelled, or failed "went away"
        assert not so._cache  # a new request for the spec compiles afresh
    finally:
        so.shutdown()


def test_smallest_waiting_spec_compiles_first(model_dir, monkeypatch):
    so = manager(model_dir, monkeypatch, COMPILE_WORKERS=1, COMPILE_TIMEOUT_S=3)
    try:
        order: list[str] = []
        lock = threading.Lock()

        def track(name):
            def done(_):
                with lock:
                    order.append(name)
            return done

        busy = so.pool.submit("xgrammar", GrammarSpec("json", json.dumps(SLOW)))
        time.sleep(0.2)
        big = so.pool.submit("xgrammar", GrammarSpec("json", json.dumps(props_schema(300))))
        small = so.pool.submit("xgrammar", GrammarSpec("regex", "[a-c]+"))
        big.add_done_callback(track("big"))
        small.add_done_callback(track("small"))
        for future in (busy, big, small):
            wait_done(future, 120)
        assert order == ["small", "big"]
        assert small.exception() is None and big.exception() is None
    finally:
        so.shutdown()


def test_json_object_compiles_without_waiting_for_a_helper(model_dir, monkeypatch):
    so = manager(model_dir, monkeypatch, COMPILE_WORKERS=1, COMPILE_TIMEOUT_S=30)
    try:
        busy = so.pool.submit("xgrammar", GrammarSpec("json", json.dumps(SLOW)))
        time.sleep(0.2)
        sched = make_scheduler(model_dir)
        sched.structured_output_manager = so
        sched.add_request(make_request(sched, "j", [5, 6],
                                       StructuredOutputsParams(json_object=True)))
        future = sched.requests["j"].structured_output_request.compiled
        wait_done(future, 20)
        assert future.exception() is None and not busy.done()
    finally:
        so.shutdown()

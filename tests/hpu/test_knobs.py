"""Knob handling found by using the HPU backend as users would (issue 54, item 5).

- a bad warmup knob is refused at start-up, not after the warmup's compile phase;
- the fake HPU says it cannot count CPU fallbacks instead of reporting 0.
"""
from __future__ import annotations

import logging

import pytest

from tests.hpu.conftest import make_llm, platform_env
from vllm.hpu import habana
from vllm.hpu.compile_tracker import CompileTracker


@pytest.mark.parametrize("name,value", [("VLLM_GRAPH_PROMPT_STRATEGY", "min_token"),
                                        ("VLLM_GRAPH_DECODE_STRATEGY", "fastest"),
                                        ("VLLM_GRAPH_PROMPT_RATIO", "1.5"),
                                        ("VLLM_WARMUP_BUDGET_S", "-1")])
def test_bad_warmup_knob_is_refused_at_start(caplog, name, value):
    """Before: VLLM_GRAPH_PROMPT_STRATEGY was read when the graphs were captured, so
    a typo failed the start only after every bucket had compiled."""
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **{name: value}), \
            caplog.at_level(logging.INFO, logger="vllm"):
        with pytest.raises(ValueError, match=name):
            make_llm(enable_prefix_caching=False, max_num_seqs=2)
    assert not [r for r in caplog.records if r.getMessage().startswith(
        ("[Warmup]", "Pre-loading model weights"))]


def test_fake_hpu_says_it_cannot_count_cpu_fallbacks(monkeypatch, caplog):
    """Before: the fake HPU's cpu_fallback metric was hard-wired to 0, so the stats
    said "no fallbacks" and VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL logged "0 CPU
    fallback(s)" for every step, a measurement nobody made."""
    assert habana.is_fake_hpu()
    monkeypatch.setenv("VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL", "1")
    tracker = CompileTracker()
    tracker.finish_warmup()
    with caplog.at_level(logging.INFO, logger="vllm"):
        for _ in range(3):
            with tracker.track_pass("decode", ("sig", 1)):
                pass
            tracker.end_step()
    assert tracker.stats()["num_cpu_fallbacks"] is None
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "CPU fallback(s)" in m]
    assert len([m for m in messages if "cannot be counted on the fake HPU" in m]) == 1


def test_unknown_vllm_variables_are_warned_once_at_start(monkeypatch, caplog):
    """Before: a typo or vllm-fork's VLLM_PROMPT_USE_FUSEDSDPA was silently ignored;
    vLLM warns about VLLM_ variables it does not know. Once per process, at config
    creation (the start of LLM and of the server)."""
    from vllm import envs
    from vllm.engine.arg_utils import EngineArgs
    monkeypatch.setattr(envs, "_unknown_checked", False)
    monkeypatch.setenv("VLLM_PROMPT_USE_FUSEDSDPA", "1")
    monkeypatch.setenv("VLLM_SKIP_WARMPU", "1")
    with platform_env("hpu"), caplog.at_level(logging.WARNING, logger="vllm"):
        EngineArgs(max_model_len=256).create_engine_config()
        EngineArgs(max_model_len=256).create_engine_config()
    warned = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("Unknown vLLM environment variable detected")]
    assert len([m for m in warned if "VLLM_PROMPT_USE_FUSEDSDPA" in m]) == 1
    assert len([m for m in warned if "VLLM_SKIP_WARMPU" in m]) == 1
    assert not [m for m in warned if "VLLM_USE_FAKE_HPU" in m]  # known: no warning

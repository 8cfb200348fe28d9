"""The output processor holds back text that may still begin a stop string (one place,
used by LLM offline and by the server's streams)."""
from __future__ import annotations

import pytest

from vllm.core.scheduler import EngineCoreOutput
from vllm.engine.output_processor import OutputProcessor, ParentRequest
from vllm.outputs import RequestMetrics
from vllm.sampling_params import RequestOutputKind, SamplingParams

TEXT = " Paris.\n\nThe answer is: Paris"


def _run(tokenizer, params: SamplingParams) -> list:
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    proc = OutputProcessor(tokenizer)
    parent = ParentRequest("r", None, [1, 2, 3], params, RequestMetrics(arrival_time=0.0))
    proc.add_request(parent, ["r-0"], [params])
    outputs = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        results, _ = proc.process_outputs([EngineCoreOutput(
            "r-0", [token], finish_reason="length" if last else None)])
        outputs.extend(results)
        if parent.finished:
            break
    return outputs


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_no_partial_stop_string_is_ever_shown(default_tokenizer, kind):
    params = SamplingParams(stop=["he a", "xxxxxxx"], output_kind=kind)
    outputs = _run(default_tokenizer, params)
    texts = [o.outputs[0].text for o in outputs]
    shown = "".join(texts) if kind == RequestOutputKind.DELTA else texts[-1]
    assert shown == " Paris.\n\nT"
    for i in range(len(texts)):
        so_far = "".join(texts[:i + 1]) if kind == RequestOutputKind.DELTA else texts[i]
        assert " Paris.\n\nT".startswith(so_far), so_far
    assert outputs[-1].outputs[0].finish_reason == "stop"


def test_held_text_is_released_at_the_end(default_tokenizer):
    params = SamplingParams(stop=["never seen"], output_kind=RequestOutputKind.DELTA)
    outputs = _run(default_tokenizer, params)
    assert "".join(o.outputs[0].text for o in outputs) == TEXT
    assert len(outputs[-1].outputs[0].text) >= len("never seen") - 1
    assert params.output_text_buffer_length == len("never seen") - 1

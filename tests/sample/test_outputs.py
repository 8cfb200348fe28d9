"""RequestOutput / CompletionOutput: vLLM's reprs and delta merging."""
from __future__ import annotations

from vllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from vllm.sequence import Logprob


def test_completion_output_repr_and_finished():
    c = CompletionOutput(0, "Hi", [5, 6], None, None)
    assert not c.finished()
    c.finish_reason = "stop"
    assert c.finished()
    assert repr(c) == ("CompletionOutput(index=0, text='Hi', token_ids=[5, 6], "
                       "cumulative_logprob=None, logprobs=None, finish_reason=stop, "
                       "stop_reason=None)")


def test_request_output_repr():
    r = RequestOutput("req-1", "Hello", [1, 2], None, [CompletionOutput(0, "x", [3], None, None)],
                      finished=False, metrics=RequestMetrics(arrival_time=1.0))
    text = repr(r)
    assert text.startswith("RequestOutput(request_id=req-1, prompt='Hello', "
                           "prompt_token_ids=[1, 2], prompt_logprobs=None, outputs=[")
    assert "finished=False" in text and "num_cached_tokens=0" in text
    assert "RequestMetrics(arrival_time=1.0" in text


def test_add_aggregates_deltas_per_index():
    first = RequestOutput("r", "p", [1], None, [
        CompletionOutput(0, "ab", [1, 2], -1.0, [{1: Logprob(-0.5)}, {2: Logprob(-0.5)}])],
        finished=False)
    delta0 = CompletionOutput(0, "c", [3], -1.5, [{3: Logprob(-0.5)}], "length")
    delta1 = CompletionOutput(1, "z", [9], None, None)
    first.add(RequestOutput("r", "p", [1], None, [delta0, delta1], finished=True),
              aggregate=True)
    out0, out1 = first.outputs
    assert (out0.text, out0.token_ids, out0.cumulative_logprob) == ("abc", [1, 2, 3], -1.5)
    assert len(out0.logprobs) == 3 and out0.finish_reason == "length"
    assert out1.text == "z" and first.finished

    second = RequestOutput("r", "p", [1], None, [CompletionOutput(0, "a", [1], None, None)],
                           finished=False)
    second.add(RequestOutput("r", "p", [1], None, [CompletionOutput(0, "ab", [1, 2], None, None)],
                             finished=False), aggregate=False)
    assert second.outputs[0].text == "ab"

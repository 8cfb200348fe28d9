"""thinking_token_budget: the built-in knob forces the end-of-reasoning sequence once
the budget is spent (one token per step), never before, and leaves a request that
ended its reasoning itself alone; offline with a tiny model; the chat frontend's 400s."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm.sample.logits_processors import BUILTIN_PROCESSORS, needs_only_argmax
from vllm.sample.logits_processors.thinking_budget import forced_token
from vllm.sample.metadata import SamplingRow
from vllm.sample.sampler import Sampler
from vllm.sample.sampling_state import build_metadata
from vllm.sampling_params import SamplingParams

END = [7, 8, 9]
V = 16


def _params(budget=3, end=END, **kw):
    return SamplingParams(temperature=0.0, thinking_token_budget=budget,
                          thinking_end_token_ids=list(end), **kw)


def _sample(params, output, fixed=False):
    row = SamplingRow(params=params, prompt_token_ids=[1], output_token_ids=list(output))
    md = build_metadata([row], V, "cpu")
    if fixed:
        from vllm.hpu.sampling import fixed_shapes
        md = fixed_shapes(md, "cpu")
    logits = torch.zeros(1, V)
    logits[0, 2] = 5.0  # the model's favourite: token 2
    return Sampler()(logits, md).sampled_token_ids.flatten().tolist()[0]


def test_the_knob_is_in_the_table():
    assert any(p.name == "thinking_token_budget" for p in BUILTIN_PROCESSORS)


@pytest.mark.parametrize("fixed", [False, True])
def test_end_sequence_forced_after_budget_one_token_per_step(fixed):
    params = _params(budget=3)
    output: list[int] = []
    for _ in range(8):
        output.append(_sample(params, output, fixed))
    # Three free tokens of reasoning, then 7 8 9 forced, then the answer again free.
    assert output == [2, 2, 2, 7, 8, 9, 2, 2]


@pytest.mark.parametrize("fixed", [False, True])
def test_reasoning_ended_before_the_budget_is_untouched(fixed):
    params = _params(budget=5)
    output = [2, 7, 8, 9, 2]  # ended itself at step 4
    assert _sample(params, output, fixed) == 2
    assert forced_token(5, END, output) is None


def test_forced_token_window():
    assert [forced_token(2, END, [0] * n) for n in range(7)] == [None, None, 7, 8, 9,
                                                                None, None]
    assert forced_token(0, END, []) == 7


def test_greedy_fast_path_and_validation():
    params = _params(budget=3)
    assert not needs_only_argmax(params, 5)
    assert needs_only_argmax(params, 6)
    with pytest.raises(ValueError, match="thinking_end_token_ids"):
        SamplingParams(thinking_token_budget=3)
    with pytest.raises(ValueError, match="thinking_token_budget"):
        _params(budget=-1)


def test_offline_llm_forces_the_end_sequence(tiny_model_factory):
    from vllm import LLM
    llm = LLM(model=tiny_model_factory("qwen2"), dtype="float32", max_model_len=128)
    tok = llm.get_tokenizer()
    end = tok.encode("</think>", add_special_tokens=False)
    assert len(end) > 1  # several tokens: forced across steps
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    budget = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                            thinking_token_budget=4, thinking_end_token_ids=end)
    plain, budgeted = llm.generate(["The sky is", "The sky is"], [free, budget],
                                   use_tqdm=False)
    a, b = list(plain.outputs[0].token_ids), list(budgeted.outputs[0].token_ids)
    assert b[:4] == a[:4]
    assert b[4:4 + len(end)] == end
    assert len(b) == 12
    # A budget the output never reaches changes nothing.
    late = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                          thinking_token_budget=50, thinking_end_token_ids=end)
    (out,) = llm.generate(["The sky is"], [late], use_tqdm=False)
    assert list(out.outputs[0].token_ids) == a


def _chat_request(budget):
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                 thinking_token_budget=budget)


def test_chat_frontend_refuses_without_a_reasoning_end():
    from vllm.entrypoints.openai.errors import BadRequestError
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    request = _chat_request(4)
    assert request.unsupported_fields() is None
    params = SamplingParams()
    for parser in (None, SimpleNamespace(end_token_ids=[])):
        with pytest.raises(BadRequestError) as e:
            OpenAIServingChat.apply_thinking_budget(SimpleNamespace(reasoning_parser=parser),
                                                    request, params)
        assert e.value.param == "thinking_token_budget"
    parser = SimpleNamespace(end_token_ids=[5, 6], for_request=lambda r: parser)
    OpenAIServingChat.apply_thinking_budget(SimpleNamespace(reasoning_parser=parser),
                                            request, params)
    assert (params.thinking_token_budget, params.thinking_end_token_ids) == (4, [5, 6])


def test_completions_still_refuse_the_field():
    from vllm.entrypoints.openai.protocol import CompletionRequest
    req = CompletionRequest(prompt="x", thinking_token_budget=3)
    field, _ = req.unsupported_fields()
    assert field == "thinking_token_budget"


START = [4, 5]


@pytest.mark.parametrize("fixed", [False, True])
def test_budget_counts_from_the_models_own_reasoning_start(fixed):
    """A prompt that does not open the reasoning: nothing is forced before the model
    writes its start sequence; the budget counts from just after it (as vLLM)."""
    params = _params(budget=2, thinking_start_token_ids=START)
    output = [2, 2, 2]  # answer-like text first: no start, never forced
    assert _sample(params, output, fixed) == 2
    output = [2, 2, 2, 4, 5]
    for _ in range(6):
        output.append(_sample(params, output, fixed))
    assert output == [2, 2, 2, 4, 5, 2, 2, 7, 8, 9, 2]
    assert not needs_only_argmax(params, 50)  # where reasoning starts is the model's


def test_reasoning_begins_and_the_window_after_it():
    from vllm.sample.logits_processors.thinking_budget import reasoning_begins
    assert reasoning_begins(None, [1, 2]) == 0
    assert reasoning_begins(START, [1, 2]) is None
    assert reasoning_begins(START, [1, 4, 5, 3]) == 3
    out = [1, 4, 5, 3, 3]
    assert forced_token(2, END, out, reasoning_begins(START, out)) == 7
    assert forced_token(3, END, [1, 4, 5, 7, 8, 9, 3], 3) is None  # ended itself


def test_chat_frontend_sets_the_start_only_when_the_prompt_does_not_open_it():
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    from vllm.reasoning import ReasoningParserManager

    class Tok:
        def get_vocab(self):
            return {"<think>": 90, "</think>": 91}

    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(Tok())
    chat = SimpleNamespace(reasoning_parser=parser)
    opened, plain = SamplingParams(), SamplingParams()
    OpenAIServingChat.apply_thinking_budget(chat, _chat_request(4), opened, [1, 2, 90])
    OpenAIServingChat.apply_thinking_budget(chat, _chat_request(4), plain, [1, 2])
    assert opened.thinking_start_token_ids is None  # the template opened <think>
    assert plain.thinking_start_token_ids == [90]
    assert plain.thinking_end_token_ids == opened.thinking_end_token_ids == [91]

"""vLLM's offline signatures and argument semantics, as a vLLM user's code calls them:
LLM.generate's keywords (priority, tokenization_kwargs, a tqdm class), truncation,
output kinds, LLM.chat's content parts / content formats / tools / argument order,
seeds at the int64 edge, supported_tasks / apply_model / model_config, beam search's
concurrency limit, LLMEngine.add_request's keywords."""
from __future__ import annotations

import inspect
import math

import pytest

from vllm import LLM, SamplingParams
from vllm.sampling_params import BeamSearchParams, RequestOutputKind

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
# Renders each message's content; a list of parts is looped over part by part.
PARTS_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}"
                  "{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}"
                  "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
STRING_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                   "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=64)


def _ids(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_generate_refuses_unknown_keywords(llm):
    with pytest.raises(TypeError, match="sampling_param"):
        llm.generate("hello", sampling_param=GREEDY, use_tqdm=False)


def test_generate_priority_and_tokenization_kwargs(llm):
    assert len(llm.generate(["a b", "c d"], GREEDY, use_tqdm=False, priority=[0, 0])) == 2
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a b", "c d"], GREEDY, use_tqdm=False, priority=[0, 1])
    with pytest.raises(ValueError, match="lengths of prompts"):
        llm.generate(["a b", "c d"], GREEDY, use_tqdm=False, priority=[0])
    text = "the cat sat on the mat and looked at the dog"
    full = llm.get_tokenizer()(text)["input_ids"]
    out = llm.generate(text, GREEDY, use_tqdm=False,
                       tokenization_kwargs={"truncation": True, "max_length": 3})[0]
    assert list(out.prompt_token_ids) == full[:3]


def test_generate_builds_its_bar_with_a_given_class(llm):
    made = []

    class Bar:
        def __init__(self, **kwargs):
            made.append(kwargs["total"])
            self.format_dict = {"elapsed": 1.0}

        def set_postfix_str(self, text):
            pass

        def update(self, n):
            pass

        def close(self):
            pass

    llm.generate(["x", "y"], GREEDY, use_tqdm=Bar)
    assert made == [2]


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    ids = list(range(100, 120))
    kept = llm.generate({"prompt_token_ids": ids},
                        SamplingParams(max_tokens=2, temperature=0.0, truncate_prompt_tokens=5),
                        use_tqdm=False)[0]
    assert list(kept.prompt_token_ids) == ids[-5:]
    # -1: as much of the prompt as leaves room for max_tokens.
    long_ids = list(range(100, 200))
    fit = llm.generate({"prompt_token_ids": long_ids},
                       SamplingParams(max_tokens=4, temperature=0.0, truncate_prompt_tokens=-1),
                       use_tqdm=False)[0]
    assert list(fit.prompt_token_ids) == long_ids[-60:]
    assert len(fit.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        llm.generate({"prompt_token_ids": ids},
                     SamplingParams(max_tokens=2, truncate_prompt_tokens=65), use_tqdm=False)


def test_delta_output_kind_still_returns_the_whole_completion(llm):
    delta = SamplingParams(max_tokens=6, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    whole = SamplingParams(max_tokens=6, temperature=0.0)
    a = llm.generate("the cat", delta, use_tqdm=False)[0].outputs[0]
    b = llm.generate("the cat", whole, use_tqdm=False)[0].outputs[0]
    assert list(a.token_ids) == list(b.token_ids) and len(a.token_ids) == 6
    assert a.text == b.text
    assert delta.output_kind is RequestOutputKind.DELTA  # the caller's object is untouched


def test_chat_takes_content_parts_and_missing_content(llm):
    plain = llm.chat([{"role": "user", "content": "hello\nworld"}], GREEDY, use_tqdm=False,
                     chat_template=STRING_TEMPLATE)[0]
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "hello"},
                                                   {"type": "text", "text": "world"}]}],
                     GREEDY, use_tqdm=False, chat_template=STRING_TEMPLATE)[0]
    assert list(parts.prompt_token_ids) == list(plain.prompt_token_ids)
    assert parts.prompt == "<user>hello\nworld<assistant>"
    empty = llm.chat([{"role": "user"}], GREEDY, use_tqdm=False,
                     chat_template=STRING_TEMPLATE)[0]
    assert empty.prompt == "<user><assistant>"
    with pytest.raises(ValueError, match="takes no images"):
        llm.chat([{"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "data:,"}}]}],
                 GREEDY, use_tqdm=False, chat_template=STRING_TEMPLATE)
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "hi"}], GREEDY, use_tqdm=False, chat_template=STRING_TEMPLATE)


def test_chat_content_format(llm):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}]
    auto = llm.chat(msgs, GREEDY, use_tqdm=False, chat_template=PARTS_TEMPLATE)[0]
    assert auto.prompt == "<user>[a][b]<assistant>"  # the template loops over parts
    string = llm.chat(msgs, GREEDY, use_tqdm=False, chat_template=PARTS_TEMPLATE,
                      chat_template_content_format="string")[0]
    assert string.prompt == "<user>a\nb<assistant>"
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(msgs, GREEDY, use_tqdm=False, chat_template=PARTS_TEMPLATE,
                 chat_template_content_format="markdown")


def test_chat_signature_and_tools(llm):
    assert list(inspect.signature(LLM.chat).parameters)[1:7] == [
        "messages", "sampling_params", "use_tqdm", "lora_request", "chat_template",
        "chat_template_content_format"]
    template = ("{% for t in tools or [] %}({{ t.function.name }}){% endfor %}"
                + STRING_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False,
                   chat_template=template, tools=tools)[0]
    assert out.prompt.startswith("(get_weather)<user>hi")
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template=template,
                 mm_processor_kwargs={"num_crops": 4})


def test_seed_must_fit_int64_and_children_stay_in_range(llm):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**64)
    params = SamplingParams(n=3, seed=2**63 - 1, max_tokens=3, temperature=1.0)
    out = llm.generate("the cat", params, use_tqdm=False)[0]
    assert len(out.outputs) == 3 and all(len(c.token_ids) == 3 for c in out.outputs)


def test_supported_tasks_model_config_and_apply_model(llm):
    assert llm.supported_tasks == ("generate",)
    assert llm.model_config is llm.llm_engine.model_config
    assert llm.apply_model(lambda model: type(model).__name__) == ["LlamaForCausalLM"]


def test_beam_search_concurrency_limit(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    prompts = ["the cat", "a dog", "one two"]
    together = llm.beam_search(prompts, params)
    limited = llm.beam_search(prompts, params, concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in together] == \
        [[s.tokens for s in o.sequences] for o in limited]
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(prompts, params, concurrency_limit=0)


def test_engine_add_request_keywords(llm):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("p1", "hello", GREEDY, priority=2)
    engine.add_request("p2", "the cat sat on the mat", GREEDY,
                       tokenization_kwargs={"truncation": True, "max_length": 2})
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert [len(o.prompt_token_ids) for o in outs] == [2]


def _pair_that_round_trips(tokenizer, ids):
    """A position i where ids[i], ids[i + 1] spell a word the tokenizer encodes back to
    exactly those two tokens (with or without a leading space)."""
    for i in range(len(ids) - 1):
        word = tokenizer.decode(ids[i:i + 2])
        if not word.strip():
            continue
        for text in (word.lstrip(), " " + word.lstrip()):
            if tokenizer.encode(text, add_special_tokens=False) == ids[i:i + 2]:
                return i, word
    return None


def test_bad_words_one_and_two_tokens(llm):
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    base = list(llm.generate("the cat sat on", params, use_tqdm=False)[0].outputs[0].token_ids)
    first_word = tokenizer.decode(base[:1])
    banned = llm.generate("the cat sat on", SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, bad_words=[first_word]),
        use_tqdm=False)[0].outputs[0].token_ids
    assert base[0] not in banned
    found = _pair_that_round_trips(tokenizer, base)
    assert found is not None, base
    i, word = found
    out = list(llm.generate("the cat sat on", SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, bad_words=[word]),
        use_tqdm=False)[0].outputs[0].token_ids)
    assert out[:i + 1] == base[:i + 1]  # the first token alone is allowed
    assert out[i + 1] != base[i + 1]
    assert not any(out[j:j + 2] == base[i:i + 2] for j in range(len(out) - 1))
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=[""])


def test_logprobs_minus_one_is_the_whole_vocabulary(llm, tiny_model_factory):
    params = SamplingParams(max_tokens=2, temperature=0.0, logprobs=-1)
    with pytest.raises(ValueError, match="max allowed: 20"):  # vLLM's default cap
        llm.generate("the cat", params, use_tqdm=False)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=-2)
    wide = LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=64,
               max_logprobs=-1, kv_cache_memory_bytes=16 << 20)
    try:
        out = wide.generate("the cat", params, use_tqdm=False)[0].outputs[0]
        vocab = wide.llm_engine.model_config.get_vocab_size()
        assert [len(step) for step in out.logprobs] == [vocab, vocab]
        total = sum(math.exp(lp.logprob) for lp in out.logprobs[0].values())
        assert abs(total - 1.0) < 1e-3
    finally:
        del wide


def test_cache_salt_isolates_prefix_cache_blocks(llm):
    ids = list(range(200, 248))  # three full blocks of 16
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def cached(prompt: dict) -> int:
        return llm.generate(prompt, params, use_tqdm=False)[0].num_cached_tokens

    assert cached({"prompt_token_ids": ids}) == 0
    assert cached({"prompt_token_ids": ids}) > 0  # caching works here
    assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-a"}) == 0
    assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-a"}) > 0
    assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-b"}) == 0
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate({"prompt_token_ids": ids, "cache_salt": ""}, params, use_tqdm=False)


def test_skip_tokenizer_init_is_token_ids_in_token_ids_out(llm, tiny_model_factory,
                                                          monkeypatch):
    """vLLM's LLM(skip_tokenizer_init=True): no tokenizer is loaded; prompts are token ids,
    outputs token ids with empty text (and logprobs without decoded tokens), the same
    tokens as with a tokenizer; text prompts are refused with vLLM's message."""
    import vllm.transformers_utils.tokenizer as tokenizer_module

    prompt = {"prompt_token_ids": [5, 17, 42, 99, 7]}
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1, detokenize=True)
    reference = llm.generate(prompt, params, use_tqdm=False)[0]

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("skip_tokenizer_init=True loaded a tokenizer")

    monkeypatch.setattr(tokenizer_module, "get_tokenizer", no_tokenizer)
    bare = LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=64,
               skip_tokenizer_init=True)
    try:
        with pytest.raises(ValueError, match="cannot pass text prompts when"):
            bare.generate("abc", params, use_tqdm=False)
        out = bare.generate(prompt, params, use_tqdm=False)[0]
        completion = out.outputs[0]
        assert completion.text == "" and completion.token_ids
        assert list(completion.token_ids) == list(reference.outputs[0].token_ids)
        assert all(lp.decoded_token is None for step in completion.logprobs
                   for lp in step.values())
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 5
        with pytest.raises(ValueError, match="stop needs the tokenizer"):
            bare.generate(prompt, SamplingParams(max_tokens=2, stop=["x"]), use_tqdm=False)
        with pytest.raises(ValueError, match="skip_tokenizer_init"):
            bare.get_tokenizer()
    finally:
        bare.llm_engine.shutdown()

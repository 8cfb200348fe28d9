"""The OpenAI server through the real `openai` client, on the default model."""
from __future__ import annotations

import json

import openai
import pytest

from tests.entrypoints.conftest import API_KEY

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_ready(server, http):
    # How fast the server starts is a benchmark's question (benchmarks/README.md);
    # the test asks that it became ready and answers.
    assert server.ready_s > 0
    assert http.get("/health").status_code == 200


def test_models_health_version(server, client, http):
    models = client.models.list()
    assert len(models.data) == 1
    card = http.get("/v1/models").json()["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 8192 and card["root"]
    assert http.get("/health").status_code == 200
    version = http.get("/version").json()["version"]
    import vllm
    assert version == vllm.__version__


def test_completion_length_and_usage(client, model_name, tokenizer):
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5,
                                    temperature=0, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids)
    assert out.usage.completion_tokens == 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert len(tokenizer(choice.text, add_special_tokens=False).input_ids) in range(3, 8)


def test_completion_stream_matches_full(client, model_name):
    full = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8,
                                     temperature=0)
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == full.choices[0].finish_reason
    assert all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens


def test_chat_full_and_stream(client, model_name, tokenizer):
    full = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=10,
                                          temperature=0)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    prompt_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True,
                                               tokenize=False)
    assert full.usage.prompt_tokens == len(
        tokenizer(prompt_ids, add_special_tokens=False).input_ids)
    chunks = list(client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    with_reason = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(with_reason) == 1 and with_reason[0].choices[0].finish_reason == \
        full.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_chat_max_tokens_unset_fills_context(http, model_name):
    # max_tokens null: the request may run to the end of the context, and it ends at its
    # stop string. A space, not ".": the greedy answer's first token is a bf16 tie between
    # "The" and "L" (equal logprobs), and the kernels' rounding may take either; the "L"
    # branch never writes a period and would run 8000 tokens.
    body = {"model": model_name, "messages": CHAT, "temperature": 0, "max_tokens": None,
            "stop": [" "], "include_stop_str_in_output": True}
    out = http.post("/v1/chat/completions", json=body).json()
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["message"]["content"].endswith(" ")


def test_n_choices(client, model_name):
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, n=2,
                                    temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.completion_tokens == 8
    chat = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3, n=2,
                                          temperature=1.0, seed=7)
    assert sorted(c.index for c in chat.choices) == [0, 1]


def test_multiple_prompts(client, model_name):
    out = client.completions.create(model=model_name, prompt=[PROMPT, "1, 2, 3,"], n=2,
                                    max_tokens=3, temperature=0.8, seed=1,
                                    extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 12


def test_completion_logprobs(client, model_name):
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4,
                                    temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == out.choices[0].text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 3 <= len(top) <= 4
        # Greedy: the chosen token is the most likely one.
        assert top[token] == pytest.approx(max(top.values()), abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_with_logprobs(client, model_name, tokenizer):
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2,
                                    temperature=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT)
    n_prompt = len(tokenizer(PROMPT).input_ids)
    assert len(choice.logprobs.tokens) == n_prompt + out.usage.completion_tokens
    assert choice.logprobs.token_logprobs[0] is None
    assert all(v is not None for v in choice.logprobs.token_logprobs[1:])


def test_chat_logprobs(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token
        assert entry.bytes == list(entry.token.encode())


def test_stop_string(client, model_name):
    base = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = text.strip().split()[1] if len(text.split()) > 1 else text.strip()[-2:]
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                    temperature=0, stop=[stop])
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == stop
    assert choice.text == text[:text.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop],
        stream=True))
    assert streamed == choice.text


def test_seed_reproducible(client, model_name):
    def sample(seed):
        return client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
    first = sample(1234)
    assert sample(1234) == first
    assert len({first, sample(1), sample(2), sample(3)}) > 1


def test_greedy_chat_matches_offline_llm(client, model_name, monkeypatch):
    from vllm import LLM, SamplingParams
    # Its own system message: the default one opens every other chat of this module, so
    # its KV blocks are in the server's prefix cache, and a prefill over cached blocks
    # rounds differently in bf16 than the offline engine's full prefill (a different
    # attention call: greedy tokens may then differ, as in vLLM). A fresh first block
    # keeps both prefills alike.
    messages = [{"role": "system", "content": "You answer in short lists."},
                {"role": "user", "content": "Name three colors."}]
    server = client.chat.completions.create(model=model_name, messages=messages,
                                            max_tokens=12, temperature=0)
    # 128 MiB holds 2048 tokens also where the default model runs in float32 (CPUs
    # without native bf16 resolve the GGUF's float32 weights to float32).
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # the server fixture's kernels
    llm = LLM(max_num_seqs=4, max_model_len=2048, kv_cache_memory_bytes=128 << 20)
    try:
        offline = llm.chat(messages, SamplingParams(max_tokens=12, temperature=0),
                           use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert server.choices[0].message.content == offline[0].outputs[0].text


def test_tokenize_detokenize(http, model_name, tokenizer):
    out = http.post("/tokenize", json={"model": model_name, "prompt": PROMPT}).json()
    assert out["tokens"] == tokenizer(PROMPT).input_ids
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == 8192
    chat = http.post("/tokenize", json={"messages": CHAT}).json()
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer(text, add_special_tokens=False).input_ids
    back = http.post("/detokenize", json={"tokens": out["tokens"]}).json()
    assert back == {"prompt": PROMPT}


def test_chat_content_parts_and_refusals(http, model_name):
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
             "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=parts).status_code == 200
    image = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}
    r = http.post("/v1/chat/completions", json=image)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.0"
    for body, param in (({"response_format": {"type": "json_schema"}},
                         "response_format.json_schema"),
                        ({"tools": [{"type": "function", "function": {"name": "f"}}]},
                         "tool_choice"),  # "auto" needs --enable-auto-tool-choice
                        ({"use_beam_search": True}, "use_beam_search"),
                        ({"best_of": 3}, "best_of")):
        r = http.post("/v1/chat/completions", json={"messages": CHAT, **body})
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param
    r = http.post("/v1/completions", json={"prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


def test_api_key(server, http):
    import httpx
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        r = httpx.post(server.url + "/v1/completions", headers=headers,
                       json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_metrics_names(http):
    text = http.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:request_queue_time_seconds_bucket",
                 "vllm:request_prompt_tokens_bucket",
                 "vllm:request_generation_tokens_bucket"):
        assert f"\n{name}{{" in text, name
    assert 'model_name="' in text and 'finished_reason="length"' in text
    generated = [line for line in text.splitlines()
                 if line.startswith("vllm:generation_tokens_total{")]
    assert float(generated[0].rsplit(" ", 1)[1]) > 0


def test_stream_sse_format(http, model_name):
    with http.stream("POST", "/v1/chat/completions", json={
            "model": model_name, "messages": CHAT, "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}

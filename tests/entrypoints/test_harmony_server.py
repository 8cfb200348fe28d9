"""A harmony conversation with a tool call, served and read by the official `openai`
client (--tool-call-parser openai, --reasoning-parser openai_gptoss): the call parsed
from the commentary channel, the tool result accepted back into the prompt, the final
answer in `content` and the analysis in `reasoning` (vLLM 0.32's field), streamed and
not. A tiny random model with harmony's special tokens "speaks" scripted harmony through
a user-written logits processor (harmony_script.py); its chat template renders the
conversation in harmony."""
from __future__ import annotations

import json
import signal

import pytest

from tests.entrypoints.conftest import RemoteServer

HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>"]
TEMPLATE = (
    "{%- if tools -%}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{%- for t in tools %} type {{ t.function.name }} = (_: object) => any;{% endfor %}\n}"
    "<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- if m.reasoning or m.reasoning_content -%}<|start|>assistant<|channel|>analysis"
    "<|message|>{{ m.reasoning or m.reasoning_content }}<|end|>{%- endif -%}"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}<|start|>assistant<|channel|>"
    "commentary to=functions.{{ tc.function.name }} <|constrain|>json<|message|>"
    "{{ tc.function.arguments if tc.function.arguments is string else "
    "tc.function.arguments | tojson }}<|call|>{%- endfor -%}"
    "{%- elif m.content -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}"
    "<|end|>{%- endif -%}"
    "{%- elif m.role == 'tool' -%}<|start|>functions.get_weather to=assistant<|channel|>"
    "commentary<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}")
CALL_TEXT = ("<|channel|>analysis<|message|>The user asks about Paris; I need the weather."
             "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
             "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")
FINAL_TEXT = ("<|channel|>analysis<|message|>The tool says 21 degrees.<|end|><|start|>"
              "assistant<|channel|>final<|message|>It is 21 °C and sunny in Paris.<|return|>")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
USER = {"role": "user", "content": "What is the weather in Paris?"}


def make_tiny_harmony_model(directory: str) -> str:
    """A 2-layer random Llama whose tokenizer has harmony's special tokens and a harmony
    chat template; <|return|> and <|call|> end generation (generation_config)."""
    import torch
    import transformers
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
    tok.chat_template = TEMPLATE
    ret, call = tok.convert_tokens_to_ids(["<|return|>", "<|call|>"])
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64,
                                      intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=1024, bos_token_id=1,
                                      eos_token_id=[ret, call])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [ret, call]
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = make_tiny_harmony_model(str(tmp_path_factory.mktemp("tiny-harmony")))
    srv = RemoteServer(["--model", path, "--dtype", "float32", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(16 << 20), "--disable-log-requests",
                        "--enable-auto-tool-choice", "--tool-call-parser", "openai",
                        "--reasoning-parser", "openai_gptoss", "--logits-processors",
                        "tests.entrypoints.harmony_script:ScriptedOutputLogitsProcessor"])
    import openai
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(path)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    yield client, client.models.list().data[0].id, tok
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def _chat(served, messages, script: str, stream: bool):
    client, model, tok = served
    kwargs = dict(model=model, messages=messages, tools=TOOLS, max_tokens=200,
                  temperature=0, extra_body={"vllm_xargs": {
                      "script": tok.encode(script, add_special_tokens=False)}})
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        msg = choice.message
        calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return msg.content, msg.model_extra.get("reasoning"), calls, choice.finish_reason
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning") or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, ["", "", ""])
            entry[0] = d.id or entry[0]
            entry[1] = (d.function.name if d.function and d.function.name else entry[1])
            entry[2] += (d.function.arguments or "") if d.function else ""
    return content or None, reasoning or None, [tuple(c) for c in calls.values()], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_call_round_trip(served, stream):
    content, reasoning, calls, finish = _chat(served, [USER], CALL_TEXT, stream)
    assert reasoning == "The user asks about Paris; I need the weather."
    assert content is None and finish == "tool_calls"
    assert [(name, json.loads(args)) for _, name, args in calls] == [
        ("get_weather", {"city": "Paris"})]
    call_id, name, args = calls[0]
    history = [USER, {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}]},
               {"role": "tool", "tool_call_id": call_id,
                "content": json.dumps({"temperature_c": 21, "sky": "sunny"})}]
    content, reasoning, calls, finish = _chat(served, history, FINAL_TEXT, stream)
    assert (content, reasoning, calls, finish) == (
        "It is 21 °C and sunny in Paris.", "The tool says 21 degrees.", [], "stop")


def test_tool_result_reaches_the_prompt(served):
    """The follow-up's prompt holds the call and the result in harmony (the template's
    rendering through the server's own tokenizer)."""
    import httpx
    client, model, tok = served
    history = [USER, {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 21}"}]
    r = httpx.post(str(client.base_url).replace("/v1/", "") + "/tokenize",
                   json={"model": model, "messages": history, "tools": TOOLS,
                         "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    text = tok.decode(r.json()["tokens"])
    assert ("commentary to=functions.get_weather <|constrain|>json<|message|>"
            "{\"city\": \"Paris\"}<|call|>") in text
    assert "to=assistant<|channel|>commentary<|message|>{\"temperature_c\": 21}<|end|>" in text
    assert text.endswith("<|start|>assistant")

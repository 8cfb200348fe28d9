"""--tokenizer-mode mistral: a Tekken tokenizer file (tekken.json, built here from a byte
vocabulary and a few merges) read by mistral-common, on a tiny random Mistral model.

The wrapper encodes and decodes as mistral-common; chats (system, tools, tool calls and
results) are mistral-common's token ids; the incremental detokenizer's deltas add up
to the full decode; the offline LLM and a served model (chat, streamed chat, tools with
tool_choice "required" through the grammar backend, /tokenize) use it."""
from __future__ import annotations

import base64
import json
import os
import signal

import httpx
import pytest

pytest.importorskip("mistral_common")

from tests.entrypoints.conftest import RemoteServer  # noqa: E402

MERGES = ["th", "the", "in", "er", "an", "en", "on", " t", " the", "ar", "is", "at"]
PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
           r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
           r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_SPECIAL = 20  # mistral-common's default control tokens of a v7 file: <unk>, <s>, </s>, ...
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich? [INST] stays text"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call00001", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "sunny, 21 °C"},
    {"role": "user", "content": "Thanks!"},
]


def write_tekken(directory: str) -> int:
    """A v7 tekken.json: 256 byte tokens plus MERGES; returns the vocabulary size."""
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(),
              "token_str": None} for i in range(256)]
    for m in MERGES:
        vocab.append({"rank": len(vocab), "token_bytes": base64.b64encode(m.encode()).decode(),
                      "token_str": m})
    data = {"config": {"pattern": PATTERN, "num_vocab_tokens": len(vocab),
                       "default_vocab_size": len(vocab) + NUM_SPECIAL,
                       "default_num_special_tokens": NUM_SPECIAL, "version": "v7"},
            "vocab": vocab, "version": 1, "type": "Tekken"}
    with open(os.path.join(directory, "tekken.json"), "w") as f:
        json.dump(data, f)
    return len(vocab) + NUM_SPECIAL


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    """A tiny random MistralForCausalLM with only a tekken.json as its tokenizer."""
    from tests.conftest import make_tiny_model
    directory = str(tmp_path_factory.mktemp("tiny-mistral-tekken"))
    vocab_size = write_tekken(directory)
    make_tiny_model(directory, "mistral", vocab_size=vocab_size)
    for name in os.listdir(directory):  # no transformers tokenizer to fall back on
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")) or \
                name == "chat_template.jinja":
            os.remove(os.path.join(directory, name))
    write_tekken(directory)
    return directory


@pytest.fixture(scope="module")
def tok(mistral_dir):
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(mistral_dir, tokenizer_mode="mistral")


def _reference(mistral_dir):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    return MistralTokenizer.from_file(os.path.join(mistral_dir, "tekken.json"))


def test_encode_decode_as_mistral_common(tok, mistral_dir):
    inner = _reference(mistral_dir).instruct_tokenizer.tokenizer
    text = "the weather in Zürich — 北京 ✓ [INST]"
    assert tok.encode(text) == inner.encode(text, bos=True, eos=False)
    assert tok(text, add_special_tokens=False)["input_ids"] == inner.encode(text, False, False)
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == "<s>" + text
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2) and len(tok) == inner.n_words
    assert tok.convert_ids_to_tokens([3, 9]) == ["[INST]", "[TOOL_CALLS]"]


def test_chat_with_tools_is_mistral_commons_token_ids(tok, mistral_dir):
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    ids, text = tok.encode_chat(HISTORY, TOOLS)
    ref = _reference(mistral_dir).encode_chat_completion(
        ChatCompletionRequest.from_openai(HISTORY, tools=TOOLS))
    assert ids == ref.tokens
    assert text.startswith("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT]")
    assert "[AVAILABLE_TOOLS]" in text and '[TOOL_CALLS][{"name": "get_weather"' in text
    # The user's "[INST]" is text (bytes), the template's are the control token.
    assert ids.count(3) == 2


def test_incremental_detokenization_adds_up(tok):
    from vllm.engine.detokenizer import IncrementalDetokenizer
    text = 'Zürich 北京: [TOOL_CALLS][{"name": "f", "arguments": {"a": "é"}}] the end'
    ids = tok.encode(text, add_special_tokens=False) + [9] + tok.encode(" ok", False)
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, [1, 3], skip_special_tokens=skip)
        out = "".join(detok.update([i]) for i in ids) + detok.flush()
        assert out == tok.decode(ids, skip_special_tokens=skip)


def test_offline_chat(mistral_dir):
    from vllm import LLM, SamplingParams
    llm = LLM(mistral_dir, tokenizer_mode="mistral", dtype="float32", max_model_len=512,
              kv_cache_memory_bytes=16 << 20, max_num_seqs=2)
    try:
        out = llm.chat(HISTORY, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                       tools=TOOLS)
        ids, _ = llm.get_tokenizer().encode_chat(HISTORY, TOOLS)
        assert out[0].prompt_token_ids == ids and len(out[0].outputs[0].token_ids) == 8
    finally:
        del llm


def write_mistral_format(hf_dir: str, out_dir: str) -> None:
    """The HF checkpoint in Mistral's own format: params.json, consolidated.safetensors
    (Mistral's names, q/k rows in interleaved rotary order), and the tekken.json."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from vllm.transformers_utils.mistral_format import _LAYER_NAMES, half_to_interleaved
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    json.dump({"dim": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
               "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
               "hidden_dim": cfg["intermediate_size"], "n_heads": cfg["num_attention_heads"],
               "n_kv_heads": cfg["num_key_value_heads"], "norm_eps": cfg["rms_norm_eps"],
               "vocab_size": cfg["vocab_size"], "rope_theta": cfg["rope_parameters"][
                   "rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"],
               "max_position_embeddings": cfg["max_position_embeddings"],
               "torch_dtype": "float32"}, open(os.path.join(out_dir, "params.json"), "w"))
    back = {v: k for k, v in _LAYER_NAMES.items()}
    top = {"model.embed_tokens.weight": "tok_embeddings.weight",
           "model.norm.weight": "norm.weight", "lm_head.weight": "output.weight"}
    tensors = {}
    for name, t in load_file(os.path.join(hf_dir, "model.safetensors")).items():
        if name in top:
            tensors[top[name]] = t
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        module, kind = rest.rsplit(".", 1)
        if module == "self_attn.q_proj":
            t = half_to_interleaved(t, cfg["num_attention_heads"])
        elif module == "self_attn.k_proj":
            t = half_to_interleaved(t, cfg["num_key_value_heads"])
        tensors[f"layers.{layer}.{back[module]}.{kind}"] = t.to(torch.float32).contiguous()
    save_file(tensors, os.path.join(out_dir, "consolidated.safetensors"))
    shutil.copy(os.path.join(hf_dir, "tekken.json"), out_dir)


def test_mistral_config_and_load_format_match_the_hf_checkpoint(mistral_dir, tmp_path):
    """--config-format mistral --load-format mistral on the same weights in Mistral's
    layout generate the HF checkpoint's tokens (the rotary reorder is exact)."""
    from vllm import LLM, SamplingParams
    write_mistral_format(mistral_dir, str(tmp_path))
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = []
    for path, extra in ((mistral_dir, {}), (str(tmp_path), dict(config_format="mistral",
                                                                load_format="mistral")),
                        (str(tmp_path), {})):  # auto: params.json and no config.json
        llm = LLM(path, tokenizer_mode="mistral", dtype="float32", max_model_len=512,
                  kv_cache_memory_bytes=16 << 20, max_num_seqs=2, **extra)
        outs.append([o.outputs[0].token_ids for o in llm.chat(
            [HISTORY, HISTORY[:2]], greedy, tools=TOOLS)])
        del llm
    assert outs[0] == outs[1] == outs[2]


def test_mistral_format_refusals(tmp_path):
    from vllm.transformers_utils.mistral_format import hf_name, mistral_hf_config
    (tmp_path / "params.json").write_text(json.dumps(
        {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128,
         "moe": {"num_experts": 8}}))
    with pytest.raises(ValueError, match="'moe'.*mixture-of-experts"):
        mistral_hf_config(str(tmp_path))
    with pytest.raises(ValueError, match="unexpected tensor"):
        hf_name("vision_encoder.patch_conv.weight")


def test_flags_and_refusals():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = EngineArgs.from_cli_args(make_arg_parser().parse_args(
        ["--tokenizer-mode", "mistral", "--config-format", "mistral", "--load-format",
         "mistral"]))
    assert (args.tokenizer_mode, args.config_format, args.load_format) == ("mistral",) * 3


@pytest.fixture(scope="module")
def served(mistral_dir):
    srv = RemoteServer(["--model", mistral_dir, "--tokenizer-mode", "mistral",
                        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "4",
                        "--kv-cache-memory-bytes", str(16 << 20), "--disable-log-requests",
                        "--enable-auto-tool-choice", "--tool-call-parser", "mistral",
                        # compact JSON: the random model would pad calls with whitespace
                        "--structured-outputs-config", '{"disable_any_whitespace": true}'])
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def test_served_chat_streamed_equals_full(served, tok):
    body = {"messages": HISTORY, "tools": TOOLS, "tool_choice": "none", "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    with httpx.Client(base_url=served.url, timeout=120) as http:
        full = http.post("/v1/chat/completions", json=body)
        assert full.status_code == 200, full.text
        choice = full.json()["choices"][0]
        assert full.json()["usage"]["prompt_tokens"] == len(tok.encode_chat(HISTORY, TOOLS)[0])
        streamed = ""
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:])["choices"]:
                        streamed += c["delta"].get("content") or ""
        assert streamed == choice["message"]["content"] == tok.decode(
            choice["token_ids"], skip_special_tokens=True)
        tokenized = http.post("/tokenize", json={"messages": HISTORY})
        assert tokenized.json()["tokens"] == tok.encode_chat(HISTORY)[0]


@pytest.mark.parametrize("stream", [False, True])
def test_served_required_tool_call(served, stream):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"enum": ["Paris", "Zürich"]}}, "required": ["city"]}}}]
    body = {"messages": HISTORY[:2], "tools": tools, "tool_choice": "required",
            "max_tokens": 60, "temperature": 0, "stream": stream}
    with httpx.Client(base_url=served.url, timeout=120) as http:
        if not stream:
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            calls = r.json()["choices"][0]["message"]["tool_calls"]
            assert calls and calls[0]["function"]["name"] == "get_weather"
            assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
            return
        names, args = [], ""
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:])["choices"]:
                        for call in c["delta"].get("tool_calls") or []:
                            names.append(call.get("function", {}).get("name"))
                            args += call.get("function", {}).get("arguments") or ""
        assert "get_weather" in names and isinstance(json.loads(args)["city"], str)


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_grammar_backends_take_the_mistral_vocabulary(tok, backend):
    """A choice constraint through each backend allows the tokens that spell it."""
    import torch

    from vllm.sampling_params import StructuredOutputsParams
    from vllm.structured_output.backend_guidance import GuidanceBackend
    from vllm.structured_output.backend_xgrammar import XgrammarBackend
    from vllm.structured_output.backend_types import grammar_spec
    cls = XgrammarBackend if backend == "xgrammar" else GuidanceBackend
    be = cls(tok, len(tok), [tok.eos_token_id])
    grammar = be.new_grammar(be.compile(grammar_spec(
        StructuredOutputsParams(regex="the Zürich"))))
    ids = tok.encode("the Zürich", add_special_tokens=False)
    for i in ids:
        bitmask = torch.zeros(1, (len(tok) + 31) // 32, dtype=torch.int32)
        grammar.fill_bitmask(bitmask, 0)
        assert (bitmask[0, i // 32] >> (i % 32)) & 1, i
        assert grammar.accept_tokens([i])


def test_served_completion_with_logprobs_and_stop(served, tok):
    body = {"prompt": "the weather in Zürich", "max_tokens": 6, "temperature": 0,
            "logprobs": 2, "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == tok.encode("the weather in Zürich")
    assert len(choice["logprobs"]["tokens"]) == 6
    assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=True)

"""The pooling routes over HTTP: one server with a tiny BERT embedder (MEAN pooling from
its sentence-transformers files, Matryoshka through hf_overrides), checked with the
official `openai` client against the offline `LLM.embed` of the same model."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from tests.entrypoints.conftest import RemoteServer
from tests.pooling._pooling_models import make_tiny_encoder

TEXTS = ["the cat sat on the mat", "paris is the capital of france", "what is a vector"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return make_tiny_encoder(str(tmp_path_factory.mktemp("embed-server")), "bert", "MEAN")


@pytest.fixture(scope="module")
def server(model_path):
    srv = RemoteServer(["--model", model_path, "--served-model-name", "tiny-embed",
                        "--dtype", "float32", "--kv-cache-memory-bytes", str(32 << 20),
                        "--hf-overrides", '{"is_matryoshka": true}'],
                       startup_timeout_s=180)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def reference(model_path):
    from vllm import LLM
    llm = LLM(model=model_path, dtype="float32")
    return {t: o.outputs.embedding for t, o in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False))}


def test_openai_client_embeddings(server, http, reference):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    # The client asks for base64 by default and decodes it itself.
    resp = client.embeddings.create(model="tiny-embed", input=TEXTS)
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
    for text, d in zip(TEXTS, resp.data):
        np.testing.assert_allclose(d.embedding, reference[text], atol=1e-6)
    floats = client.embeddings.create(model="tiny-embed", input=TEXTS[0],
                                      encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, reference[TEXTS[0]], atol=1e-6)
    cut = client.embeddings.create(model="tiny-embed", input=TEXTS[0], dimensions=16)
    full = torch.tensor(reference[TEXTS[0]])
    assert len(cut.data[0].embedding) == 16
    # Matryoshka: the first 16 dimensions of the unnormalized vector, normalized.
    raw = http.post("/pooling", json={"model": "tiny-embed", "input": TEXTS[0],
                                      "use_activation": False}).json()
    head = torch.tensor(raw["data"][0]["data"][:16])
    np.testing.assert_allclose(cut.data[0].embedding, (head / head.norm()).tolist(),
                               atol=1e-5)
    assert abs(float(full.norm()) - 1) < 1e-5


def test_base64_and_token_inputs(http, reference):
    body = {"model": "tiny-embed", "input": TEXTS[1], "encoding_format": "base64",
            "embed_dtype": "float16", "endianness": "big"}
    data = http.post("/v1/embeddings", json=body).json()["data"][0]
    vec = np.frombuffer(base64.b64decode(data["embedding"]), dtype=">f2")
    np.testing.assert_allclose(vec, reference[TEXTS[1]], atol=2e-3)
    tok = http.post("/tokenize", json={"model": "tiny-embed", "prompt": TEXTS[2]}).json()
    ids = http.post("/v1/embeddings", json={"input": tok["tokens"]}).json()
    np.testing.assert_allclose(ids["data"][0]["embedding"], reference[TEXTS[2]], atol=1e-6)


def test_errors_are_openai_shaped(http):
    cases = [({"input": TEXTS[0], "dimensions": 65}, "dimensions"),
             ({"input": "cat " * 400}, "maximum context length"),
             ({"input": []}, "input"),
             ({"input": TEXTS[0], "model": "nope"}, "does not exist")]
    for body, needle in cases:
        r = http.post("/v1/embeddings", json=body)
        assert 400 <= r.status_code < 500, (body, r.text)
        assert needle in r.json()["error"]["message"], r.text
    r = http.post("/classify", json={"input": TEXTS[0]})
    assert r.status_code == 400 and "Classification API" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400 and "pooling model" in r.json()["error"]["message"]


def test_inputs_per_request_are_bounded(http):
    """VLLM_MAX_COMPLETION_PROMPTS (1024) bounds a request's inputs, each one engine
    request: a 400 naming the field and the limit, before anything is tokenized."""
    many = ["cat"] * 1025
    cases = [("/v1/embeddings", {"input": many}, "input"),
             ("/pooling", {"input": many}, "input"),
             ("/v1/score", {"text_1": "cat", "text_2": many}, "text_2"),
             ("/score", {"queries": many, "documents": many}, "documents"),
             ("/rerank", {"query": "cat", "documents": many}, "documents")]
    for path, body, param in cases:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == param, (path, error)
        assert "1025" in error["message"] and "at most 1024" in error["message"], error
        assert "VLLM_MAX_COMPLETION_PROMPTS" in error["message"]


def test_bi_encoder_score_and_rerank(http, reference):
    r = http.post("/v1/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    expected = [float(torch.nn.functional.cosine_similarity(
        torch.tensor(reference[TEXTS[0]]), torch.tensor(reference[t]), dim=0))
        for t in TEXTS[1:]]
    np.testing.assert_allclose([d["score"] for d in r["data"]], expected, atol=1e-5)
    rr = http.post("/v2/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:],
                                       "top_n": 1}).json()
    assert len(rr["results"]) == 1
    assert rr["results"][0]["index"] == int(np.argmax(expected))
    assert rr["results"][0]["document"]["text"] == TEXTS[1 + int(np.argmax(expected))]


def test_hosting_routes(http, reference):
    assert http.get("/ping").status_code == 200
    assert http.post("/ping").status_code == 200
    assert http.get("/load").json() == {"server_load": 0}
    inv = http.post("/invocations", json={"input": TEXTS[0], "encoding_format": "float"})
    assert inv.status_code == 200, inv.text
    np.testing.assert_allclose(inv.json()["data"][0]["embedding"], reference[TEXTS[0]],
                               atol=1e-6)
    score = http.post("/invocations", json={"text_1": TEXTS[0], "text_2": TEXTS[1]}).json()
    assert score["data"][0]["object"] == "score"
    bad = http.post("/invocations", json={"foo": 1})
    assert bad.status_code == 400 and "suitable handler" in bad.json()["error"]["message"]
    assert http.get("/server_info").status_code == 404  # dev mode only


def test_chat_form_embeddings(http, model_path):
    """`messages` (or messages as `input`) are rendered with the chat template, then
    embedded like the rendered text (no special tokens added, as vLLM's chat form)."""
    from transformers import AutoTokenizer
    from vllm import LLM
    messages = [{"role": "user", "content": "the cat sat"}]
    tok = AutoTokenizer.from_pretrained(model_path)
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ref = LLM(model=model_path, dtype="float32").embed({"prompt_token_ids": ids},
                                                        use_tqdm=False)[0].outputs.embedding
    for body in ({"messages": messages}, {"input": messages}):
        r = http.post("/v1/embeddings", json={**body, "encoding_format": "float"})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref, atol=1e-6)
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
    r = http.post("/v1/embeddings", json={"model": "tiny-embed"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_truncation_keeps_cls_and_sep(http, model_path):
    """truncate_prompt_tokens cuts the text's tokens, not [CLS] / [SEP], and keeps the
    beginning by default: what the tokenizer's own truncation gives (the offline
    tokenization_kwargs path), as in vLLM."""
    from transformers import AutoTokenizer

    from vllm import LLM
    tok = AutoTokenizer.from_pretrained(model_path)
    text = TEXTS[0]
    for keep, side in ((4, None), (5, "left")):
        body = {"model": "tiny-embed", "input": text, "truncate_prompt_tokens": keep,
                "encoding_format": "float"}
        if side:
            body["truncation_side"] = side
        r = http.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == keep
        tok.truncation_side = side or "right"
        ids = tok(text, truncation=True, max_length=keep)["input_ids"]
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        llm = LLM(model=model_path, dtype="float32")
        want = llm.embed([{"prompt_token_ids": ids}], use_tqdm=False)[0].outputs.embedding
        del llm
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], want, atol=1e-6)

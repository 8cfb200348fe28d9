"""Score and rerank over HTTP with a tiny BERT cross-encoder (one label): scores equal
the Hugging Face classifier's (sigmoid of its logits), rerank orders documents by them."""
from __future__ import annotations

import httpx
import pytest
import torch

from tests.entrypoints.conftest import RemoteServer
from tests.pooling._pooling_models import make_tiny_encoder

QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the cat sat on the mat", "berlin germany",
        "the sun is hot"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return make_tiny_encoder(str(tmp_path_factory.mktemp("rerank-server")), "bert-cls")


@pytest.fixture(scope="module")
def http(model_path):
    srv = RemoteServer(["--model", model_path, "--served-model-name", "tiny-rerank",
                        "--dtype", "float32", "--kv-cache-memory-bytes", str(32 << 20)],
                       startup_timeout_s=180)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
    srv.stop()


@pytest.fixture(scope="module")
def hf_logits(model_path) -> torch.Tensor:
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    model = transformers.BertForSequenceClassification.from_pretrained(
        model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(**tok([QUERY] * len(DOCS), DOCS, return_tensors="pt",
                           padding=True)).logits[:, 0]


def test_score_routes_equal_cross_encoder(http, hf_logits):
    expected = torch.sigmoid(hf_logits)
    for path in ("/score", "/v1/score"):
        r = http.post(path, json={"model": "tiny-rerank", "text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
        got = torch.tensor([d["score"] for d in body["data"]])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    raw = http.post("/score", json={"queries": [QUERY] * len(DOCS), "documents": DOCS,
                                    "use_activation": False}).json()
    torch.testing.assert_close(torch.tensor([d["score"] for d in raw["data"]]), hf_logits,
                               atol=1e-5, rtol=1e-4)


def test_rerank_orders_documents_by_score(http, hf_logits):
    order = torch.argsort(hf_logits, descending=True).tolist()
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = http.post(path, json={"query": QUERY, "documents": DOCS}).json()
        assert [r["index"] for r in body["results"]] == order
        scores = [r["relevance_score"] for r in body["results"]]
        assert scores == sorted(scores, reverse=True)
        assert body["results"][0]["document"]["text"] == DOCS[order[0]]
    top = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == order[:2]


def test_classify_and_refusals(http, hf_logits):
    body = http.post("/classify", json={"input": ["the sun is hot"]}).json()
    assert body["data"][0]["num_classes"] == 1 and 0 < body["data"][0]["probs"][0] < 1
    for path, payload, needle in [
            ("/v1/embeddings", {"input": "a"}, "Embeddings API"),
            ("/score", {"text_1": QUERY}, "text_2"),
            ("/rerank", {"query": QUERY, "documents": []}, "documents"),
            ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n")]:
        r = http.post(path, json=payload)
        assert r.status_code == 400, (path, r.text)
        assert needle in r.text

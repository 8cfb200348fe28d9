"""use_beam_search / length_penalty on /v1/completions (official openai client), against
transformers' beam search on the same tiny model."""
from __future__ import annotations

import signal

import pytest
import torch

from tests.engine.conftest import PROMPTS
from tests.engine.test_beam_search import NEW, WIDTH, hf_beams
from tests.entrypoints.conftest import RemoteServer


@pytest.fixture(scope="module")
def served(tiny_model_factory):
    path = tiny_model_factory("qwen2")
    srv = RemoteServer(["--model", path, "--dtype", "float32", "--max-model-len", "256",
                        "--max-num-seqs", "16", "--kv-cache-memory-bytes", str(16 << 20),
                        "--disable-log-requests"])
    yield srv, path
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.fixture(scope="module")
def hf(served):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = served[1]
    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(path))


@pytest.mark.parametrize("stream", [False, True])
def test_completions_beam_search_matches_transformers(served, hf, stream):
    import openai
    srv, _ = served
    model, tok = hf
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    prompts = PROMPTS[:2]
    extra = {"use_beam_search": True, "ignore_eos": True}
    kwargs = dict(model=client.models.list().data[0].id, prompt=prompts, n=WIDTH,
                  max_tokens=NEW, temperature=0, extra_body=extra)
    if stream:
        texts: dict[int, str] = {}
        for chunk in client.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        choices = [(i, texts[i], None) for i in sorted(texts)]
    else:
        resp = client.completions.create(**kwargs)
        choices = [(c.index, c.text, c.finish_reason) for c in resp.choices]
        assert resp.usage.completion_tokens == len(prompts) * WIDTH * NEW
    assert [i for i, _, _ in choices] == list(range(len(prompts) * WIDTH))
    for p, prompt in enumerate(prompts):
        ref_seqs, _ = hf_beams(model, tok.encode(prompt), eos=None)
        ours = [text for i, text, _ in choices[p * WIDTH:(p + 1) * WIDTH]]
        assert ours == [tok.decode(s, skip_special_tokens=True) for s in ref_seqs]
        assert all(f in (None, "length") for _, _, f in choices)


def test_beam_search_refusals(served):
    import httpx
    srv, _ = served
    url = srv.url + "/v1/completions"
    for body, param in (({"use_beam_search": True, "logprobs": 2}, "logprobs"),
                        ({"use_beam_search": True, "stop": ["x"]}, "stop"),
                        ({"length_penalty": 0.5}, "length_penalty")):
        r = httpx.post(url, json={"prompt": "Hi", "max_tokens": 2, **body}, timeout=30)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "Hi"}],
                         "use_beam_search": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search"
    ok = httpx.post(url, json={"prompt": "Hi", "max_tokens": 3, "n": 2, "use_beam_search": True,
                               "length_penalty": 0.5}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2

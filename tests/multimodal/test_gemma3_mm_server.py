"""Gemma 3 with images through the OpenAI chat API (official client): base64 images give
transformers' greedy tokens (image tokens attended both ways), and bad image input is a
400 naming what is wrong while the server keeps serving."""
from __future__ import annotations

import signal

import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.multimodal.conftest import random_image
from tests.multimodal.test_gemma3_mm import BOI, _hf_greedy, make_tiny_gemma3
from tests.multimodal.test_qwen2_5_vl_server import _data_url


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_gemma3(str(tmp_path_factory.mktemp("tiny-gemma3-server")))


@pytest.fixture(scope="module")
def client(tiny):
    import openai
    srv = RemoteServer(["--model", tiny, "--dtype", "float32", "--max-model-len", "512",
                        "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(16 << 20),
                        "--limit-mm-per-prompt", '{"image": 2}', "--disable-log-requests"])
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def _chat(client, parts, max_tokens=6):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=max_tokens, temperature=0.0,
        messages=[{"role": "user", "content": parts}],
        extra_body={"ignore_eos": True, "return_token_ids": True})


def test_images_in_chat_match_transformers(client, tiny):
    import transformers
    specs = [(61, 40, 24), (62, 16, 48)]
    images = [random_image(*s) for s in specs]
    parts = [{"type": "image_url", "image_url": {"url": _data_url(im)}} for im in images]
    out = _chat(client, parts + [{"type": "text", "text": "Same?"}])
    prompt = transformers.AutoTokenizer.from_pretrained(tiny).apply_chat_template(
        [{"role": "user", "content": f"{BOI}\n{BOI}\nSame?"}], tokenize=False,
        add_generation_prompt=True)
    import torch
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        tiny, dtype=torch.float32).eval()
    assert out.choices[0].token_ids == _hf_greedy(hf, tiny, prompt, specs, n=6)


def test_bad_image_input_is_a_400_and_the_server_goes_on(client):
    import openai
    image = {"type": "image_url", "image_url": {"url": _data_url(random_image(63, 8, 8))}}
    with pytest.raises(openai.BadRequestError, match="image"):
        _chat(client, [image, image, image, {"type": "text", "text": "three"}])
    with pytest.raises(openai.BadRequestError):
        _chat(client, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,xx"}}])
    assert _chat(client, [{"type": "text", "text": "hello"}]).choices[0].message.content

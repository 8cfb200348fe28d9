"""Qwen2.5-VL through the OpenAI chat API (official client): base64 images of
different sizes give transformers' greedy tokens, a repeated image hits the prefix
cache, a bad image is a 400 and the server keeps serving."""
from __future__ import annotations

import base64
import io
import signal

import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.multimodal.conftest import QWEN_VL_IMAGE, qwen_vl_hf_greedy, random_image


def _data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def client(tiny_qwen2_5_vl):
    import openai
    srv = RemoteServer(["--model", tiny_qwen2_5_vl, "--dtype", "float32",
                        "--max-model-len", "512", "--max-num-seqs", "8",
                        "--kv-cache-memory-bytes", str(16 << 20),
                        "--limit-mm-per-prompt", '{"image": 2}',
                        "--enable-prompt-tokens-details", "--disable-log-requests"])
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


def _chat(client, parts, max_tokens=6):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=max_tokens, temperature=0.0,
        messages=[{"role": "user", "content": parts}],
        extra_body={"ignore_eos": True, "return_token_ids": True})


def test_base64_images_match_transformers(client, tiny_qwen2_5_vl):
    from transformers import AutoTokenizer
    images = [random_image(51, 56, 40), random_image(52, 24, 64)]
    parts = [{"type": "image_url", "image_url": {"url": _data_url(im)}} for im in images]
    out = _chat(client, parts + [{"type": "text", "text": "What differs?"}])
    prompt = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl).apply_chat_template(
        [{"role": "user", "content": f"{QWEN_VL_IMAGE}\n{QWEN_VL_IMAGE}\nWhat differs?"}],
        tokenize=False, add_generation_prompt=True)
    assert out.choices[0].token_ids == qwen_vl_hf_greedy(tiny_qwen2_5_vl, prompt, images, 6)


def test_repeated_image_hits_the_prefix_cache(client, tiny_qwen2_5_vl):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl)
    ids = tok(tok.apply_chat_template([{"role": "user", "content": QWEN_VL_IMAGE}],
                                      tokenize=False, add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]
    image_start = ids.index(tok.convert_tokens_to_ids("<|vision_start|>"))
    image = {"type": "image_url", "image_url": {"url": _data_url(random_image(53, 48, 48))}}
    parts = [image, {"type": "text", "text": "Describe this picture in great detail, please."}]
    first = _chat(client, parts, max_tokens=2)
    assert first.usage.prompt_tokens > 36  # the image expanded into its 36 tokens
    again = _chat(client, parts, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 32
    assert again.choices[0].token_ids == first.choices[0].token_ids
    other = {"type": "image_url", "image_url": {"url": _data_url(random_image(54, 48, 48))}}
    fresh = _chat(client, [other] + parts[1:], max_tokens=2)
    cached = fresh.usage.prompt_tokens_details
    # Another image: only the full blocks of the chat template before it are reused.
    assert (cached.cached_tokens if cached else 0) <= image_start // 16 * 16


def test_bad_image_is_400_and_the_server_keeps_serving(client):
    import openai
    with pytest.raises(openai.BadRequestError, match="Malformed data URL"):
        _chat(client, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}},
                       {"type": "text", "text": "hi"}])
    ok = _chat(client, [{"type": "image_url", "image_url": {
        "url": _data_url(random_image(55, 16, 16))}}, {"type": "text", "text": "hi"}])
    assert len(ok.choices[0].token_ids) == 6

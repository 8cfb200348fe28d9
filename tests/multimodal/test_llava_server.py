"""Images through the OpenAI chat API (official client) on a tiny LLaVA server (engine
core in its own process): base64 data URLs, http URLs from a loopback server, file://
under --allowed-local-media-path; prefix-cache reuse; every bad input is a 400 and the
server keeps serving."""
from __future__ import annotations

import base64
import functools
import http.server
import io
import signal
import threading

import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.multimodal.conftest import hf_greedy, random_image

MAX_BYTES = 100_000


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A directory of images, served over loopback HTTP; (dir, base URL)."""
    root = tmp_path_factory.mktemp("media")
    (root / "red.png").write_bytes(_png(random_image(31, 48, 40)))
    (root / "blue.png").write_bytes(_png(random_image(32, 32, 64)))
    (root / "big.png").write_bytes(_png(random_image(33, 256, 256)))  # > MAX_BYTES
    (root / "notes.txt").write_bytes(b"not an image")
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tiny_llava, media):
    root, _ = media
    srv = RemoteServer(["--model", tiny_llava, "--dtype", "float32", "--max-model-len", "512",
                        "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(16 << 20),
                        "--limit-mm-per-prompt", '{"image": 2}',
                        "--allowed-local-media-path", str(root / "allowed"),
                        "--enable-prompt-tokens-details", "--disable-log-requests"],
                       env={"VLLM_MEDIA_MAX_BYTES": str(MAX_BYTES),
                            "VLLM_IMAGE_FETCH_TIMEOUT": "3"})
    yield srv
    assert srv.stop(signal.SIGTERM) is not None, srv.tail()


@pytest.fixture(scope="module")
def client(served):
    import openai
    return openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _chat(client, parts, max_tokens=6):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=max_tokens, temperature=0.0,
        messages=[{"role": "user", "content": parts}],
        extra_body={"ignore_eos": True, "return_token_ids": True})


def _rendered(tiny_llava, n_images: int, text: str) -> str:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_llava)
    content = "\n".join(["<image>"] * n_images + [text])
    return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)


def test_base64_and_http_images_match_transformers(client, media, tiny_llava):
    root, base = media
    red = _png(random_image(31, 48, 40))
    parts = [{"type": "image_url", "image_url": {"url": _data_url(red)}},
             {"type": "image_url", "image_url": {"url": f"{base}/blue.png"}},
             {"type": "text", "text": "What differs?"}]
    out = _chat(client, parts)
    from PIL import Image
    images = [Image.open(root / "red.png").convert("RGB"),
              Image.open(root / "blue.png").convert("RGB")]
    expected = hf_greedy(tiny_llava, "LlavaForConditionalGeneration",
                         _rendered(tiny_llava, 2, "What differs?"), images, 6)
    assert out.choices[0].token_ids == expected
    assert out.usage.prompt_tokens > 32  # both images expanded into their 16 tokens each
    import httpx
    tokenized = httpx.post(str(client.base_url).replace("/v1/", "/tokenize"), json={
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": parts}]}, timeout=60).json()
    assert tokenized["count"] == out.usage.prompt_tokens


def test_repeated_image_hits_the_prefix_cache(client, media):
    _, base = media
    parts = [{"type": "image_url", "image_url": {"url": f"{base}/red.png"}},
             {"type": "text", "text": "Describe this picture in great detail, please."}]
    first = _chat(client, parts, max_tokens=2)
    again = _chat(client, parts, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=2, temperature=0.0, stream=True,
        messages=[{"role": "user", "content": parts}],
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens == first.usage.prompt_tokens  # the image's tokens counted


def _bad_cases(media):
    root, base = media
    allowed = root / "allowed"
    allowed.mkdir(exist_ok=True)
    (allowed / "ok.png").write_bytes((root / "red.png").read_bytes())
    image = {"type": "image_url", "image_url": {"url": f"{base}/red.png"}}
    return {
        "malformed data URL": ([{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,@@@not-base64"}}], "Malformed data URL"),
        "unsupported format": ([{"type": "image_url", "image_url": {
            "url": _data_url(b"GIF87a-but-not-really", "image/gif")}}], "image format"),
        "too large": ([{"type": "image_url", "image_url": {"url": f"{base}/big.png"}}],
                      "too large"),
        "too many images": ([image, image, image], "At most 2 image"),
        "file outside the allowed path": ([{"type": "image_url", "image_url": {
            "url": f"file://{root}/red.png"}}], "outside the allowed"),
        "unreachable URL": ([{"type": "image_url", "image_url": {
            "url": "http://127.0.0.1:9/none.png"}}], "Could not fetch"),
        "missing file": ([{"type": "image_url", "image_url": {"url": f"{base}/no.png"}}],
                         "HTTP 404"),
    }


def test_bad_image_inputs_are_400_and_the_server_keeps_serving(client, media):
    import openai
    for name, (parts, message) in _bad_cases(media).items():
        with pytest.raises(openai.BadRequestError) as info:
            _chat(client, parts + [{"type": "text", "text": "hi"}])
        assert message in str(info.value), (name, str(info.value))
    root, _ = media
    ok = _chat(client, [{"type": "image_url", "image_url": {
        "url": f"file://{root}/allowed/ok.png"}}, {"type": "text", "text": "hi"}])
    assert len(ok.choices[0].token_ids) == 6

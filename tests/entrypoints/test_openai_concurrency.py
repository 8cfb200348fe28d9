"""64 concurrent streams, a quarter abandoned mid-stream (plus two non-streaming requests
whose clients time out): the rest finish, and every abandoned request frees its KV blocks."""
from __future__ import annotations

import asyncio
import time

import httpx

from tests.entrypoints.conftest import API_KEY, MAX_NUM_SEQS

MAX_TOKENS = 12


def read_metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


async def one_stream(client, model: str, i: int, close_early: bool) -> dict:
    chat = i % 2 == 1
    common = dict(model=model, temperature=0.7, seed=i, stream=True,
                  stream_options={"include_usage": True},
                  extra_body={"ignore_eos": True},
                  max_tokens=200 if close_early else MAX_TOKENS)
    if chat:
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": f"Count from {i} upwards."}], **common)
    else:
        stream = await client.completions.create(prompt=f"Request {i}: once upon a time",
                                                 **common)
    text, chunks, finish, usage = "", 0, None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += (choice.delta.content or "") if chat else choice.text
        finish = choice.finish_reason or finish
        chunks += 1
        if close_early and chunks == 3:
            await stream.close()
            return {"closed": True}
    return {"closed": False, "text": text, "finish": finish, "usage": usage}


async def impatient(server, route: str, body: dict) -> str:
    """A non-streaming request whose client gives up long before it could finish."""
    async with httpx.AsyncClient(base_url=server.url, timeout=1.5,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        try:
            await c.post(route, json={**body, "max_tokens": 4000, "ignore_eos": True})
        except httpx.TimeoutException:
            return "gave up"
    return "finished"


def test_concurrent_streams_with_disconnects(server, model_name):
    import openai

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY,
                                    max_retries=0, timeout=300)
        try:
            gave_up = asyncio.gather(
                impatient(server, "/v1/completions", {"prompt": "Tell me a story."}),
                impatient(server, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "A long story?"}]}))
            streams = await asyncio.gather(*[
                one_stream(client, model_name, i, close_early=(i % 4 == 0))
                for i in range(MAX_NUM_SEQS)])
            assert await gave_up == ["gave up", "gave up"]
            return streams
        finally:
            await client.close()

    start = time.monotonic()
    results = asyncio.run(main())
    print(f"\n[concurrency] {len(results)} streams in {time.monotonic() - start:.1f} s")
    closed = [r for r in results if r["closed"]]
    done = [r for r in results if not r["closed"]]
    assert len(closed) == MAX_NUM_SEQS // 4 and len(done) == MAX_NUM_SEQS * 3 // 4
    for r in done:
        assert r["finish"] == "length" and r["text"]
        assert r["usage"].completion_tokens == MAX_TOKENS

    # Abandoned requests are aborted: nothing runs and the KV cache is empty again.
    deadline = time.monotonic() + 10
    headers = {"Authorization": f"Bearer {API_KEY}"}
    while True:
        text = httpx.get(server.url + "/metrics", headers=headers).text
        running = read_metric(text, "vllm:num_requests_running")
        usage = read_metric(text, "vllm:kv_cache_usage_perc")
        if (running, usage) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert running == 0 and usage == 0
    assert read_metric(text, "vllm:num_requests_waiting") == 0
    # The aborted ones never finished: only the completed requests count as successes.
    success = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("vllm:request_success_total{"))
    assert success >= len(done)
    assert httpx.get(server.url + "/health").status_code == 200

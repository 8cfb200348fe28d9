"""AsyncLLMEngine over a scripted engine: output kinds, aborts, crash handling, shutdown."""
from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from tests.entrypoints.fake_engine import FAKE_TEXT, FakeLLMEngine
from vllm.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError
from vllm.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def make_engine(tokenizer, **kwargs) -> tuple[FakeLLMEngine, AsyncLLMEngine]:
    fake = FakeLLMEngine(tokenizer, **kwargs)
    return fake, AsyncLLMEngine(fake, log_requests=False, log_stats=False)


def params(kind: RequestOutputKind, max_tokens: int = 6, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, n=n, temperature=1.0, output_kind=kind)


async def collect(engine: AsyncLLMEngine, request_id: str, p: SamplingParams,
                  prompt: str = "Hello") -> list:
    return [out async for out in engine.generate(prompt, p, request_id)]


def expected_text(tokenizer, n_tokens: int) -> str:
    script = tokenizer.encode(FAKE_TEXT, add_special_tokens=False)
    return tokenizer.decode(script[:n_tokens])


def test_output_kinds(tokenizer):
    fake, engine = make_engine(tokenizer)

    async def main():
        delta = await collect(engine, "d", params(RequestOutputKind.DELTA))
        cumulative = await collect(engine, "c", params(RequestOutputKind.CUMULATIVE))
        final = await collect(engine, "f", params(RequestOutputKind.FINAL_ONLY))
        return delta, cumulative, final

    try:
        delta, cumulative, final = asyncio.run(main())
    finally:
        engine.shutdown()
    want = expected_text(tokenizer, 6)
    assert "".join(o.outputs[0].text for o in delta) == want
    assert sum(len(o.outputs[0].token_ids) for o in delta) == 6
    lengths = [len(o.outputs[0].token_ids) for o in cumulative]
    assert lengths == sorted(lengths) and lengths[-1] == 6
    assert cumulative[-1].outputs[0].text == want and cumulative[-1].finished
    assert len(final) == 1 and final[0].finished and final[0].outputs[0].text == want
    assert final[0].outputs[0].finish_reason == "length"
    # The engine ran in the loop thread, not on the event loop's thread.
    assert fake.step_thread is not threading.main_thread()


def test_n_completions_and_metrics(tokenizer):
    fake, engine = make_engine(tokenizer)

    async def main():
        return await collect(engine, "n", params(RequestOutputKind.FINAL_ONLY, 4, n=3))

    try:
        (out,) = asyncio.run(main())
    finally:
        engine.shutdown()
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 4 for c in out.outputs)
    reg = engine.stats.registry
    labels = {"model_name": "fake-model", "engine": "0"}
    assert reg.get_sample_value("vllm:generation_tokens_total", labels) == 12
    # vLLM counts the n completions as n (child) requests.
    assert reg.get_sample_value("vllm:prompt_tokens_total", labels) == \
        3 * len(out.prompt_token_ids)
    assert reg.get_sample_value("vllm:request_success_total",
                                {**labels, "finished_reason": "length"}) == 3
    assert reg.get_sample_value("vllm:e2e_request_latency_seconds_count", labels) == 3
    assert reg.get_sample_value("vllm:request_params_n_count", labels) == 1


def test_metrics_report_the_resolved_max_tokens(tokenizer):
    """An unset max_tokens ("as many as fit") is reported as what the engine resolved
    it to (Request.max_tokens), not as the client's None."""
    fake, engine = make_engine(tokenizer, max_model_len=32)

    async def main():
        p = SamplingParams.from_client(max_tokens=None, output_kind=RequestOutputKind.FINAL_ONLY)
        return await collect(engine, "fill", p, prompt={"prompt_token_ids": [5] * 20})

    try:
        (out,) = asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(out.outputs[0].token_ids) == 12
    labels = {"model_name": "fake-model", "engine": "0"}
    reg = engine.stats.registry
    assert reg.get_sample_value("vllm:request_params_max_tokens_sum", labels) == 12
    assert reg.get_sample_value("vllm:request_params_max_tokens_count", labels) == 1


def test_closing_the_stream_aborts(tokenizer):
    fake, engine = make_engine(tokenizer, step_delay_s=0.01)

    async def main():
        gen = engine.generate("Hello", params(RequestOutputKind.DELTA, 200), "early")
        await gen.__anext__()
        await gen.aclose()
        for _ in range(100):
            if not fake.requests:
                break
            await asyncio.sleep(0.01)
        steps = fake.steps
        await asyncio.sleep(0.2)  # idle: the loop sleeps, it does not spin
        return steps

    try:
        steps_when_idle = asyncio.run(main())
    finally:
        engine.shutdown()
    assert fake.aborted == ["early"] and not fake.requests
    assert fake.steps == steps_when_idle
    labels = {"model_name": "fake-model", "engine": "0"}
    assert engine.stats.registry.get_sample_value("vllm:num_requests_running", labels) == 0


def test_public_abort_ends_stream_with_abort_reason(tokenizer):
    fake, engine = make_engine(tokenizer, step_delay_s=0.01)

    async def main():
        outs = []
        async for out in engine.generate("Hi", params(RequestOutputKind.CUMULATIVE, 500), "a"):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("a")
        return outs

    try:
        outs = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        engine.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert fake.aborted == ["a"]


def test_invalid_request_and_duplicate_id(tokenizer):
    fake, engine = make_engine(tokenizer, max_model_len=16, step_delay_s=0.01)

    async def main():
        with pytest.raises(ValueError, match="maximum model length"):
            await engine.add_request("long", "word " * 40, params(RequestOutputKind.DELTA))
        stream = await engine.add_request("dup", "Hi", params(RequestOutputKind.DELTA, 10))
        with pytest.raises(ValueError, match="already in use"):
            await engine.add_request("dup", "Hi", params(RequestOutputKind.DELTA))
        outs = [o async for o in engine.iterate(stream)]
        return outs

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert outs[-1].finished


def test_engine_crash_fails_streams_and_new_requests(tokenizer):
    fake, engine = make_engine(tokenizer, step_delay_s=0.01)
    fake.fail_after_steps = 3

    async def main():
        received = []
        with pytest.raises(EngineDeadError, match="injected engine failure"):
            async for out in engine.generate("Hi", params(RequestOutputKind.DELTA, 50), "x"):
                received.append(out)
        assert engine.errored and not engine.is_running
        with pytest.raises(EngineDeadError):
            await engine.check_health()
        with pytest.raises(EngineDeadError):
            await engine.add_request("y", "Hi", params(RequestOutputKind.DELTA))
        return received

    try:
        received = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        engine.shutdown()
    # Three steps ran before the crash; a lagging consumer may get them merged.
    assert sum(len(o.outputs[0].token_ids) for o in received) == 3


def test_engine_death_messages_end_each_sentence_once(tokenizer):
    """The dead engine's message quotes the cause as a sentence, then adds its own: a
    cause that ends with a period (the core's "(killed by SIGKILL).") gets no second."""
    cause = "The engine core process (pid 1) exited unexpectedly (killed by SIGKILL)."

    class DyingEngine(FakeLLMEngine):
        def step(self):
            raise RuntimeError(cause)

    class UnhealthyEngine(FakeLLMEngine):
        def check_health(self):
            raise RuntimeError(cause.rstrip("."))  # no period: one is added

    async def run(engine_cls, make_dead):
        engine = AsyncLLMEngine(engine_cls(tokenizer), log_requests=False, log_stats=False)
        try:
            with pytest.raises(EngineDeadError) as info:
                await make_dead(engine)
            return str(info.value)
        finally:
            engine.shutdown()

    async def generate(engine):
        async for _ in engine.generate("Hi", params(RequestOutputKind.DELTA), "x"):
            pass

    from_loop = asyncio.run(asyncio.wait_for(run(DyingEngine, generate), 10))
    from_check = asyncio.run(asyncio.wait_for(
        run(UnhealthyEngine, lambda engine: engine.check_health()), 10))
    for message in (from_loop, from_check):
        assert "(killed by SIGKILL). It cannot serve more requests" in message, message
        assert ".." not in message, message


def test_shutdown_stops_thread_and_ends_streams(tokenizer):
    fake, engine = make_engine(tokenizer, step_delay_s=0.01)

    async def main():
        gen = engine.generate("Hi", params(RequestOutputKind.DELTA, 1000), "s")
        await gen.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        with pytest.raises(EngineDeadError, match="shutting down"):
            async for _ in gen:
                pass

    asyncio.run(asyncio.wait_for(main(), 10))
    assert fake.shutdown_called and not engine.is_running
    assert engine._thread is not None and not engine._thread.is_alive()


# ------------------------------------------------------------- app level
def build_fake_app(engine: AsyncLLMEngine, **overrides):
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser().parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return build_app(args, engine)


def test_dead_engine_gives_503_and_stream_error_event(tokenizer):
    fake, engine = make_engine(tokenizer, step_delay_s=0.01)
    app = build_fake_app(engine)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/health")).status_code == 200
            fake.fail_after_steps = fake.steps + 2
            stream = await client.post("/v1/completions", json={
                "prompt": "Hi", "max_tokens": 50, "stream": True})
            health = await client.get("/health")
            after = await client.post("/v1/completions", json={"prompt": "Hi"})
            return stream, health, after

    try:
        stream, health, after = asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.shutdown()
    events = [line[len("data: "):] for line in stream.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and "injected engine failure" in error["message"]
    assert health.status_code == 503
    assert after.status_code == 503 and after.json()["error"]["code"] == 503

"""A quantized checkpoint served with an fp8 KV cache (`--kv-cache-dtype fp8`): the
official openai client gets the same greedy tokens as transformers on the dequantized
weights attending to fp8 quantize-dequantized K/V (scale 1.0: the checkpoint has none);
/v1/models lists the model."""
from __future__ import annotations

import signal

import pytest

from tests.entrypoints.conftest import RemoteServer
from tests.quantization._ckpt import reference_greedy
from tests.quantization._int_pack import write_gptq


@pytest.fixture(scope="module")
def gptq_dir(tmp_path_factory) -> str:
    from tests.conftest import make_tiny_model
    root = tmp_path_factory.mktemp("served")
    float_dir = make_tiny_model(str(root / "float"), "llama", hidden_size=128,
                                intermediate_size=256)
    return write_gptq(float_dir, str(root / "gptq"), 4, 32, True, True)


def test_served_gptq_answers_openai_client(gptq_dir):
    import openai
    import torch
    import transformers
    srv = RemoteServer(["--model", gptq_dir, "--dtype", "float32", "--max-model-len", "256",
                        "--kv-cache-memory-bytes", str(32 << 20), "--kv-cache-dtype", "fp8"])
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                               timeout=120)
        assert [m.id for m in client.models.list().data] == [gptq_dir]
        prompt = "The capital of France is"
        out = client.completions.create(model=gptq_dir, prompt=prompt, max_tokens=8,
                                        temperature=0, logprobs=1)
        tok = transformers.AutoTokenizer.from_pretrained(gptq_dir)
        ref = transformers.AutoModelForCausalLM.from_pretrained(gptq_dir + "-deq",
                                                                dtype=torch.float32).eval()
        from benchmarks.quantize_checkpoint import attach_fp8_kv
        attach_fp8_kv(ref)
        expected = tok.decode(reference_greedy(ref, tok.encode(prompt), 8))
        assert out.choices[0].text == expected
    finally:
        assert srv.stop(signal.SIGTERM) is not None

"""`--runner pooling` on the Transformers modeling backend: an OLMo 2 decoder (no native
class) as an embedding model gives transformers' last-token hidden state, normalized,
for prompts of different lengths in one batch."""
from __future__ import annotations

import torch


def test_backend_decoder_embeddings_match_transformers(tiny_model_factory):
    import transformers
    from vllm import LLM
    path = tiny_model_factory("olmo2")
    prompts = ["The capital of France is", "hello", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10"]
    llm = LLM(path, dtype="float32", max_model_len=128, runner="pooling",
              kv_cache_memory_bytes=16 << 20)
    try:
        model = llm.llm_engine.engine_core.executor.worker.model_runner.model
        assert "Transformers" in type(model).__mro__[1].__name__
        outs = llm.embed(prompts, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    hf = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            last = hf(**tok(prompt, return_tensors="pt")).last_hidden_state[0, -1]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   torch.nn.functional.normalize(last, dim=-1),
                                   atol=1e-4, rtol=1e-4)

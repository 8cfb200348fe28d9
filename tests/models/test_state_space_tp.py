"""Tensor parallelism of the Mamba2 mixer (heads, conv channels and B/C groups split
over 2 gloo ranks, out_proj all-reduced; one group: the gated norm's sum all-reduced):
prompt logits of Mamba2 (2 groups and 1 group), the Granite 4 hybrid and Nemotron-H at
TP=2 equal the one-process logits."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests.models._model_helpers import full_prompt_logits, make_vllm_config, prompt_ids
from tests.models.test_mamba2 import mamba2_path  # noqa: F401 (fixture)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, init_method: str, cases: list, out_dir: str) -> None:
    torch.set_num_threads(1)
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  init_distributed_environment, initialize_model_parallel)
    from vllm.model_executor.model_loader import get_model
    init_distributed_environment(world, rank, init_method, rank, "gloo")
    try:
        for name, path, ids in cases:
            initialize_model_parallel(world, 1)
            model = get_model(make_vllm_config(path, tp=world))
            torch.save(full_prompt_logits(model, ids), os.path.join(out_dir, f"{name}-{rank}.pt"))
            destroy_model_parallel()
    finally:
        destroy_distributed_environment()


@pytest.mark.timeout(300)
def test_state_space_tp2_matches_one_process(tmp_path):
    from tests.models.test_granitemoehybrid import _save as save_granite
    from tests.models.test_mamba2 import MAMBA2
    from tests.models.test_nemotron_h import save_nemotron_h
    import transformers
    from tests.models._tiny_families import _save_tokenizer

    def save_mamba2(directory, **overrides):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.Mamba2Config(**{**MAMBA2, **overrides}), dtype=torch.float32)
        model.save_pretrained(directory, safe_serialization=True)
        _save_tokenizer(directory)
        return directory

    ids = prompt_ids(24)
    cases = [("mamba2-2groups", save_mamba2(str(tmp_path / "m2"))),
             ("mamba2-1group", save_mamba2(str(tmp_path / "m1"), n_groups=1)),
             ("granite-hybrid", save_granite(str(tmp_path / "gh"))),
             ("nemotron-h", save_nemotron_h(str(tmp_path / "nh")))]
    from vllm.model_executor.model_loader import get_model
    expected = {name: full_prompt_logits(get_model(make_vllm_config(path)), ids)
                for name, path in cases}
    mp.spawn(_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                            [(n, p, ids) for n, p in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _ in cases:
        for rank in range(2):
            logits = torch.load(tmp_path / f"{name}-{rank}.pt")
            torch.testing.assert_close(logits, expected[name], atol=1e-4, rtol=1e-4)


@pytest.mark.timeout(300)
def test_state_space_engine_tp2_greedy_equals_tp1(tmp_path, mamba2_path):
    """The engine with 2 worker processes: each rank keeps its heads' states in its own
    slots (same slot per request on both: the same scheduler output), chunked prefill."""
    from tests.models.test_granitemoehybrid import _save as save_granite
    from tests.models.test_mamba2 import PROMPTS, _run
    from vllm import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for path in (mamba2_path, save_granite(str(tmp_path / "gh"))):
        expected = [r[0] for r in _run(path)[0]]
        llm = LLM(model=path, dtype="float32", block_size=16, max_model_len=256,
                  max_num_seqs=4, max_num_batched_tokens=16, tensor_parallel_size=2,
                  distributed_executor_backend="mp", kv_cache_memory_bytes=8 << 20)
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                use_tqdm=False)
            assert [list(o.outputs[0].token_ids) for o in outs] == expected
        finally:
            llm.llm_engine.shutdown()

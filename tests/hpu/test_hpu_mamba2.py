"""State-space models on the fake HPU: Mamba2, the Granite 4 hybrid, Nemotron-H, Jamba
(Mamba1), Falcon-H1 and Qwen3-Next (Gated DeltaNet) give CPU's greedy tokens with 0
compiles after warmup (bucketed passes read and write the state slots by a [B] slot
tensor, padding entries on the pad slot), also with 16-token prompt chunks that carry
the states across passes."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, release, runner_of
from tests.hpu.test_hpu_models import GREEDY
from tests.models.test_granitemoehybrid import _save
from tests.models.test_mamba2 import PROMPTS, mamba2_path  # noqa: F401 (fixture)
from tests.models.test_falcon_h1 import save_falcon_h1
from tests.models.test_jamba import save_jamba
from tests.models.test_nemotron_h import save_nemotron_h
from tests.models.test_qwen3_next import save_qwen3_5, save_qwen3_next

BUCKETS = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
           "VLLM_PROMPT_SEQ_BUCKET_MAX": "64", "VLLM_DECODE_BS_BUCKET_MAX": "4"}


def _generate(path: str, **kwargs):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=16 << 20,
                   max_model_len=128, max_num_seqs=4, **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY,
                            use_tqdm=False)
        compiles = getattr(runner_of(llm), "num_compiles_after_warmup", None)
    finally:
        release(llm)
    return [list(o.outputs[0].token_ids) for o in outs], compiles


@pytest.mark.parametrize("model", ["mamba2", "granite_hybrid", "nemotron_h",
                                   "jamba", "falcon_h1", "qwen3_next", "qwen3_5_moe"])
def test_fake_hpu_state_space_equals_cpu_without_compiles(model, tmp_path, request):
    if model == "mamba2":
        path = request.getfixturevalue("mamba2_path")
    elif model == "granite_hybrid":
        path = _save(str(tmp_path))
    elif model == "nemotron_h":
        path = save_nemotron_h(str(tmp_path))
    elif model == "jamba":
        path = save_jamba(str(tmp_path))
    elif model == "falcon_h1":
        path = save_falcon_h1(str(tmp_path))
    elif model == "qwen3_next":
        path = save_qwen3_next(str(tmp_path))
    else:
        path = save_qwen3_5(str(tmp_path), moe=True)
    with platform_env("cpu"):
        expected, _ = _generate(path)
    with platform_env("hpu", **BUCKETS):
        got, compiles = _generate(path)
        chunked, chunked_compiles = _generate(path, max_num_batched_tokens=16)
    assert got == expected and compiles == 0
    assert chunked == expected and chunked_compiles == 0


def test_fake_hpu_torch_compile_mode_state_space_equals_cpu(tmp_path):
    """PT_HPU_LAZY_MODE=0 (regional torch.compile): the same tokens, nothing compiled
    after warmup (the mixers read the per-pass slot metadata outside traced shapes)."""
    path = _save(str(tmp_path))
    with platform_env("cpu"):
        expected, _ = _generate(path)
    with platform_env("hpu", **dict(BUCKETS, PT_HPU_LAZY_MODE="0")):
        got, compiles = _generate(path)
    assert got == expected and compiles == 0

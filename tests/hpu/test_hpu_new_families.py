"""Gemma, Falcon (new decoder architecture), GPT-NeoX (partial rotary) and GraniteMoE on
the fake HPU (bucketed shapes, the shim's rotary and mixture_of_experts ops) give the
CPU platform's greedy tokens."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release
from tests.hpu.test_hpu_models import FAST, GREEDY, LENGTHS
from tests.models._tiny_families import save_tiny
from tests.models.test_new_families import CASES

HPU_CASES = ["gemma", "falcon-new-arch", "gpt_neox", "granitemoe"]


def _generate(path: str, prompts=None):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=16 << 20,
                   max_model_len=256)
    if prompts is None:
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    release(llm)
    return prompts, [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("case", HPU_CASES)
def test_fake_hpu_tokens_equal_cpu(case, tmp_path):
    cls, fields = CASES[case]
    path = save_tiny(str(tmp_path), cls, **fields)
    with platform_env("cpu"):
        prompts, expected = _generate(path)
    with platform_env("hpu", **FAST):
        _, got = _generate(path, prompts)
    assert got == expected

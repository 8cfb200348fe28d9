"""Gemma 2/3 full-prompt logits against transformers, with windows shorter than the
prompt (the no-cache attention path: soft-cap and sliding window masks)."""
from __future__ import annotations

import pytest
import torch

from _model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from vllm.model_executor.model_loader import get_model


@pytest.mark.parametrize("arch,overrides", [
    ("gemma2", dict(sliding_window=8)),
    ("gemma3", dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"sliding_attention": {"rope_type": "default",
                                                           "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                        "rope_theta": 1000000.0}})),
], ids=["gemma2", "gemma3"])
def test_gemma_logits_match_transformers(tiny_model_factory, arch, overrides):
    path = tiny_model_factory(arch, **overrides)
    ids = prompt_ids(40)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)

"""Fixtures of the weight-update tests: two checkpoints of one tiny model."""
from __future__ import annotations

import pytest

from _wt_helpers import make_other_checkpoint


@pytest.fixture(scope="session")
def ckpt_a(tiny_model_factory) -> str:
    """4 query heads, 2 KV heads, 2 layers: splits by TP=2."""
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="session")
def ckpt_b(ckpt_a, tmp_path_factory) -> str:
    return make_other_checkpoint(ckpt_a, str(tmp_path_factory.mktemp("ckpt-b")))

"""system_fingerprint as vLLM fills it: vllm-<version>[-<parallelism>]-<hash8> by default
(--fingerprint-mode full), hash / custom / none on request; the hash follows the settings
that change outputs. Served responses carry it in tests/entrypoints/test_request_fields.py."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from vllm.entrypoints.openai.fingerprint import build_system_fingerprint
from vllm.version import __version__


def _config(tp=1, pp=1, dp=1, ep=False, dtype="bfloat16", model="m"):
    return SimpleNamespace(
        model_config=SimpleNamespace(model=model, max_model_len=512, torch_dtype=dtype),
        cache_config=SimpleNamespace(cache_dtype="auto", block_size=128),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                        data_parallel_size=dp, enable_expert_parallel=ep))


def test_modes():
    config = _config(tp=2, dp=4, ep=True)
    full = build_system_fingerprint(config)
    assert re.fullmatch(rf"vllm-{re.escape(__version__)}-tp2-dp4-ep-[0-9a-f]{{8}}", full)
    hashed = build_system_fingerprint(config, "hash")
    assert hashed == f"vllm-{__version__}-{full[-8:]}"
    assert build_system_fingerprint(config, "custom", "fp_1") == "fp_1"
    assert build_system_fingerprint(config, "none") is None
    assert build_system_fingerprint(_config()) == hashed  # no parallelism: the hash form
    with pytest.raises(ValueError, match="fingerprint-mode"):
        build_system_fingerprint(config, "short")


def test_hash_follows_what_changes_outputs():
    base = build_system_fingerprint(_config())
    assert build_system_fingerprint(_config()) == base
    assert build_system_fingerprint(_config(dtype="float32")) != base
    assert build_system_fingerprint(_config(model="other")) != base
    assert build_system_fingerprint(None, "hash") == f"vllm-{__version__}-nohash"

"""Every environment variable is parsed once, in vllm/envs.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from vllm import envs
from vllm.cpu.worker import cores_for_rank, parse_cpu_list

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ = re.compile(r"os\.getenv\(|os\.environ\.get\(|in os\.environ\b|os\.environ\[[^]]+\](?!\s*=)")
ALLOWED = {
    # Saves and restores a Ray variable it sets for the local cluster's processes.
    ("vllm/executor/ray_utils.py", "old_env = os.environ.get(var)"),
    # Forwards the VLLM_* / PT_HPU_* / HABANA_* variables as given (unparsed) to Ray workers.
    ("vllm/executor/ray_utils.py", "return {k: v for k, v in os.environ.items()"),
}


def test_no_second_parser_in_vllm():
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "vllm")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            if rel == os.path.join("vllm", "envs.py"):
                continue
            for line in open(path, encoding="utf-8"):
                if READ.search(line) and (rel, line.strip()) not in ALLOWED:
                    offenders.append(f"{rel}: {line.strip()}")
    assert not offenders, "read these through vllm/envs.py:\n" + "\n".join(offenders)


def test_fake_hpu_spellings_agree_between_platform_and_shim():
    code = ("from vllm.hpu import habana; from vllm.platforms import current_platform; "
            "print(current_platform.device_type, habana.is_fake_hpu())")
    for value, expect in (("yes", "hpu True"), ("on", "hpu True"), ("0", "cpu")):
        env = dict(os.environ, VLLM_USE_FAKE_HPU=value, PYTHONPATH=ROOT)
        env.pop("VLLM_TARGET_DEVICE", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        assert " ".join(out[-2:]).startswith(expect), (value, out)


def test_is_set(monkeypatch):
    monkeypatch.delenv("VLLM_CONTIGUOUS_PA", raising=False)
    assert not envs.is_set("VLLM_CONTIGUOUS_PA") and envs.VLLM_CONTIGUOUS_PA
    monkeypatch.setenv("VLLM_CONTIGUOUS_PA", "true")
    assert envs.is_set("VLLM_CONTIGUOUS_PA")
    with pytest.raises(AttributeError):
        envs.is_set("VLLM_NOT_A_VARIABLE")


def test_threads_bind():
    allowed = list(range(8))
    assert parse_cpu_list("0-2,5, 7") == [0, 1, 2, 5, 7]
    assert cores_for_rank("auto", allowed, 1, 2) == [4, 5, 6, 7]
    assert cores_for_rank("auto", allowed, 0, 1) is None  # one rank: left unbound
    assert cores_for_rank("auto", allowed, 0, 2, data_parallel_size=2) is None
    assert cores_for_rank("all", allowed, 0, 2) is None
    assert cores_for_rank("nobind", allowed, 0, 2) is None
    assert cores_for_rank("0-1|6,7", allowed, 1, 2) == [6, 7]
    with pytest.raises(ValueError, match="2 core lists for 3 ranks"):
        cores_for_rank("0|1", allowed, 0, 3)
    with pytest.raises(ValueError, match="not available"):
        cores_for_rank("9", allowed, 0, 1)
    with pytest.raises(ValueError, match="bad"):
        parse_cpu_list("3-1")


def test_block_size_message():
    from vllm.config import CacheConfig
    for ok in (1, 2, 4, 8, 16):
        CacheConfig(block_size=ok)
    with pytest.raises(ValueError, match="1, 2, 4 or a positive multiple of 8"):
        CacheConfig(block_size=12)

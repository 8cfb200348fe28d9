"""The CPU KV cache is committed when it is allocated, or refused with a clear error."""
from __future__ import annotations

import psutil
import pytest
import torch

from vllm.worker import kv_cache_alloc
from vllm.worker.kv_cache_alloc import zeroed_tensors

MiB = 1 << 20


def test_memory_is_committed_at_allocation_and_zeroed():
    rss = psutil.Process().memory_info().rss
    shape = (2, 4, 1024, 64)  # 2 MiB per float32 tensor
    count = 64  # 128 MiB in all
    caches = zeroed_tensors(shape, torch.float32, torch.device("cpu"), count)
    grown = psutil.Process().memory_info().rss - rss
    assert grown >= 0.95 * count * 2 * MiB, grown / MiB  # lazily mapped memory would be ~0
    assert len(caches) == count and all(c.shape == shape for c in caches)
    assert all(not c.any() for c in caches)
    caches[0].fill_(1.0)  # one layer's view never spills into the next
    assert caches[0].all() and not caches[1].any() and not caches[-1].any()


def test_cache_that_cannot_be_had_fails_fast(monkeypatch):
    monkeypatch.setattr(kv_cache_alloc, "available_memory_bytes", lambda: 64 * MiB)
    with pytest.raises(MemoryError, match=r"needs 0\.12 GiB.*--kv-cache-memory-bytes"):
        zeroed_tensors((2, 1024, 1024), torch.float32, torch.device("cpu"), 16)


def test_touch_fallback_commits_pages(monkeypatch):
    """Kernels without MADV_POPULATE_WRITE: pages are committed by touching them."""
    monkeypatch.setattr(kv_cache_alloc, "_libc", lambda: None)
    rss = psutil.Process().memory_info().rss
    caches = zeroed_tensors((1024, 1024), torch.float32, torch.device("cpu"), 16)
    assert psutil.Process().memory_info().rss - rss >= 0.95 * 64 * MiB
    assert not caches[3].any()

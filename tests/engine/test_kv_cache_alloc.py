"""The CPU KV cache is zero, committed right after it is allocated (in the background,
never changing what was written meanwhile), or refused with a clear error."""
from __future__ import annotations

import gc

import psutil
import pytest
import torch

from vllm.worker import kv_cache_alloc
from vllm.worker.kv_cache_alloc import zeroed_tensors

MiB = 1 << 20


def test_memory_is_committed_after_allocation_and_zeroed():
    # Engines of earlier tests in this process may still be in reference cycles: their
    # memory must not be given back while this test measures its own growth.
    gc.collect()
    kv_cache_alloc.wait_committed(timeout=60)
    rss = psutil.Process().memory_info().rss
    shape = (2, 4, 1024, 64)  # 2 MiB per float32 tensor
    count = 64  # 128 MiB in all
    caches = zeroed_tensors(shape, torch.float32, torch.device("cpu"), count)
    assert kv_cache_alloc.wait_committed(timeout=120)
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


def test_background_commit_keeps_what_was_written_meanwhile():
    """The engine may write the cache while its pages are being committed: populating
    faults pages in and never writes to them."""
    if not kv_cache_alloc._populate_supported():
        pytest.skip("no MADV_POPULATE_WRITE: the cache is committed before it is returned")
    caches = zeroed_tensors((1024, 1024), torch.float32, torch.device("cpu"), 64)
    for i in (0, 31, 63):
        caches[i][::7] = float(i + 1)
    assert kv_cache_alloc.wait_committed(timeout=120)
    for i in (0, 31, 63):
        assert (caches[i][::7] == i + 1).all() and not caches[i][1::7].any()
    assert not caches[5].any()


def test_background_commit_yields_to_a_stepping_engine(monkeypatch):
    """While steps run, the commit takes one slice per pause (it took a core from the
    forward's threads); once they stop it goes on at full speed and finishes."""
    if not kv_cache_alloc._populate_supported():
        pytest.skip("no MADV_POPULATE_WRITE: the cache is committed before it is returned")
    import threading
    import time
    monkeypatch.setattr(kv_cache_alloc, "_BUSY_PAUSE_S", 0.2)
    stepping = threading.Event()
    stepping.set()

    def engine():
        while stepping.is_set():
            kv_cache_alloc.note_step()
            time.sleep(0.01)

    stepper = threading.Thread(target=engine)
    stepper.start()
    try:
        caches = zeroed_tensors((16, 1 << 20), torch.uint8, torch.device("cpu"), 8)  # 128 MiB
        time.sleep(1.0)  # about 5 of its 64 slices while the engine steps
        assert not kv_cache_alloc.wait_committed(timeout=0)
    finally:
        stepping.clear()
        stepper.join()
    assert kv_cache_alloc.wait_committed(timeout=60)
    assert not any(c.any() for c in caches)

"""KV cache memory: zero-filled, committed right after start-up, with a clear error when it
cannot be had.

On CPU the cache is anonymous mmap memory: zero pages by the OS's guarantee, so no
memset is needed for its contents. Left to the OS, its pages would be committed on first
write, so a server's RSS would creep from its start-up size to its full size over hours
of load and a container limit would be hit long after start, mid-traffic (vLLM's CPU
backend commits its `torch.zeros` cache at start). So every page is populated
(MADV_POPULATE_WRITE, which faults pages in without changing their contents: about a
second per GiB on one slow core), after checking that the memory is there at all (the
machine's available memory and the cgroup limit): a cache that cannot be had fails at
start with a message saying how to shrink it.

Where the kernel has MADV_POPULATE_WRITE, the population runs on a background thread
(`commit_in_background`, nice 19, 2 MiB per call): the engine starts serving while the
pages are committed, and the RSS reaches its full size a few seconds later (one core at
the lowest priority; this saves a 4 GiB cache's 1.3 s of a server's start on 2 cores).
While the engine is stepping (`note_step`), the thread commits one slice per
`_BUSY_PAUSE_S` only: at full speed it took a core from the engine's thread team for
seconds (a 2-core Xeon's 16-request decode steps went from ~29 to ~45 ms while a 4 GiB
cache was committed), and the pages the model writes meanwhile are committed by those
writes anyway. The rest is committed at full speed once the engine is idle. The
contents are the same either way (zeros, or what the model already wrote: populating
never writes). A failure there (the memory was taken meanwhile) is logged with the same
advice. Without it, the fallback writes one byte per page and must not race the model's
writes, so it runs before the cache is handed out, as before.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import logging
import math
import mmap
import os
import threading
import time
import weakref
from typing import Optional

import torch

logger = logging.getLogger(__name__)

_GiB = float(1 << 30)
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_MAX_POPULATE_THREADS = 8
_POPULATE_CHUNK_MIN = 64 << 20
_BACKGROUND_SLICE = 2 << 20
_BUSY_WINDOW_S = 0.25
"""A step this recent means the engine is busy (the commit thread slows down)."""
_BUSY_PAUSE_S = 0.05
"""Pause before each slice while the engine is busy (~2% of a core, ~40 MiB/s)."""
_SHRINK_HINT = ("Lower the KV cache size (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE) or "
                "--max-model-len / --max-num-seqs (which bound the automatic size), or free "
                "memory.")


def zeroed_tensors(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                   count: int) -> list[torch.Tensor]:
    """`count` zero-filled tensors of `shape` (one per layer), their memory committed now.

    On CPU they share one populated anonymous mapping; elsewhere they are torch.zeros
    (device allocators commit on allocation).
    """
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    numel = math.prod(shape)
    elem = torch.tensor([], dtype=dtype).element_size()
    total = numel * elem * count
    if total == 0:
        return [torch.zeros(shape, dtype=dtype) for _ in range(count)]
    check_memory_available(total)
    buf = mmap.mmap(-1, total)
    flat = torch.frombuffer(buf, dtype=dtype, count=numel * count)
    how = "committed"
    if not commit_in_background(buf, flat.data_ptr(), total):
        populate(flat.data_ptr(), total)
    else:
        how = "being committed in the background"
    logger.info("KV cache: %.2f GiB %s (%d tensors of %s, %s).", total / _GiB, how, count,
                tuple(shape), str(dtype).replace("torch.", ""))
    return [flat[i * numel:(i + 1) * numel].view(shape) for i in range(count)]


_committing: list[threading.Thread] = []
"""Background commits still running (`wait_committed`)."""
_last_step = [float("-inf")]


def note_step() -> None:
    """The engine is stepping now: background commits slow down (see the module)."""
    _last_step[0] = time.monotonic()


def _engine_busy() -> bool:
    return time.monotonic() - _last_step[0] < _BUSY_WINDOW_S


def commit_in_background(buf: mmap.mmap, address: int, nbytes: int) -> bool:
    """Populate the pages of `buf` (mapped at `address`) on a daemon thread; False when
    this kernel cannot (the caller commits them now).

    The thread holds the mapping only while it populates one slice (a weak reference
    otherwise): a cache released meanwhile (sleep mode, shutdown) is unmapped at once
    and the thread stops, instead of committing memory nobody will use.
    """
    libc = _libc()
    if libc is None or not _populate_supported():
        return False
    mapping = weakref.ref(buf)

    def work() -> None:
        # The lowest priority: the engine's own threads (its first requests) come first.
        # One short slice per call: the kernel holds the address space's lock during a
        # call, and a step that maps memory meanwhile (a large allocation) waits for it.
        _lower_priority()
        started = time.perf_counter()
        for start in range(0, nbytes, _BACKGROUND_SLICE):
            if _engine_busy():
                time.sleep(_BUSY_PAUSE_S)
            held = mapping()
            if held is None or held.closed:
                logger.info("KV cache released before it was fully committed.")
                return
            length = min(_BACKGROUND_SLICE, nbytes - start)
            failed = libc.madvise(address + start, length, _MADV_POPULATE_WRITE) != 0
            del held
            if failed:
                code = ctypes.get_errno()
                logger.error("Could not commit the KV cache (%.2f GiB): %s. The engine runs, "
                             "but may be killed for memory under load. %s", nbytes / _GiB,
                             os.strerror(code), _SHRINK_HINT)
                return
        logger.info("KV cache: %.2f GiB committed (in the background, %.2f s).",
                    nbytes / _GiB, time.perf_counter() - started)

    thread = threading.Thread(target=work, name="vllm-kv-commit", daemon=True)
    _committing[:] = [t for t in _committing if t.is_alive()] + [thread]
    thread.start()
    return True


def _lower_priority() -> None:
    """Nice 19 for the calling thread only (Linux: a thread is a task of its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def wait_committed(timeout: Optional[float] = None) -> bool:
    """Wait for the background commits of this process; True when none is left."""
    for thread in list(_committing):
        thread.join(timeout)
    return not any(t.is_alive() for t in _committing)


@functools.lru_cache(maxsize=None)
def _populate_supported() -> bool:
    """MADV_POPULATE_WRITE works here (Linux >= 5.14): tried on one fresh page."""
    libc = _libc()
    if libc is None:
        return False
    page = mmap.mmap(-1, mmap.PAGESIZE)
    view = ctypes.c_char.from_buffer(page)
    try:
        return libc.madvise(ctypes.addressof(view), mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0
    finally:
        del view  # releases the buffer, so the mapping can close
        page.close()


def available_memory_bytes() -> int:
    """Memory this process can still commit: the machine's available memory, capped by the
    cgroup (container) limit when there is one."""
    import psutil
    available = psutil.virtual_memory().available
    room = _cgroup_room()
    return available if room is None else min(available, room)


def _cgroup_room() -> Optional[int]:
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - usage)
    return None


def check_memory_available(nbytes: int) -> None:
    available = available_memory_bytes()
    if nbytes > available:
        raise MemoryError(f"The KV cache needs {nbytes / _GiB:.2f} GiB, but only "
                          f"{available / _GiB:.2f} GiB of memory can be committed (available "
                          f"memory, container limit). {_SHRINK_HINT}")


def populate(address: int, nbytes: int) -> None:
    """Commit the pages of [address, address + nbytes) (page aligned start) now."""
    libc = _libc()
    if libc is None:
        _touch_pages(address, nbytes)
        return
    threads = max(1, min(_MAX_POPULATE_THREADS, _num_cores(), nbytes // _POPULATE_CHUNK_MIN))
    page = mmap.PAGESIZE
    chunk = -(-nbytes // threads // page) * page
    errors: list[int] = []

    def work(start: int) -> None:
        length = min(chunk, nbytes - start)
        if length > 0 and libc.madvise(address + start, length, _MADV_POPULATE_WRITE) != 0:
            errors.append(ctypes.get_errno())

    workers = [threading.Thread(target=work, args=(i * chunk,), name="vllm-kv-populate")
               for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if not errors:
        return
    if all(e == errno.EINVAL for e in errors):  # kernel without MADV_POPULATE_WRITE
        _touch_pages(address, nbytes)
        return
    code = next(e for e in errors if e != errno.EINVAL)
    raise MemoryError(f"Could not commit the KV cache ({nbytes / _GiB:.2f} GiB): "
                      f"{os.strerror(code)}. {_SHRINK_HINT}")


def _touch_pages(address: int, nbytes: int) -> None:
    """Write one zero per page (the pages are zero already: this only commits them)."""
    import numpy as np
    pages = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    pages[::mmap.PAGESIZE] = 0


def _libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def _num_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

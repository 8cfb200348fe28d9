"""OffloadingConnector, worker half: host copies of KV blocks, moved by a copy thread.

Each rank keeps, per layer, a host tensor `[parts, host_blocks * block_size, kv_heads,
head_size]` (pinned on CUDA) and copies whole blocks between it and the device cache
through the layer's `KVLayerView` (vllm/kv_transfer/kv_io.py), so one code serves the
fake and real HPU (separate K and V caches) and CUDA (head-major cache). The scheduler
half (offloading_connector.py) says which device block goes to or comes from which
host block.

Copies run on one FIFO copy thread (on CUDA, on a stream of its own, after an event
recorded on the compute stream), never on the step's own thread:

- **loads** (`start_load_kv`, before the forward): one job copies the step's loads
  layer by layer, in forward order, and signals each layer as it lands. The runner
  enters the forward with a gate (`vllm.forward_context.kv_layer_gate`): each attention
  layer waits for its own layer before it reads the cache, so layer i's copy overlaps
  the compute of the layers before it. Where the forward cannot call out (a replayed
  HPU graph) the runner waits for every layer before the pass instead, which still
  overlaps the copies with the step's input preparation. This is vLLM's
  start_load_kv / wait_for_layer_load protocol.
- **stores** (`wait_for_save`, after the forward): one job copies the step's new full
  blocks to host memory while the engine samples and schedules the next step. The
  next step's loads queue behind it; a step without loads waits for it in
  `start_load_kv`, before its forward may overwrite a block being stored.

On the fake HPU the "device" is host memory and the copy thread is a plain thread;
the protocol and the ordering are the ones a Gaudi runs.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Any, Callable, Optional

import numpy as np
import torch

from vllm.kv_transfer.offloading_connector import (BlockTransfer, OffloadingMetadata,
                                                   num_host_blocks)
from vllm.kv_transfer.metadata import KVConnectorOutput

logger = logging.getLogger(__name__)


def _slots(block_ids: list[int], block_size: int) -> np.ndarray:
    """Every slot of the blocks, in block order."""
    blocks = np.asarray(block_ids, dtype=np.int64)
    return (blocks[:, None] * block_size + np.arange(block_size, dtype=np.int64)).reshape(-1)


class _CopyThread:
    """One daemon thread running copy jobs in submission order."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kv-offload-copy", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> threading.Event:
        done = threading.Event()
        self._jobs.put((job, done))
        return done

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            try:
                job()
            finally:
                done.set()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)


class OffloadingConnectorWorker:

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        self.kv_caches: dict[str, Any] = {}
        self.host: dict[str, torch.Tensor] = {}
        """Layer name -> its host blocks."""
        self._meta: Optional[OffloadingMetadata] = None
        self._copier = _CopyThread()
        self._stream: Any = None
        self._layer_ready: dict[str, threading.Event] = {}
        """This step's load: layer name -> set once that layer's blocks are in."""
        self._last_job: Optional[threading.Event] = None
        self._failed: set[str] = set()
        self._poisoned: set[int] = set()
        """Host blocks whose last store failed (read and written on the copy thread)."""

    # --------------------------------------------------------------- set-up
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.kv_caches = dict(kv_caches)

    def bind_kv_cache_config(self, kv_cache_config: Any) -> None:
        """Allocate the host blocks (as many as the scheduler half counts)."""
        count = num_host_blocks(self.vllm_config, kv_cache_config)
        first = next(iter(self.kv_caches.values()), None)
        on_cuda = first is not None and first.cache.is_cuda
        if on_cuda:
            self._stream = torch.cuda.Stream(device=first.cache.device)
        for name, view in self.kv_caches.items():
            self.host[name] = torch.empty(view.shape_of(count * self.block_size),
                                          dtype=view.cache.dtype, pin_memory=on_cuda)
        logger.info("KV offloading: %d host blocks per layer on this rank (%.2f GiB).",
                    count, sum(t.numel() * t.element_size() for t in self.host.values())
                    / 2**30)

    # ------------------------------------------------------------ metadata
    def bind_connector_metadata(self, meta: OffloadingMetadata) -> None:
        self._meta = meta

    def clear_connector_metadata(self) -> None:
        self._meta = None
        self._layer_ready = {}

    # ---------------------------------------------------------------- loads
    def start_load_kv(self, forward_context: Any = None) -> None:
        """Queue the step's loads (behind the previous step's stores); without loads,
        wait for those stores (this step's forward may reuse their blocks)."""
        loads = self._meta.loads
        if not loads:
            self._wait_last_job()
            return
        names = list(self.kv_caches)
        self._layer_ready = {name: threading.Event() for name in names}
        ready = self._layer_ready
        after = self._record_compute()

        def job() -> None:
            try:
                # A host block whose store failed holds no KV: its requests fail.
                bad = [t for t in loads if self._poisoned.intersection(t.host_block_ids)]
                self._failed.update(t.req_id for t in bad)
                good = [t for t in loads if t not in bad]
                device = _slots([b for t in good for b in t.device_block_ids],
                                self.block_size)
                host = torch.as_tensor(_slots([b for t in good for b in t.host_block_ids],
                                              self.block_size))
                with self._on_copy_stream(after):
                    for name in names:
                        self.kv_caches[name].write(device,
                                                   self.host[name].index_select(1, host))
                        self._sync_copy_stream()
                        ready[name].set()
            except Exception as e:  # noqa: BLE001 - fails the step's loading requests
                logger.error("KV offloading: loading the KV of %d requests failed: %s",
                             len(loads), e)
                self._failed.update(t.req_id for t in loads)
            finally:
                for event in ready.values():
                    event.set()

        self._last_job = self._copier.submit(job)

    def wait_for_layer_load(self, layer_name: str) -> None:
        event = self._layer_ready.get(layer_name)
        if event is not None:
            event.wait()

    def wait_for_layer(self, layer_idx: int) -> None:
        """The forward's gate (by layer index): wait until that layer's loads landed."""
        self.wait_for_layer_load(f"layers.{layer_idx}")

    def wait_for_all_loads(self) -> None:
        for event in self._layer_ready.values():
            event.wait()

    def get_failed_loads(self) -> set[str]:
        failed, self._failed = self._failed, set()
        return failed

    # ---------------------------------------------------------------- saves
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any = None) -> None:
        """Nothing per layer: `wait_for_save` queues the whole step's stores."""

    def wait_for_save(self) -> None:
        """Queue the step's stores (device -> host) on the copy thread; returns at once."""
        saves: list[BlockTransfer] = self._meta.saves
        device = _slots([b for t in saves for b in t.device_block_ids], self.block_size)
        host = torch.as_tensor(_slots([b for t in saves for b in t.host_block_ids],
                                      self.block_size))
        after = self._record_compute()

        host_ids = {b for t in saves for b in t.host_block_ids}

        def job() -> None:
            try:
                with self._on_copy_stream(after):
                    for name, view in self.kv_caches.items():
                        self.host[name].index_copy_(1, host, view.read(device))
                self._poisoned.difference_update(host_ids)
            except Exception as e:  # noqa: BLE001 - a later load of them fails its request
                logger.error("KV offloading: storing %d blocks failed: %s",
                             len(device) // self.block_size, e)
                self._poisoned.update(host_ids)

        self._last_job = self._copier.submit(job)

    def wait_idle(self) -> None:
        """Until every queued copy is done (before the device cache is freed)."""
        self._wait_last_job()

    def _wait_last_job(self) -> None:
        if self._last_job is not None:
            self._last_job.wait()
            self._last_job = None

    # ------------------------------------------------------- CUDA streams
    def _record_compute(self) -> Any:
        """An event after the compute stream's work so far (CUDA), else None."""
        if self._stream is None:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _on_copy_stream(self, after: Any) -> Any:
        if self._stream is None:
            return contextlib.nullcontext()
        self._stream.wait_event(after)
        return torch.cuda.stream(self._stream)

    def _sync_copy_stream(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    # ------------------------------------------------------------- outputs
    def connector_output(self) -> Optional[KVConnectorOutput]:
        failed = self.get_failed_loads()
        return KVConnectorOutput(failed_recving=failed) if failed else None

    def shutdown(self) -> None:
        self._wait_last_job()
        self._copier.stop()

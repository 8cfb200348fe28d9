"""OffloadingConnector, scheduler half: a host-memory tier under the prefix cache.

What `--kv-offloading-size GiB [--kv-offloading-backend native]` turns on (vLLM's
names; the engine builds a `KVTransferConfig(kv_connector="OffloadingConnector",
kv_role="kv_both")` from them). Device KV memory is small; host memory is large. Full,
hashed blocks (the prefix cache's, `vllm/core/kv_cache_manager.py`) are copied into a
pool of host blocks; when the device pool later evicts them and a request with the same
prefix comes back, the blocks are copied back instead of recomputed. So a small device
cache behaves like a large prefix cache.

Design:

- **When blocks are stored: eagerly, as they complete** (vLLM's native offloading does
  the same). Each step, every scheduled request's blocks that carry a hash and are not
  in the host pool yet are stored after that step's forward wrote them. Storing on
  eviction instead would put the copy on the critical path of the very step that needs
  the block for another request (the new owner's forward overwrites it), and the
  eviction happens inside `BlockPool.get_new_blocks`, where the scheduler has no step
  to hang a copy on. Eager stores run in the background (the worker's copy thread)
  while the engine samples and schedules; the price is copying blocks that are never
  evicted, one host write per block, once (a hash already in the pool is only
  refreshed in the LRU).
- **The host pool** is an LRU over block hashes (`HostBlockPool`), its size
  `cpu_bytes_to_use / (bytes of a block across all layers and ranks)`. The scheduler
  owns the index (hash -> host block id); the workers only hold the bytes, at the
  host block ids they are told. The hashes are the prefix cache's chained hashes, so
  a host hit is a prefix of the request exactly as a device hit is (LoRA, images and
  cache_salt included), and a new hash lineage after a weight update misses the host
  pool as it misses the device cache.
- **Lookups**: after the device prefix-cache hit of a request being admitted, the
  blocks that follow it are looked up in the host pool, consecutively, at most up to
  the last prompt token (which is always computed). The scheduler allocates device
  blocks for them as for any computed tokens (`num_external_computed_tokens`), and the
  step's metadata carries the loads (device block id <- host block id).
- **Ordering** (one FIFO copy thread per worker, `offloading_worker.py`): a step's
  stores are queued after its forward; the next step's loads are queued after them, and
  that step's forward waits for its loads (layer by layer) or, without loads, for the
  stores: no forward writes a block a store is still reading, and no load reads a host
  block before the store that filled it. A host block evicted from the LRU is never
  being loaded in the same step (loaded hashes are refreshed at lookup and protected
  while the step's stores take blocks).

- **Failures**: a store that fails leaves its host blocks poisoned on the worker; a later
  load from them fails only its request (finish reason "error", as a failed P/D load),
  and `on_failed_loads` drops those entries here, so the next request recomputes them.

Counted here (SchedulerStats -> Prometheus): blocks stored and loaded (vLLM's
`vllm:kv_offload_store_bytes` / `vllm:kv_offload_load_bytes`, and block counts), and
the host hits as vLLM's external prefix-cache hits.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

logger = logging.getLogger(__name__)

GiB = 1 << 30


@dataclass
class BlockTransfer:
    """Copies between device blocks and host blocks (pairwise) for one request."""
    req_id: str
    device_block_ids: list[int]
    host_block_ids: list[int]


@dataclass
class OffloadingMetadata:
    """One step's copies: loads (host -> device) before its forward, saves (device ->
    host) after it. The same attributes as `KVConnectorMetadata`."""
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.loads and not self.saves


def num_host_blocks(vllm_config: Any, kv_cache_config: Any) -> int:
    """Host blocks that `cpu_bytes_to_use` (all ranks together, as vLLM's
    --kv-offloading-size) holds: a block's bytes are those of every layer on every
    rank. Both halves compute it from the same KV cache config."""
    total = float(vllm_config.kv_transfer_config.get_from_extra_config("cpu_bytes_to_use", 0))
    tp = vllm_config.parallel_config.tensor_parallel_size
    per_block = kv_cache_config.block_bytes() * tp
    return int(total // per_block) if per_block > 0 else 0


class HostBlockPool:
    """LRU index of the host blocks: block hash -> host block id."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._by_hash: OrderedDict[int, int] = OrderedDict()
        self._free = list(range(num_blocks - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._by_hash)

    def lookup(self, block_hash: int) -> Optional[int]:
        """The host block holding `block_hash` (refreshed in the LRU), or None."""
        host_id = self._by_hash.get(block_hash)
        if host_id is not None:
            self._by_hash.move_to_end(block_hash)
        return host_id

    def drop(self, block_hash: int) -> None:
        """Forget `block_hash` (its host block holds no valid KV); the block is free."""
        host_id = self._by_hash.pop(block_hash, None)
        if host_id is not None:
            self._free.append(host_id)

    def allocate(self, block_hash: int, protected: set[int]) -> Optional[int]:
        """A host block for `block_hash`: a free one, else the least recently used
        one's (never one in `protected`). None when every block is protected."""
        if self._free:
            host_id = self._free.pop()
        else:
            victim = next((h for h, i in self._by_hash.items() if i not in protected), None)
            if victim is None:
                return None
            host_id = self._by_hash.pop(victim)
        self._by_hash[block_hash] = host_id
        return host_id


class OffloadingConnectorScheduler:

    loads_on_resume = True
    """A preempted request looks up the host pool again when it is readmitted (its
    blocks were likely stored before it lost them)."""

    def __init__(self, vllm_config: Any) -> None:
        self.block_size = vllm_config.cache_config.block_size
        self.vllm_config = vllm_config
        self.host: Optional[HostBlockPool] = None
        self.kv_cache_manager: Any = None
        self.block_bytes = 0
        """Bytes of one block, all layers and ranks (for the byte counters)."""
        self._pending: dict[str, tuple[int, list[int]]] = {}
        """Request -> (first block, host blocks) of its last lookup's hit."""
        self._loading: dict[str, list[int]] = {}
        """Request -> the block hashes of its last load (dropped if that load fails)."""
        self._loads: list[BlockTransfer] = []
        self._num_scanned: dict[str, int] = {}
        """Request -> how many of its leading blocks were already stored or found."""
        self.num_stored_blocks = 0
        self.num_loaded_blocks = 0

    def bind_kv_cache(self, kv_cache_config: Any, kv_cache_manager: Any) -> None:
        """The scheduler's KV cache: sizes the host pool; its block tables carry the
        hashes of the blocks to store."""
        if not kv_cache_manager.enable_caching:
            raise ValueError("kv_offloading_size: KV offloading keeps prefix-cache blocks "
                             "in host memory, and prefix caching is off for this engine "
                             "(--no-enable-prefix-caching, a pooling model or a hybrid "
                             "KV cache); enable it or drop --kv-offloading-size.")
        self.kv_cache_manager = kv_cache_manager
        tp = self.vllm_config.parallel_config.tensor_parallel_size
        self.block_bytes = kv_cache_config.block_bytes() * tp
        count = num_host_blocks(self.vllm_config, kv_cache_config)
        if count < 1:
            size = self.vllm_config.kv_transfer_config.get_from_extra_config(
                "cpu_bytes_to_use", 0) / GiB
            raise ValueError(f"kv_offloading_size={size:g} GiB holds no KV block of this "
                             f"model ({self.block_bytes} bytes per block of "
                             f"{self.block_size} tokens); give at least "
                             f"{self.block_bytes / GiB:.6f} GiB.")
        self.host = HostBlockPool(count)
        logger.info("KV offloading: %d host blocks (%.2f GiB, %d tokens) under %d device "
                    "blocks.", count, count * self.block_bytes / GiB, count * self.block_size,
                    kv_cache_manager.block_pool.num_blocks)

    # ----------------------------------------------------------- lookups
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """(tokens after the device hit held by the host pool, loaded asynchronously:
        False, the step's forward waits for them)."""
        bs = self.block_size
        start = num_computed_tokens // bs
        last = (request.num_tokens - 1) // bs  # the last token is computed
        hashes = request.block_hashes
        host_ids: list[int] = []
        for i in range(start, min(last, len(hashes))):
            host_id = self.host.lookup(hashes[i])
            if host_id is None:
                break
            host_ids.append(host_id)
        if not host_ids:
            self._pending.pop(request.request_id, None)
            return 0, False
        self._pending[request.request_id] = (start, host_ids)
        return len(host_ids) * bs, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        pending = self._pending.pop(request.request_id, None)
        if pending is None or num_external_tokens <= 0:
            return
        start, host_ids = pending
        n = num_external_tokens // self.block_size
        self._loads.append(BlockTransfer(request.request_id, list(block_ids[start:start + n]),
                                         host_ids[:n]))
        self._loading[request.request_id] = list(request.block_hashes[start:start + n])
        self.num_loaded_blocks += n
        # Found in the host pool: nothing of these to store again.
        self._num_scanned[request.request_id] = start + n

    # ------------------------------------------------------------- per step
    def build_connector_meta(self, scheduler_output: Any) -> OffloadingMetadata:
        meta = OffloadingMetadata(loads=self._loads)
        self._loads = []
        protected = {h for load in meta.loads for h in load.host_block_ids}
        for req_id in scheduler_output.preempted_req_ids:
            self._num_scanned.pop(req_id, None)
        tables = self.kv_cache_manager.req_to_blocks
        for req_id in scheduler_output.num_scheduled_tokens:
            blocks = tables.get(req_id, [])
            first = self._num_scanned.get(req_id, 0)
            device_ids, host_ids = [], []
            n = first
            for block in blocks[first:]:
                if block.block_hash is None:
                    break  # not full yet (hashes are set once the step fills a block)
                if self.host.lookup(block.block_hash) is None:
                    host_id = self.host.allocate(block.block_hash, protected)
                    if host_id is None:
                        break  # every host block is in this step's copies: next step
                    protected.add(host_id)
                    device_ids.append(block.block_id)
                    host_ids.append(host_id)
                n += 1
            self._num_scanned[req_id] = n
            if device_ids:
                meta.saves.append(BlockTransfer(req_id, device_ids, host_ids))
                self.num_stored_blocks += len(device_ids)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, Optional[dict[str, Any]]]:
        self._num_scanned.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        return False, None

    def on_failed_loads(self, req_ids: set[str]) -> None:
        """The workers could not load these requests' blocks (a host block whose store
        had failed): forget those host entries, so later requests recompute them."""
        for req_id in req_ids:
            for block_hash in self._loading.pop(req_id, []):
                self.host.drop(block_hash)

    def stats(self) -> dict[str, int]:
        return {"stored_blocks": self.num_stored_blocks,
                "loaded_blocks": self.num_loaded_blocks, "block_bytes": self.block_bytes,
                "used_blocks": len(self.host) if self.host is not None else 0}

"""What a connector's scheduler half tells its worker half for one step, and what the
workers report back. Plain data: it travels in the SchedulerOutput to every rank."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass
class ReqMeta:
    """KV of tokens [start, end) of one request, in its blocks `block_ids`."""
    req_id: str
    block_ids: list[int]
    start: int
    end: int
    key: str
    """What names the KV in the transfer medium: a storage key (ExampleConnector) or
    the producer's request id (P2pZmqConnector)."""
    token_hash: str
    """prompt_digest of the tokens [0, end): producer and consumer must agree on them."""
    remote: Optional[dict[str, Any]] = None
    """Where to fetch from (P2pZmqConnector loads: the producer's kv_transfer_params)."""
    token_ids: Optional[list[int]] = None
    """Saves: the prompt's token ids, so that a producer can check a consumer's
    `token_hash` of any prefix of them."""
    salt: str = ""
    """What besides the tokens names the KV (the LoRA adapter)."""

    def slot_ids(self, block_size: int) -> np.ndarray:
        """The cache slots of tokens start .. end - 1 (slot = block * size + offset)."""
        positions = np.arange(self.start, self.end, dtype=np.int64)
        blocks = np.asarray(self.block_ids, dtype=np.int64)[positions // block_size]
        return blocks * block_size + positions % block_size


@dataclass
class KVConnectorMetadata:
    """One step's transfers: loads before the forward, saves after it."""
    loads: list[ReqMeta] = field(default_factory=list)
    saves: list[ReqMeta] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.loads and not self.saves


@dataclass
class KVConnectorOutput:
    """What the workers' connectors report with a step's output (driver rank)."""
    failed_recving: set[str] = field(default_factory=set)
    """Requests whose KV could not be loaded this step (peer gone, timeout, missing or
    mismatching data): the scheduler ends them with an error instead of sampling from
    a cache that does not hold their prompt."""


def prompt_digest(token_ids: list[int], salt: str = "") -> str:
    """A stable name for a token sequence (the same in every process and run)."""
    h = hashlib.sha256(salt.encode())
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]

"""P2pZmqConnector, worker half: a producer serves prompt KV from host memory over a
ZeroMQ ROUTER socket; a consumer pulls it with one request per prompt.

Wire format (one multipart message each way):

- consumer -> producer: a JSON header {"request_id", "start", "end", "token_hash"};
- producer -> consumer: a JSON header {"ok": true, "dtype", "shape", "layers"}, then
  one raw frame per layer (`shape` = [parts, end - start, kv_heads, head_size], in
  the order of "layers"), or {"ok": false, "error": "..."}.

The producer copies a prompt's KV to host memory in the step that computes it
(`save_kv_layer`), so its blocks are freed with the request as usual; the copy stays
in a buffer bounded by `kv_buffer_size` bytes and `ttl_s` seconds, and leaves it
once a consumer fetched it. A consumer waits at most `timeout_s` for the reply, so a
producer that died or went away fails the request instead of hanging it.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import torch
import zmq

from vllm.distributed.parallel_state import get_tp_group
from vllm.kv_transfer.metadata import ReqMeta, prompt_digest
from vllm.kv_transfer.worker_base import KVConnectorWorkerBase, KVTransferError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_TTL_S = 120.0
_POLL_MS = 100
"""How often the serving thread looks at its stop flag."""


@dataclass
class _Entry:
    token_ids: list[int]
    salt: str
    layers: dict[str, torch.Tensor]
    nbytes: int
    created: float


class KVSendBuffer:
    """Saved prompts' KV in host memory, oldest first, within a byte and age bound."""

    def __init__(self, max_bytes: float, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, key: str, token_ids: list[int], salt: str,
            layers: dict[str, torch.Tensor]) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in layers.values())
        with self._lock:
            self._drop(key)
            self._entries[key] = _Entry(token_ids, salt, layers, nbytes, time.monotonic())
            self._bytes += nbytes
            self._evict()

    def take(self, key: str) -> Optional[_Entry]:
        with self._lock:
            self._evict()
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
            return entry

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.nbytes

    def _evict(self) -> None:
        now = time.monotonic()
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if self._bytes <= self.max_bytes and now - oldest.created <= self.ttl_s:
                return
            logger.warning("KV of request %s dropped from the send buffer before a decode "
                           "instance fetched it (%s).", key,
                           "buffer full" if self._bytes > self.max_bytes else "expired")
            self._drop(key)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise KVTransferError(f"unknown dtype {name!r} in a KV reply")
    return dtype


class KVServer:
    """The producer's serving thread: answers fetches from the send buffer."""

    def __init__(self, ctx: zmq.Context, address: str, buffer: KVSendBuffer) -> None:
        self.buffer = buffer
        self.address = address
        self._socket = ctx.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-p2p-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(_POLL_MS):
                continue
            identity, *rest = self._socket.recv_multipart()
            try:
                if len(rest) != 1:
                    raise KVTransferError(f"a fetch is one JSON frame, got {len(rest)}")
                frames = self._answer(json.loads(rest[0]))
            except Exception as e:  # noqa: BLE001 - reported to the consumer
                frames = [json.dumps({"ok": False, "error": str(e)}).encode()]
            self._socket.send_multipart([identity, *frames], copy=False)
        self._socket.close(linger=0)

    def _answer(self, ask: dict[str, Any]) -> list[Any]:
        entry = self.buffer.take(str(ask["request_id"]))
        if entry is None:
            raise KVTransferError(f"no KV for request {ask['request_id']} (never saved, "
                                  "already fetched, or dropped)")
        start, end = int(ask["start"]), int(ask["end"])
        if not 0 <= start <= end <= len(entry.token_ids):
            raise KVTransferError(f"tokens [{start}, {end}) asked, "
                                  f"{len(entry.token_ids)} held")
        if prompt_digest(entry.token_ids[:end], entry.salt) != ask["token_hash"]:
            raise KVTransferError("the prompt differs from the one the producer computed")
        names = list(entry.layers)
        parts = [entry.layers[n][:, start:end].contiguous() for n in names]
        header = {"ok": True, "dtype": str(parts[0].dtype) if parts else "float32",
                  "shape": list(parts[0].shape) if parts else [], "layers": names}
        return [json.dumps(header).encode(),
                *(p.view(torch.uint8).numpy() for p in parts)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class P2pZmqConnectorWorker(KVConnectorWorkerBase):

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        extra = self.config.kv_connector_extra_config
        self.timeout_s = float(extra.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.rank = get_tp_group().rank
        self._ctx = zmq.Context()
        self.server: Optional[KVServer] = None
        if self.config.is_kv_producer:
            buffer = KVSendBuffer(self.config.kv_buffer_size,
                                  float(extra.get("ttl_s", DEFAULT_TTL_S)))
            address = f"tcp://{self.config.kv_ip}:{self.config.kv_port + self.rank}"
            self.server = KVServer(self._ctx, address, buffer)
            logger.info("P2pZmqConnector: serving KV on %s", address)

    # --------------------------------------------------------------- producer
    def _publish(self, save: ReqMeta, layers: dict[str, torch.Tensor]) -> None:
        self.server.buffer.put(save.key, list(save.token_ids or []), save.salt, layers)

    # --------------------------------------------------------------- consumer
    def _fetch(self, load: ReqMeta) -> dict[str, torch.Tensor]:
        remote = load.remote
        address = f"tcp://{remote['remote_host']}:{int(remote['remote_port']) + self.rank}"
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(json.dumps({"request_id": load.key, "start": load.start,
                                  "end": load.end, "token_hash": load.token_hash}).encode())
            if not sock.poll(int(self.timeout_s * 1000), zmq.POLLIN):
                raise KVTransferError(f"no reply from {address} within {self.timeout_s} s")
            frames = sock.recv_multipart(copy=False)
        finally:
            sock.close(linger=0)
        return self._decode(frames, address)

    @staticmethod
    def _decode(frames: list[Any], address: str) -> dict[str, torch.Tensor]:
        header = json.loads(bytes(frames[0].buffer))
        if not header.get("ok"):
            raise KVTransferError(f"{address}: {header.get('error')}")
        dtype, shape = _dtype(header["dtype"]), header["shape"]
        if len(frames) - 1 != len(header["layers"]):
            raise KVTransferError(f"{address}: {len(frames) - 1} layer frames for "
                                  f"{len(header['layers'])} layers")
        return {name: torch.frombuffer(bytearray(frame.buffer), dtype=torch.uint8)
                .view(dtype).reshape(shape)
                for name, frame in zip(header["layers"], frames[1:])}

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self._ctx.destroy(linger=0)

"""P2pZmqConnector, scheduler half: KV pulled over TCP (ZeroMQ) from a prefill instance.

The flow of one request through a proxy (examples/disagg_proxy_server.py), as with
vLLM's NIXL / P2P connectors:

1. The proxy sends the request to the prefill instance (kv_role kv_producer) with
   max_tokens=1 and `kv_transfer_params: {"do_remote_decode": true}`. Its workers
   copy the prompt's KV to host memory in the step that computes it
   (`p2p_zmq_worker.py`) and serve it from there; its output carries
   `kv_transfer_params` naming the producer's address and request.
2. The proxy sends the request to the decode instance (kv_consumer) with those
   `kv_transfer_params`. Its scheduler counts every prompt token but the last as
   computed elsewhere; before the forward of the request's first step its workers
   fetch that KV, all layers in one message per request, into the request's blocks.

A producer's worker rank r listens on `kv_port + r` and a consumer's rank r fetches
from it, so both instances must have the same parallel layout.
"""
from __future__ import annotations

from typing import Any, Optional

from vllm.kv_transfer.metadata import ReqMeta, prompt_digest
from vllm.kv_transfer.params import REMOTE_KEYS, kv_transfer_params_of
from vllm.kv_transfer.scheduler_base import KVConnectorSchedulerBase, lora_salt


class P2pZmqConnectorScheduler(KVConnectorSchedulerBase):

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.engine_id = self.config.engine_id or f"{self.config.kv_ip}:{self.config.kv_port}"

    @staticmethod
    def _remote(request: Any) -> Optional[dict[str, Any]]:
        params = kv_transfer_params_of(request.sampling_params)
        if not params or not params.get("do_remote_prefill"):
            return None
        return params  # its keys were checked at entry (params.check_kv_transfer_params)

    def _available_tokens(self, request: Any) -> int:
        params = self._remote(request)
        if params is None:
            return 0
        return int(params.get("remote_num_tokens", request.num_prompt_tokens))

    def _load_meta(self, request: Any, block_ids: list[int], start: int, end: int
                   ) -> ReqMeta:
        params = self._remote(request)
        return ReqMeta(req_id=request.request_id, block_ids=block_ids, start=start, end=end,
                       key=str(params["remote_request_id"]),
                       token_hash=prompt_digest(request.prompt_token_ids[:end],
                                                lora_salt(request.lora_request)),
                       remote={k: params[k] for k in REMOTE_KEYS})

    def _save_key(self, new_request: Any) -> Optional[str]:
        params = kv_transfer_params_of(new_request.sampling_params)
        if not params or not params.get("do_remote_decode"):
            return None
        return new_request.req_id

    def _finished_params(self, request: Any) -> Optional[dict[str, Any]]:
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.engine_id, "remote_host": self.config.kv_ip,
                "remote_port": self.config.kv_port, "remote_request_id": request.request_id,
                "remote_num_tokens": request.num_prompt_tokens}

"""The scheduler half of a KV connector (vLLM's KVConnectorBase_V1, scheduler role).

The scheduler calls, in this order:

1. `get_num_new_matched_tokens(request, num_computed_tokens)` when it first admits a
   request, after the local prefix-cache lookup: how many of the following prompt
   tokens another engine computed. They are never the last prompt token: the engine
   computes that one itself to get the logits of its first output token.
2. `update_state_after_alloc(request, block_ids, num_external_tokens)` once the
   request has blocks for them: the load to ask the workers for.
3. `build_connector_meta(scheduler_output)` at the end of each schedule: the step's
   loads (requests admitted above) and saves (producer requests whose prompt is
   complete after this step), carried to every rank in the SchedulerOutput.
4. `request_finished(request, block_ids)` when a request ends: whether its blocks must
   outlive it (never here: a producer copies the KV out in the same step) and the
   `kv_transfer_params` its output carries (where a decode instance finds the KV).

Subclasses say what the transfer medium holds (`_available_tokens`, `_load_meta`) and
which requests a producer saves under which key (`_save_key`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from vllm.kv_transfer.metadata import KVConnectorMetadata, ReqMeta, prompt_digest

logger = logging.getLogger(__name__)


def lora_salt(lora_request: Any) -> str:
    """KV computed with an adapter is not the base model's: it names the KV too."""
    return "" if lora_request is None else f"lora:{lora_request.lora_name}"


@dataclass
class _Saving:
    """A producer request whose prompt is being computed: its blocks so far."""
    key: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    salt: str


class KVConnectorSchedulerBase:

    def __init__(self, vllm_config: Any) -> None:
        self.config = vllm_config.kv_transfer_config
        self.block_size = vllm_config.cache_config.block_size
        self._loads: list[ReqMeta] = []
        """Loads decided since the last build_connector_meta."""
        self._saving: dict[str, _Saving] = {}
        self._saved: set[str] = set()
        """Producer requests whose KV was handed to the workers to save."""

    # ------------------------------------------------------------- consumer
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """(tokens after the first `num_computed_tokens` that another engine computed,
        whether they load asynchronously: never here, loads finish before the step's
        forward)."""
        if not self.config.is_kv_consumer:
            return 0, False
        end = self._matched_end(request)
        return max(end - num_computed_tokens, 0), False

    def _matched_end(self, request: Any) -> int:
        """Prompt tokens available elsewhere, at most all but the last."""
        available = self._available_tokens(request)
        return min(available, request.num_prompt_tokens - 1)

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """The request's blocks (its whole table) now exist: queue the load of its
        `num_external_tokens` tokens ending where `get_num_new_matched_tokens` said."""
        if num_external_tokens <= 0:
            return
        end = self._matched_end(request)
        start = end - num_external_tokens
        self._loads.append(self._load_meta(request, list(block_ids), start, end))

    # ------------------------------------------------------------- per step
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        if not self.config.is_kv_producer:
            return meta
        loaded = {m.req_id for m in meta.loads}
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in loaded:
                continue  # its KV came from elsewhere: nothing new to publish
            key = self._save_key(new)
            if key is not None:
                self._saving[new.req_id] = _Saving(
                    key, list(new.prompt_token_ids), list(new.block_ids),
                    self._salt(new.lora_request))
            self._maybe_save(meta, new.req_id, new.num_computed_tokens, scheduler_output)
        for cached in scheduler_output.scheduled_cached_reqs:
            saving = self._saving.get(cached.req_id)
            if saving is None:
                continue
            if cached.resumed_from_preemption:
                saving.block_ids = list(cached.new_block_ids)
            else:
                saving.block_ids.extend(cached.new_block_ids)
            self._maybe_save(meta, cached.req_id, cached.num_computed_tokens, scheduler_output)
        return meta

    def _maybe_save(self, meta: KVConnectorMetadata, req_id: str, num_computed: int,
                    scheduler_output: Any) -> None:
        """Save a producer request's prompt KV in the step that completes its prompt."""
        saving = self._saving.get(req_id)
        if saving is None:
            return
        num_prompt = len(saving.prompt_token_ids)
        if num_computed + scheduler_output.num_scheduled_tokens[req_id] < num_prompt:
            return  # a chunked prompt: saved with its last chunk
        del self._saving[req_id]
        self._saved.add(req_id)
        meta.saves.append(ReqMeta(req_id=req_id, block_ids=saving.block_ids, start=0,
                                  end=num_prompt, key=saving.key,
                                  token_hash=prompt_digest(saving.prompt_token_ids,
                                                           saving.salt),
                                  token_ids=saving.prompt_token_ids, salt=saving.salt))

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, Optional[dict[str, Any]]]:
        """(delay freeing its blocks: always False, the request's kv_transfer_params
        for its output or None)."""
        self._saving.pop(request.request_id, None)
        saved = request.request_id in self._saved
        self._saved.discard(request.request_id)
        if not saved:
            return False, None
        return False, self._finished_params(request)

    # ----------------------------------------------------------- subclasses
    def _salt(self, lora_request: Any) -> str:
        """What besides the token ids names a request's KV (`prompt_digest`'s salt)."""
        return lora_salt(lora_request)

    def _available_tokens(self, request: Any) -> int:
        """Leading prompt tokens of `request` whose KV the medium holds (0: none)."""
        raise NotImplementedError

    def _load_meta(self, request: Any, block_ids: list[int], start: int, end: int
                   ) -> ReqMeta:
        raise NotImplementedError

    def _save_key(self, new_request: Any) -> Optional[str]:
        """The key a producer saves this new request's prompt KV under (None: not
        saved). `new_request` is the step's NewRequestData."""
        raise NotImplementedError

    def _finished_params(self, request: Any) -> Optional[dict[str, Any]]:
        """kv_transfer_params of a finished request whose KV was saved."""
        return None

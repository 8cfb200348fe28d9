"""In-memory store of `/v1/responses` results, bounded in bytes.

Off unless VLLM_ENABLE_RESPONSES_API_STORE=1 (as in vLLM). Each entry keeps the
Response object (what GET /v1/responses/{id} returns) and the chat conversation it ended
with (what `previous_response_id` continues). A count bound alone does not bound memory
(one request's `input` or `instructions` may be megabytes), so the store is bounded by
the bytes its entries take, measured once per entry as the length of its JSON text:
cheap, and close to what the entry holds in memory. The oldest entries go first once
the bound is reached; an entry larger than the whole bound is not kept (rather than
evicting everything for it). A background response's running task is kept beside its
entry so that it can be cancelled, also when its entry is evicted.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

logger = logging.getLogger(__name__)


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    """The chat messages (input and answer) a continuation starts from."""
    task: Optional["asyncio.Task[Any]"] = None
    """The running task of a background response (None when done or synchronous)."""


def entry_bytes(entry: StoredResponse) -> int:
    """The size an entry counts for: the UTF-8 length of its JSON text.

    Status changes made in place later (queued -> in_progress -> cancelled / failed, all
    with no output) are not measured again: they change the size by a few bytes only."""
    text = json.dumps([entry.response, entry.conversation], ensure_ascii=False,
                      separators=(",", ":"), default=str)
    return len(text.encode("utf-8", errors="replace"))


class ResponsesStore:

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[str, tuple[StoredResponse, int]]" = OrderedDict()
        self._bytes = 0

    def put(self, response_id: str, entry: StoredResponse) -> bool:
        """Keep `entry` under `response_id` (replacing the one there), evicting the oldest
        others as needed; False, and nothing changed, when it alone exceeds the bound."""
        size = entry_bytes(entry)
        if size > self.max_bytes:
            logger.warning("Response %s is not stored: it takes %d bytes, more than the "
                           "whole store (VLLM_RESPONSES_API_STORE_MAX_BYTES=%d).",
                           response_id, size, self.max_bytes)
            return False
        self._drop(response_id)
        self._entries[response_id] = (entry, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            old_id, (old, _) = next(iter(self._entries.items()))
            self._drop(old_id)
            if old.task is not None and not old.task.done():
                old.task.cancel()
            logger.debug("Responses store full: evicted %s.", old_id)
        return True

    def _drop(self, response_id: str) -> None:
        found = self._entries.pop(response_id, None)
        if found is not None:
            self._bytes -= found[1]

    def get(self, response_id: str) -> Optional[StoredResponse]:
        found = self._entries.get(response_id)
        return found[0] if found is not None else None

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

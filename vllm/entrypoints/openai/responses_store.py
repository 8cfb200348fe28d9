"""In-memory store of `/v1/responses` results (`store: true`, the default), bounded.

Each entry keeps the Response object (what GET /v1/responses/{id} returns) and the
chat conversation it ended with (what `previous_response_id` continues). The oldest
entries go first once `max_entries` is reached, so a long-running server's memory
stays bounded; a background response's running task is kept beside its entry so it
can be cancelled.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

logger = logging.getLogger(__name__)

MAX_STORED_RESPONSES = 1024
"""Entries kept (the oldest are evicted first)."""


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    """The chat messages (input and answer) a continuation starts from."""
    task: Optional["asyncio.Task[Any]"] = None
    """The running task of a background response (None when done or synchronous)."""


class ResponsesStore:

    def __init__(self, max_entries: int = MAX_STORED_RESPONSES) -> None:
        self.max_entries = max_entries
        self._entries: "OrderedDict[str, StoredResponse]" = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            old_id, old = self._entries.popitem(last=False)
            if old.task is not None and not old.task.done():
                old.task.cancel()
            logger.debug("Responses store full: evicted %s.", old_id)

    def get(self, response_id: str) -> Optional[StoredResponse]:
        return self._entries.get(response_id)

    def __len__(self) -> int:
        return len(self._entries)

"""Pausing generation around a weight update (vLLM's /pause, /resume, /is_paused).

While paused, new requests wait at the gate (they are not refused: an RL rollout
client keeps its requests and they run on the new weights after /resume). What
happens to the requests already running is the pause's mode, as in vLLM:

| mode | running requests |
|---|---|
| abort (default) | aborted at once (finish_reason "abort") |
| wait | run to completion; the pause returns when none is left |
| keep | frozen in the scheduler (no step runs); they continue on resume |
"""
from __future__ import annotations

import asyncio
from typing import Optional

PAUSE_MODES = ("abort", "wait", "keep")


def resolve_pause_mode(mode: str, wait_for_inflight_requests: bool = False) -> str:
    """The mode, with vLLM's deprecated `wait_for_inflight_requests=True` as "wait"."""
    if wait_for_inflight_requests:
        mode = "wait"
    if mode not in PAUSE_MODES:
        raise ValueError(f"mode={mode!r}: the pause mode is one of {', '.join(PAUSE_MODES)}.")
    return mode


class PauseGate:
    """Event-loop side state of a pause: whether paused, and the wait for resume."""

    def __init__(self) -> None:
        self._open: Optional[asyncio.Event] = None
        self.paused = False

    def _event(self) -> asyncio.Event:
        if self._open is None:  # made on the event loop that uses it
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    def pause(self) -> None:
        self.paused = True
        self._event().clear()

    def resume(self) -> None:
        self.paused = False
        self._event().set()

    async def wait_open(self) -> None:
        """Return at once unless paused; then when resumed."""
        if self.paused:
            await self._event().wait()

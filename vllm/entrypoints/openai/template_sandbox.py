"""Request-supplied chat templates, rendered in a helper process under a time limit.

A chat template is a program. transformers renders it in jinja2's sandbox, which blocks
attribute tricks and caps range() at 100,000 items, but three nested loops still run for
minutes, and a Python loop on a server thread holds the GIL that the event loop and the
engine thread need. So a template that came with a request (only accepted with
--trust-request-chat-template) is rendered in a separate, low-priority process, which is
killed when the deadline passes or the client leaves; the next one starts afresh. The
server's own templates (--chat-template, the tokenizer's) are rendered in process.
Several renders run at once in several helpers (`VLLM_CHAT_TEMPLATE_WORKERS`), each
under its own deadline: three runaway templates end together after the deadline, not
one after another.

Protocol on the helper's stdin/stdout: length-prefixed pickles. The helper first reads
the tokenizer and answers "ready"; then one job in, one ("ok", text) or ("error",
message, param) out, until stdin closes (which the server's death also causes).
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import threading
from typing import IO, Any, Optional

from vllm.entrypoints.openai.errors import (BadRequestError, InternalServerError,
                                            ServiceUnavailableError)
from vllm.utils.helper_process import (HelperProcess, helper_main, limit_address_space,
                                       read_message, write_message)

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0
"""How long a request waits for a helper that is still starting (imports, tokenizer)."""
_MEMORY_LIMIT_BYTES = 2 << 30
"""Address space the helper may add while rendering (a template can build huge
strings faster than the deadline passes)."""


def _new_helper(tokenizer_bytes: bytes) -> HelperProcess:
    return HelperProcess("vllm.entrypoints.openai.template_sandbox", tokenizer_bytes,
                         "vllm-template-sandbox")


class TemplateSandbox:
    """Up to `max_workers` helper processes, one render each at a time.

    Every render has its own deadline, counted from the call: renders running at once
    each get a helper (a loaded spare is kept ready, so a burst rarely waits for a
    start), and a request that finds every helper busy waits only until its own
    deadline (503). A helper whose render passes its deadline, or whose client left,
    is killed and replaced in the background.
    """

    def __init__(self, tokenizer: Any, timeout_s: float, max_workers: int = 4) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}.")
        self._tokenizer_bytes = pickle.dumps(tokenizer)
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._idle: list[HelperProcess] = []  # started (maybe still loading), not rendering
        self._busy: set[HelperProcess] = set()
        self._lock = threading.Lock()
        self._freed: Optional[asyncio.Event] = None

    @property
    def helpers(self) -> list[HelperProcess]:
        """Every live helper (tests: their pids)."""
        with self._lock:
            return [h for h in [*self._idle, *self._busy] if h.alive]

    def start(self) -> None:
        """Keep one spare helper starting or ready (returns at once: it imports and reads
        the tokenizer in the background, so that cost is not a request's)."""
        with self._lock:
            self._idle = [h for h in self._idle if h.alive]
            if not self._idle and len(self._busy) < self.max_workers:
                self._idle.append(_new_helper(self._tokenizer_bytes))

    def stop(self) -> None:
        with self._lock:
            helpers, self._idle, self._busy = [*self._idle, *self._busy], [], set()
        for helper in helpers:
            helper.kill()

    async def render(self, **job: Any) -> str:
        """chat_utils.apply_chat_template(tokenizer, **job) in a helper, within timeout_s
        of this call.

        Raises BadRequestError for a template error or a render past the deadline,
        ServiceUnavailableError when no helper freed up before it; a cancelled caller
        (client gone) kills its render too.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        helper = await self._acquire(loop, deadline)
        try:
            reply = await asyncio.wait_for(asyncio.to_thread(helper.exchange, job),
                                           max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            self._retire(helper)
            raise BadRequestError(f"The chat template did not finish rendering within "
                                  f"{self.timeout_s:g} s.", param="chat_template") from None
        except BaseException:  # cancelled (client gone) or the helper died
            self._retire(helper)
            raise
        self._release(helper)
        if reply[0] == "ok":
            return reply[1]
        raise BadRequestError(reply[1], param=reply[2])

    async def _acquire(self, loop: asyncio.AbstractEventLoop, deadline: float) -> HelperProcess:
        """A loaded helper for this render; waits for one to load or free up, at most
        until the deadline (a helper's first start does not count against it)."""
        if self._freed is None:
            self._freed = asyncio.Event()
        while True:
            helper = self._take()
            if helper is not None:
                if not helper.loaded.is_set():
                    await asyncio.to_thread(helper.loaded.wait, _READY_TIMEOUT_S)
                    deadline = max(deadline, loop.time() + self.timeout_s)
                if helper.alive and helper.loaded.is_set():
                    self.start()  # a spare for the next request, loading meanwhile
                    return helper
                self._retire(helper)
                raise InternalServerError("The chat template sandbox process could not "
                                          "start; see the server log.")
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise ServiceUnavailableError(
                    f"All {self.max_workers} chat template sandboxes are busy; try again "
                    "later.") from None

    def _take(self) -> Optional[HelperProcess]:
        """An idle helper (loaded first), or a new one if fewer than max_workers run."""
        with self._lock:
            self._idle = [h for h in self._idle if h.alive]
            self._idle.sort(key=lambda h: not h.loaded.is_set())
            if self._idle:
                helper = self._idle.pop(0)
            elif len(self._busy) < self.max_workers:
                helper = _new_helper(self._tokenizer_bytes)
            else:
                return None
            self._busy.add(helper)
            return helper

    def _release(self, helper: HelperProcess) -> None:
        with self._lock:
            self._busy.discard(helper)
            if helper.alive:
                self._idle.append(helper)
        self._notify()

    def _retire(self, helper: HelperProcess) -> None:
        """Kill a helper mid-render and keep a fresh spare loading for the next request."""
        helper.kill()
        with self._lock:
            self._busy.discard(helper)
        self.start()
        self._notify()

    def _notify(self) -> None:
        if self._freed is not None:
            self._freed.set()


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from vllm.entrypoints.openai.chat_utils import apply_chat_template
    tokenizer = pickle.loads(read_message(stdin))
    limit_address_space(_MEMORY_LIMIT_BYTES)
    write_message(stdout, "ready")
    while True:
        try:
            job = read_message(stdin)
        except EOFError:
            return
        try:
            reply: tuple = ("ok", apply_chat_template(tokenizer, **job))
        except BadRequestError as e:
            reply = ("error", e.message, e.param)
        except Exception as e:  # noqa: BLE001 - MemoryError, RecursionError...: the template's
            reply = ("error", f"Could not apply the chat template: {type(e).__name__}: {e}",
                     "chat_template")
        write_message(stdout, reply)


def main() -> None:
    helper_main(_serve)


if __name__ == "__main__":
    main()

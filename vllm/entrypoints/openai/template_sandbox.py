"""Request-supplied chat templates, rendered in a helper process under a time limit.

A chat template is a program. transformers renders it in jinja2's sandbox, which blocks
attribute tricks and caps range() at 100,000 items, but three nested loops still run for
minutes, and a Python loop on a server thread holds the GIL that the event loop and the
engine thread need. So a template that came with a request (only accepted with
--trust-request-chat-template) is rendered in a separate, low-priority process, which is
killed when the deadline passes or the client leaves; the next one starts afresh. The
server's own templates (--chat-template, the tokenizer's) are rendered in process.

Protocol on the helper's stdin/stdout: length-prefixed pickles. The helper first reads
the tokenizer and answers "ready"; then one job in, one ("ok", text) or ("error",
message, param) out, until stdin closes (which the server's death also causes).
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any, Optional

from vllm.entrypoints.openai.errors import BadRequestError, InternalServerError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")
_READY_TIMEOUT_S = 120.0
"""How long a request waits for a helper that is still starting (imports, tokenizer)."""
_MEMORY_LIMIT_BYTES = 2 << 30
"""Address space the helper may add while rendering (a template can build huge
strings faster than the deadline passes)."""


def _write(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("template helper closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("template helper closed its pipe")
    return pickle.loads(data)


class TemplateSandbox:
    """One helper process at a time; `render()` calls are served one after another."""

    def __init__(self, tokenizer: Any, timeout_s: float) -> None:
        self._tokenizer_bytes = pickle.dumps(tokenizer)
        self.timeout_s = timeout_s
        self._proc: Optional[subprocess.Popen] = None
        self._loaded = threading.Event()
        self._lock: Optional[asyncio.Lock] = None
        self._proc_lock = threading.Lock()

    def start(self) -> subprocess.Popen:
        """Start the helper if none is running. Returns at once: it imports and reads the
        tokenizer in the background, so that cost is not a request's (nor its deadline's)."""
        with self._proc_lock:
            if self._proc is None or self._proc.poll() is not None:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vllm.entrypoints.openai.template_sandbox"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
                self._proc, self._loaded = proc, threading.Event()
                threading.Thread(target=self._handshake, args=(proc, self._loaded),
                                 name="vllm-template-sandbox", daemon=True).start()
            return self._proc

    def _handshake(self, proc: subprocess.Popen, loaded: threading.Event) -> None:
        try:
            self._exchange(proc, self._tokenizer_bytes)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError):
            pass  # the helper died; render() finds it gone
        finally:
            loaded.set()

    def stop(self) -> None:
        with self._proc_lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Kill the helper (mid-render) and have a fresh one loading for the next request."""
        self.stop()
        self.start()

    async def render(self, **job: Any) -> str:
        """chat_utils.apply_chat_template(tokenizer, **job) in the helper, within timeout_s.

        Raises BadRequestError for a template error or a render past the deadline; a
        cancelled caller (client gone) kills the render too.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            proc, loaded = self.start(), self._loaded
            if not loaded.is_set():
                await asyncio.to_thread(loaded.wait, _READY_TIMEOUT_S)
            if not loaded.is_set() or proc.poll() is not None:
                self.stop()
                raise InternalServerError("The chat template sandbox process could not "
                                          "start; see the server log.")
            try:
                reply = await asyncio.wait_for(asyncio.to_thread(self._exchange, proc, job),
                                               self.timeout_s)
            except asyncio.TimeoutError:
                self.restart()
                raise BadRequestError(f"The chat template did not finish rendering within "
                                      f"{self.timeout_s:g} s.", param="chat_template") from None
            except BaseException:  # cancelled (client gone) or the helper died
                self.restart()
                raise
        if reply[0] == "ok":
            return reply[1]
        raise BadRequestError(reply[1], param=reply[2])

    @staticmethod
    def _exchange(proc: subprocess.Popen, message: Any) -> Any:
        _write(proc.stdin, message)
        return _read(proc.stdout)


def _limit_memory() -> None:
    """Let the address space grow by at most _MEMORY_LIMIT_BYTES from here on."""
    try:
        import os
        import resource
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = used + _MEMORY_LIMIT_BYTES
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass  # not Linux: the deadline alone bounds the helper


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from vllm.entrypoints.openai.chat_utils import apply_chat_template
    tokenizer = pickle.loads(_read(stdin))
    _limit_memory()
    _write(stdout, "ready")
    while True:
        try:
            job = _read(stdin)
        except EOFError:
            return
        try:
            reply: tuple = ("ok", apply_chat_template(tokenizer, **job))
        except BadRequestError as e:
            reply = ("error", e.message, e.param)
        except Exception as e:  # noqa: BLE001 - MemoryError, RecursionError...: the template's
            reply = ("error", f"Could not apply the chat template: {type(e).__name__}: {e}",
                     "chat_template")
        _write(stdout, reply)


def main() -> None:
    import os
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this ends
    try:
        os.nice(10)
    except OSError:
        pass
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    _serve(sys.stdin.buffer, stdout)


if __name__ == "__main__":
    main()

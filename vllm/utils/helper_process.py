"""A killable helper process that runs one job at a time for its parent.

Some work a request brings is a program of the client's: a chat template it supplied,
a grammar whose compile can take minutes and gigabytes. Such work runs in a helper
process, where a deadline or a memory bound is enforced by killing it, which no
thread can be. This module is the plumbing both users share: the pipe protocol
(length-prefixed pickles over the helper's stdin/stdout), starting a helper and its
handshake, and the helper side's set-up.

Protocol: the parent starts `python -m MODULE`, sends one handshake message and reads
one answer (the helper is "loaded"); then one job in, one reply out, until stdin closes
(which the parent's death also causes).
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Optional

_HEADER = struct.Struct("<Q")


def write_message(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("helper process closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("helper process closed its pipe")
    return pickle.loads(data)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 when it is gone or not on Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HelperProcess:
    """One helper: started at once, loaded (handshake answered) in the background."""

    def __init__(self, module: str, handshake: Any, name: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.loaded = threading.Event()
        self.handshake_reply: Any = None
        threading.Thread(target=self._handshake, args=(handshake,), name=name,
                         daemon=True).start()

    def _handshake(self, handshake: Any) -> None:
        try:
            self.handshake_reply = self.exchange(handshake)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError):
            pass  # the helper died; its user finds it gone
        finally:
            self.loaded.set()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exchange(self, message: Any) -> Any:
        write_message(self.proc.stdin, message)
        return read_message(self.proc.stdout)

    def send(self, message: Any) -> None:
        write_message(self.proc.stdin, message)

    def wait_reply(self, deadline: float, poll_s: float,
                   still_wanted: Callable[[], Optional[str]]) -> Any:
        """The reply to the job sent, or the reason it was given up as a string tag:
        "timeout" (past `deadline`, monotonic), or what `still_wanted()` returned
        (checked every `poll_s`; None means keep waiting). Raises EOFError if the helper
        died. Giving up does not kill the helper: the caller does."""
        fd = self.proc.stdout.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if ready:
                return ("reply", read_message(self.proc.stdout))
            if time.monotonic() >= deadline:
                return ("timeout", None)
            reason = still_wanted()
            if reason is not None:
                return (reason, None)

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
        self.proc.wait()


def limit_address_space(extra_bytes: int) -> None:
    """Let this process's address space grow by at most `extra_bytes` from here on
    (a helper's backstop: an allocation past it fails instead of the machine's OOM
    killer choosing a victim)."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = used + extra_bytes
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass  # not Linux: the parent's own bounds alone hold the helper


def helper_main(serve: Callable[[IO[bytes], IO[bytes]], None]) -> None:
    """A helper's entry point: ignores Ctrl-C (its parent decides when it ends), runs
    at a lower priority than the server, keeps stray prints off the protocol pipe."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(10)
    except OSError:
        pass
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, stdout)

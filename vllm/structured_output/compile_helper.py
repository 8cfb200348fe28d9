"""The grammar-compile helper process (`python -m vllm.structured_output.compile_helper`).

It compiles one grammar at a time exactly as the engine would, so the engine learns
whether the compile fits its time and memory limits without risking its own process:
the parent watches the clock and this process's resident memory, and kills it past
either limit (vllm/structured_output/compile_pool.py). A compile that fits is then done
again in the engine, which needs the compiled object itself (xgrammar's serialized
form of a large grammar is a hundred times its size and slower than compiling it).

It also parses specs for the frontend's check (kind "validate": no tokenizer needed),
which for some schemas takes as long as a compile (a pattern `[a-z]{1,9999}` is
seconds of regex expansion) and so needs the same bounds.

Handshake: a `CompilerSetup`; the answer is "ready". Jobs: (kind, backend name,
GrammarSpec) with kind "compile" or "validate"; replies: ("ok",), ("error", message) or
("memory",).
"""
from __future__ import annotations

import logging
import pickle
from typing import IO, Any

from vllm.structured_output.backend_types import GrammarSpec
from vllm.structured_output.compile_pool import CompilerSetup
from vllm.utils.helper_process import (helper_main, limit_address_space, read_message,
                                       write_message)

logger = logging.getLogger(__name__)


class _Backends:

    def __init__(self, setup: CompilerSetup) -> None:
        self.setup = setup
        self._backends: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self._backends:
            self._backends[name] = self._build(name)
        return self._backends[name]

    def _build(self, name: str) -> Any:
        setup = self.setup
        if name == "xgrammar" and setup.xgrammar_tokenizer_info is not None:
            from vllm.structured_output.backend_xgrammar import XgrammarBackend
            return XgrammarBackend.from_tokenizer_info_json(setup.xgrammar_tokenizer_info)
        from vllm.transformers_utils.tokenizer import get_tokenizer
        tokenizer = get_tokenizer(setup.tokenizer, tokenizer_mode=setup.tokenizer_mode)
        stops = list(setup.stop_token_ids)
        if name == "xgrammar":
            from vllm.structured_output.backend_xgrammar import XgrammarBackend
            return XgrammarBackend(tokenizer, setup.vocab_size, stops)
        from vllm.structured_output.backend_guidance import GuidanceBackend
        return GuidanceBackend(tokenizer, setup.vocab_size, stops)


def probe_compile(backend: Any, spec: GrammarSpec) -> None:
    """Everything the engine does with a new spec before its first step: compile it and
    make a matcher's first bitmask (llguidance compiles lazily, in the matcher)."""
    import torch
    compiled = backend.compile(spec)
    grammar = backend.new_grammar(compiled)
    words = (backend.vocab_size + 31) // 32
    grammar.fill_bitmask(torch.full((1, words), -1, dtype=torch.int32), 0)


def validate(name: str, spec: GrammarSpec) -> None:
    """Parse the spec as backend `name` would, without a tokenizer (ValueError if bad)."""
    if name == "xgrammar":
        from vllm.structured_output.backend_xgrammar import validate_xgrammar
        validate_xgrammar(spec)
    else:
        from vllm.structured_output.backend_guidance import validate_guidance
        validate_guidance(spec)


def _reply(backends: _Backends, kind: str, name: str, spec: GrammarSpec) -> tuple:
    try:
        if kind == "validate":
            validate(name, spec)
        else:
            probe_compile(backends.get(name), spec)
        return ("ok",)
    except ValueError as e:
        return ("error", str(e))
    except MemoryError:
        return ("memory",)
    except Exception as e:  # noqa: BLE001 - the grammar's fault, reported as such
        return ("error", f"the grammar could not be compiled: {type(e).__name__}: {e}")


def _limit_cpu(seconds: float) -> None:
    """Let this process use at most `seconds` more CPU time (the kernel ends it past
    that): the parent's deadline holds even if the parent is gone."""
    try:
        import resource
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(used + seconds) + 1
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ImportError, ValueError, OSError):
        pass


def _exit_with_parent() -> None:
    """A thread that ends this process once its parent is gone (a compile holds the
    main thread in native code, with the GIL released, for as long as it takes)."""
    import os
    import threading
    import time
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="vllm-parent-watch", daemon=True).start()


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    _exit_with_parent()
    setup: CompilerSetup = read_message(stdin)
    backends = _Backends(setup)
    if setup.xgrammar_tokenizer_info is not None:
        backends.get("xgrammar")  # before "ready": its start is not a compile's time
    limit_address_space(4 * setup.max_memory_bytes + (1 << 30))
    write_message(stdout, "ready")
    while True:
        try:
            kind, name, spec = read_message(stdin)
        except (EOFError, pickle.UnpicklingError):
            return
        _limit_cpu(2 * setup.max_seconds + 5)
        write_message(stdout, _reply(backends, kind, name, spec))


def main() -> None:
    helper_main(_serve)


if __name__ == "__main__":
    main()

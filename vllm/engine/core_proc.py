"""The engine core's own process: the process side of `MPEngineCoreClient`.

Why a process: the core's step is CPU-bound torch work and the frontend's (HTTP, JSON,
tokenization, detokenization, stop strings) is CPU-bound Python; in one process they
take turns under the GIL. In its own process the core steps back to back while the
frontend turns the previous step's tokens into text.

The loop: take every message waiting on the input socket (block only when no request is
left to run), run one step, send its outputs with the scheduler's stats. Admin calls
("utilities") run between two steps, as in-process. The process exits when asked
(shutdown), when the frontend dies (its death pipe reads EOF), or when a step fails
(after telling the frontend why).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Optional

import zmq

from vllm.engine import serial
from vllm.engine.serial import MessageDecoder, MessageEncoder
from vllm.request import RequestStatus

logger = logging.getLogger(__name__)

IDLE_HEALTH_CHECK_MS = 1000
"""How often an idle core asks its executor whether every worker still lives."""


def run_engine_core(vllm_config: Any, input_addr: str, output_addr: str,
                    death_reader: Connection, core: Optional[Any] = None) -> None:
    """Entry point of the engine-core process. `core`: an EngineCore already initialized
    from `vllm_config` (an early core's, vllm/engine/core_launch.py); its own config,
    which holds the KV cache size, is the one reported."""
    from vllm.executor.multiproc_utils import exit_when_parent_dies, prefix_log_lines
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the frontend decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # forked: not the server's handler
    exit_when_parent_dies(death_reader)
    prefix_log_lines(None, kind="EngineCore")
    ctx = zmq.Context()
    inputs = ctx.socket(zmq.PULL)
    inputs.connect(input_addr)
    outputs = ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.LINGER, 2000)
    outputs.connect(output_addr)
    encoder = MessageEncoder()
    try:
        if core is None:
            from vllm.engine.core import EngineCore
            core = EngineCore(vllm_config)
        else:
            vllm_config = core.vllm_config
    except BaseException as exc:  # noqa: BLE001 - reported to the frontend, which raises
        outputs.send(encoder.encode(serial.FAILED, _portable(exc),
                                    traceback.format_exc()))
        _exit(inputs, outputs, ctx, 1)
    outputs.send(encoder.encode(serial.READY, {
        "num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks, "pid": os.getpid()}))
    _exit(inputs, outputs, ctx, run_off_main_thread(EngineCoreProc(core, inputs, outputs,
                                                                  encoder).run))


def run_off_main_thread(fn: Any) -> int:
    """`fn()` on a second thread (with the main thread's torch thread count).

    Measured: the steps of a 4096-wide model on 8k-token batches grew the process by
    750 MiB of freed-but-kept heap when they ran on the main thread, by 85 MiB on
    another one, whose allocations glibc serves from an arena that returns memory (the
    in-process server always stepped on its own thread)."""
    import torch
    num_threads = torch.get_num_threads()
    result = [1]

    def target() -> None:
        torch.set_num_threads(num_threads)
        result[0] = fn()

    thread = threading.Thread(target=target, name="vllm-engine-core")
    thread.start()
    thread.join()
    return result[0]


def _exit(inputs: Any, outputs: Any, ctx: Any, code: int) -> None:
    """Flush the last messages (at most 2 s), then leave without interpreter teardown
    (seconds with torch loaded; the frontend waits for this exit)."""
    inputs.close(linger=0)
    outputs.close(linger=2000)
    ctx.term()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - closed stream: nothing to flush
            pass
    os._exit(code)


def _portable(exc: BaseException) -> Any:
    """The exception itself when it pickles (a ValueError stays one), else its text."""
    import pickle
    try:
        pickle.dumps(exc)
        return MessageEncoder.opaque(exc)
    except Exception:  # noqa: BLE001 - unpicklable: travels as text
        return MessageEncoder.opaque(RuntimeError(f"{type(exc).__name__}: {exc}"))


class EngineCoreProc:
    """Runs an EngineCore from the messages of one frontend."""

    def __init__(self, core: Any, inputs: Any, outputs: Any, encoder: MessageEncoder) -> None:
        self.core = core
        self.inputs = inputs
        self.outputs = outputs
        self.encoder = encoder
        self.decoder = MessageDecoder()
        self._last_stats: Optional[Any] = None

    def run(self) -> int:
        """Serve until shutdown (0) or a failed step (1)."""
        try:
            while True:
                idle = not self.core.scheduler.has_requests()
                if not self._handle_inputs(block=idle):
                    self.core.shutdown()
                    return 0
                if self.core.scheduler.has_requests():
                    self._send_outputs(self.core.step())
                else:
                    self._send_outputs([])
        except BaseException as exc:  # noqa: BLE001 - the frontend fails its requests
            logger.exception("The engine core stopped with an error.")
            self._send_dead(f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return 1

    # ----------------------------------------------------------- inputs
    def _handle_inputs(self, block: bool) -> bool:
        """Apply every waiting message; False when the frontend asked to shut down."""
        if block:
            # Idle: wake up now and then to notice a worker that died meanwhile (its
            # error ends this process as a failed step would).
            while not self.inputs.poll(IDLE_HEALTH_CHECK_MS):
                self.core.check_health()
        while True:
            try:
                data = self.inputs.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            kind, *fields = self.decoder.decode(data)
            if kind == serial.SHUTDOWN:
                return False
            self._handle(kind, fields)

    def _handle(self, kind: str, fields: list[Any]) -> None:
        if kind == serial.ADD:
            self.core.add_request(fields[0])
        elif kind == serial.ABORT:
            ids, status = fields
            self.core.abort_requests(ids, RequestStatus(status))
        elif kind == serial.UTILITY:
            self._run_utility(*fields)
        else:
            raise RuntimeError(f"Unknown engine-core message {kind!r}.")

    def _run_utility(self, call_id: int, name: str, args: tuple, kwargs: dict) -> None:
        try:
            reply = (True, MessageEncoder.opaque(self.core.call_utility(name, *args,
                                                                        **kwargs)))
        except Exception as exc:  # noqa: BLE001 - raised again in the caller
            reply = (False, _portable(exc))
        self._send(self.encoder.encode(serial.UTILITY_REPLY, call_id, *reply))

    def _send(self, data: bytes) -> None:
        self.outputs.send(data)

    def _send_dead(self, reason: str, tb: str) -> None:
        self._send(self.encoder.encode(serial.DEAD, reason, tb))

    # ---------------------------------------------------------- outputs
    def _send_outputs(self, outputs: list[Any]) -> None:
        """A step's outputs with the stats they leave; nothing when neither changed."""
        stats = self.core.get_stats()
        if not outputs and stats == self._last_stats:
            return
        self._last_stats = stats
        self._send(self.encoder.encode(serial.OUTPUTS, serial.pack_outputs(outputs),
                                       MessageEncoder.opaque(stats)))

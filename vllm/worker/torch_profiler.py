"""start_profile / stop_profile: the torch profiler on each worker (vLLM's profiling).

Enabled by VLLM_TORCH_PROFILER_DIR, as in vLLM: each rank writes its trace there when
the profile stops (`<name>.<timestamp>.pt.trace.json.gz`, readable by Perfetto,
chrome://tracing or TensorBoard). Without the variable, starting a profile is refused.
On HPU the runner's phases (prompt/decode passes with their buckets, see
vllm/hpu/profiler.py) appear in the trace as named ranges.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from vllm import envs

logger = logging.getLogger(__name__)


def profiler_dir() -> Optional[str]:
    """VLLM_TORCH_PROFILER_DIR, absolute; None when profiling is off."""
    directory = envs.VLLM_TORCH_PROFILER_DIR
    return os.path.abspath(os.path.expanduser(directory)) if directory else None


def check_profiler_enabled() -> str:
    """The trace directory; RuntimeError (vLLM's) when profiling is not enabled."""
    directory = profiler_dir()
    if directory is None:
        raise RuntimeError("Profiler is not enabled: set VLLM_TORCH_PROFILER_DIR to the "
                           "directory the traces should be written to.")
    return directory


class WorkerProfiler:
    """One rank's torch profiler, started and stopped on request."""

    def __init__(self, worker_name: str, device_type: str) -> None:
        self.worker_name = worker_name
        self.device_type = device_type
        self._profiler: Optional[torch.profiler.profile] = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def start(self) -> None:
        directory = check_profiler_enabled()
        if self._profiler is not None:
            raise ValueError("The profiler is already running; call stop_profile() first.")
        os.makedirs(directory, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=envs.VLLM_TORCH_PROFILER_RECORD_SHAPES,
            with_stack=envs.VLLM_TORCH_PROFILER_WITH_STACK,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                directory, worker_name=self.worker_name, use_gzip=True))
        self._profiler.start()
        logger.info("Torch profiler started; the trace goes to %s.", directory)

    def stop(self) -> None:
        if self._profiler is None:
            raise ValueError("The profiler is not running; call start_profile() first.")
        profiler, self._profiler = self._profiler, None
        profiler.stop()  # writes the trace (on_trace_ready)
        logger.info("Torch profiler stopped; trace written to %s.", profiler_dir())

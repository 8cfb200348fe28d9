"""start_profile / stop_profile: the torch profiler on each worker (vLLM's profiling).

Enabled by --profiler-config (vLLM's `ProfilerConfig`), or by the deprecated
VLLM_TORCH_PROFILER_DIR it replaced: each rank writes its trace there when the profile
stops (`<name>.<timestamp>.pt.trace.json.gz`, readable by Perfetto,
chrome://tracing or TensorBoard). Without either, starting a profile is refused.
On HPU the runner's phases (prompt/decode passes with their buckets, see
vllm/hpu/profiler.py) appear in the trace as named ranges.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

import torch

from vllm import envs

logger = logging.getLogger(__name__)


_warned_deprecated_env = False


def effective_profiler_config(profiler_config: Any = None) -> Any:
    """The `ProfilerConfig` in force: --profiler-config's, else one made from the
    deprecated VLLM_TORCH_PROFILER_* variables (read when asked, with a warning once);
    None when profiling is off."""
    from vllm.config import ProfilerConfig
    if profiler_config is not None and profiler_config.enabled:
        return profiler_config
    if not envs.VLLM_TORCH_PROFILER_DIR:
        return None
    global _warned_deprecated_env
    if not _warned_deprecated_env:
        _warned_deprecated_env = True
        logger.warning("VLLM_TORCH_PROFILER_DIR is deprecated: use --profiler-config "
                       "'{\"profiler\": \"torch\", \"torch_profiler_dir\": \"%s\"}'.",
                       envs.VLLM_TORCH_PROFILER_DIR)
    return ProfilerConfig(profiler="torch", torch_profiler_dir=envs.VLLM_TORCH_PROFILER_DIR,
                          torch_profiler_with_stack=envs.VLLM_TORCH_PROFILER_WITH_STACK,
                          torch_profiler_record_shapes=envs.VLLM_TORCH_PROFILER_RECORD_SHAPES)


def profiler_dir(profiler_config: Any = None) -> Optional[str]:
    """The trace directory, absolute; None when profiling is off."""
    config = effective_profiler_config(profiler_config)
    if config is None:
        return None
    return os.path.abspath(os.path.expanduser(config.torch_profiler_dir))


def check_profiler_enabled(profiler_config: Any = None) -> str:
    """The trace directory; RuntimeError (vLLM's) when profiling is not enabled."""
    directory = profiler_dir(profiler_config)
    if directory is None:
        raise RuntimeError("Profiler is not enabled: pass --profiler-config '{\"profiler\": "
                           "\"torch\", \"torch_profiler_dir\": DIR}' (or set the deprecated "
                           "VLLM_TORCH_PROFILER_DIR) with the directory the traces should be "
                           "written to.")
    return directory


class WorkerProfiler:
    """One rank's torch profiler, started and stopped on request."""

    def __init__(self, worker_name: str, device_type: str,
                 profiler_config: Any = None) -> None:
        self.worker_name = worker_name
        self.device_type = device_type
        self.profiler_config = profiler_config
        self._profiler: Optional[torch.profiler.profile] = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def start(self) -> None:
        directory = check_profiler_enabled(self.profiler_config)
        config = effective_profiler_config(self.profiler_config)
        if self._profiler is not None:
            raise ValueError("The profiler is already running; call stop_profile() first.")
        os.makedirs(directory, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=config.torch_profiler_record_shapes,
            with_stack=config.torch_profiler_with_stack,
            profile_memory=config.torch_profiler_with_memory,
            with_flops=config.torch_profiler_with_flops,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                directory, worker_name=self.worker_name,
                use_gzip=config.torch_profiler_use_gzip))
        self._profiler.start()
        logger.info("Torch profiler started; the trace goes to %s.", directory)

    def stop(self) -> None:
        if self._profiler is None:
            raise ValueError("The profiler is not running; call start_profile() first.")
        profiler, self._profiler = self._profiler, None
        profiler.stop()  # writes the trace (on_trace_ready)
        logger.info("Torch profiler stopped; trace written to %s.",
                    profiler_dir(self.profiler_config))

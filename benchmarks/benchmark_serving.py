"""Online serving benchmark against an OpenAI-compatible server: `vllm bench serve`'s code, vllm/benchmarks/serve.py.

Kept as a script (`python benchmarks/benchmark_serving.py ...`, vLLM's path) and as a module
(`benchmarks.benchmark_serving` is the package module itself).
"""
import os
import sys

if __package__ in (None, ""):
    # Run as a file: keep this folder off sys.path, so that datasets.py here never
    # shadows the library of that name.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

from vllm.benchmarks import serve as _impl  # noqa: E402

if __name__ == "__main__":
    _impl.main(*([_impl.build_parser().parse_args()] if hasattr(_impl, "build_parser") else []))
else:
    sys.modules[__name__] = _impl

"""Package version; setup.py appends a platform suffix (e.g. +gaudi) at build time."""
try:
    from vllm._build_info import VERSION as __version__
except ImportError:
    __version__ = "0.1.0"

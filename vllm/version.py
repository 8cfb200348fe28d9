"""Package version; setup.py appends a platform suffix (e.g. +gaudi) at build time."""
try:
    from vllm._build_info import VERSION as __version__
except ImportError:
    __version__ = "0.1.0"


def _version_tuple(version: str) -> tuple:
    """'0.1.0+gaudi' -> (0, 1, 0, 'gaudi'), as vLLM's __version_tuple__."""
    base, _, local = version.partition("+")
    parts: list = [int(p) if p.isdigit() else p for p in base.split(".")]
    return tuple(parts + ([local] if local else []))


__version_tuple__ = _version_tuple(__version__)

"""Small helpers shared across the package (vLLM's `vllm.utils` names)."""
from vllm.utils.argparse_utils import FlexibleArgumentParser, human_readable_int

__all__ = ["FlexibleArgumentParser", "human_readable_int"]

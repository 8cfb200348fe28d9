from vllm.attention.layer import Attention

__all__ = ["Attention"]

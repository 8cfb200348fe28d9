"""Tensor operations of the sampler, one family per file."""

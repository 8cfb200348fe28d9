"""Sampling: metadata for a batch, the sampler, its ops and logprobs."""

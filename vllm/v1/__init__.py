"""vLLM's `vllm.v1` import paths that users' code reaches (thin re-exports)."""

"""vLLM 0.32's package for the completions API (re-exports; see protocol.py)."""

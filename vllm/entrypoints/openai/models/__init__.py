"""vLLM 0.32's package for the models API (re-exports; see protocol.py)."""

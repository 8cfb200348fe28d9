"""vLLM 0.32's package for the Responses API (re-exports; see protocol.py)."""

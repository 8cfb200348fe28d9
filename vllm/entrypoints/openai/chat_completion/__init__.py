"""vLLM 0.32's package for the chat completions API (re-exports; see protocol.py)."""

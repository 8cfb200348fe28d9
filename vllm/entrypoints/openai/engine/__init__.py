"""vLLM 0.32's package for the models shared by every API (re-exports; see protocol.py)."""

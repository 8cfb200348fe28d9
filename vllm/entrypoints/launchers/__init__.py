"""vLLM 0.32's package for the server launchers (re-exports; see cli_args.py)."""

"""State-space (Mamba) layers: plain-torch kernels (ops.py) and the Mamba2 mixer."""

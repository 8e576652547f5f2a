"""backends: what the decoder calls per device: cpu (native kernels, row ops, token masks) and cuda (Triton kernels, graphs, torch ops)."""

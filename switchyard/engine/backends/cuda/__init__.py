"""backends.cuda: Triton decode kernels (kernels), CUDA-graph capture and buckets (graphs), fused torch ops (ops)."""

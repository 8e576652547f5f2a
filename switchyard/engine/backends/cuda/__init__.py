"""backends.cuda: Triton decode kernels (kernels; paged_attention: the decode attention; prefill_kernels), CUDA graphs (graphs), compiled torch ops (ops), the rank's GPU (device)."""

"""The tensor-parallel inference server behind the gateway's pools.

  switchyard models pull smollm2-135m
  switchyard engine serve --model smollm2-135m --tp 3 --collective auto --port 8201
  torchrun --nproc-per-node 3 -m switchyard.cli engine serve --model smollm2-135m --tp 3

Modules, one job each: config (model shape from GGUF/config.json, TP checks), weights (one
rank's shard, dequantized), linear (dense or int4 projections), model (the TP decoder and its
KV cache), comm (ring / oneshot / auto all-reduce), runner (process group, step broadcast),
sampling, scheduler (continuous batching), tokenizer + tools (chat template, Hermes tool
calls), protocol (OpenAI validation), server (HTTP), serve (rank 0), launch (ranks,
supervision), registry (`models pull`), cli.
"""

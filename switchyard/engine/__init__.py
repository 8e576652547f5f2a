"""The tensor-parallel inference server behind the gateway's pools.

  switchyard models pull smollm2-135m
  switchyard engine serve --model smollm2-135m --tp 3 --collective auto --port 8201
  torchrun --nproc-per-node 3 -m switchyard.cli engine serve --model smollm2-135m --tp 3

Subpackages by role, each importing only those below it (import-linter holds it):

  serving/    HTTP (http, tokenize, metrics), rank 0's start-up (rank0), rank processes
              (launch), CLI, request validation (protocol), model names (registry)
  core/       sequences and the scheduler (decides what runs), KV blocks, the output stage
  runner/     one rank's model runner, a step's broadcast, typed options, collectives
  model/      config, weights, projections, the Step a forward takes, the ONE decoder, its GPU
              decode steps as CUDA graphs (graph_runner), its start-up check (warmup)
  backends/   how a layer runs per device, one interface, named in one registry: cpu (native
              kernels, row ops) | torch (any device) | cuda (Triton kernels, graphs)
  chat/       tokenizer and template, tools, tool-call streaming, structured output, grammar
  errors      the engine's exception tree
"""

"""One rank's model runner: process group setup, weight loading, and the step protocol.

Rank 0 decides each step and broadcasts it (runner/broadcast.py); every rank runs the same
forward. When idle, rank 0 broadcasts a heartbeat so that followers'
collective timeouts stay short without firing, and so that a dead rank is noticed within
about a second even when no request is running.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from switchyard.engine.backends.cpu.native import load as load_native
from switchyard.engine.backends.cuda.device import rank_device
from switchyard.engine.errors import ConfigError
from switchyard.engine.model.config import ModelConfig
from switchyard.engine.model.decoder import Decoder
from switchyard.engine.model.step import Step
from switchyard.engine.model.weights import Shard, load_shard, open_source
from switchyard.engine.runner import broadcast
from switchyard.engine.runner.comm import GPU_ENV, CollectiveBackend, SingleRank, make_backend
from switchyard.engine.runner.options import EngineOptions, auto_kv_blocks, resolved_len

log = logging.getLogger("switchyard.engine.runner.model_runner")

SMALL_STEP_TOKENS = 4  # steps with at most this many tokens count as small (see setup)


def pick_threads(tp: int, requested: int = 0) -> int:
    """Threads per rank: the cores divided among the local ranks (at least one each)."""
    if requested > 0:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", tp))
    return max(1, cores // max(1, local))


def resolve_dtype(requested: str, src: Any) -> str:
    """`auto`: int4 weights (bfloat16 activations) when the file itself is 4-bit and the CPU
    int4 kernel exists; float32 otherwise."""
    if requested != "auto":
        return requested
    from switchyard.engine.model.linear import int4_supported
    from switchyard.engine.model.weights import GGUFSource

    if isinstance(src, GGUFSource) and int4_supported():
        kinds = {t.tensor_type.name for t in src.reader.tensors if t.name.endswith("ffn_up.weight")}
        if kinds and all(k.startswith("Q4") for k in kinds):
            return "int4"
    return "float32"


class Runner:
    """Owns the model shard and the collectives of one rank."""

    def __init__(self, opts: EngineOptions, rank: int, world: int) -> None:
        self.opts = opts
        self.rank, self.world = rank, world
        self.comm: CollectiveBackend = SingleRank()
        self.collective_info: dict[str, Any] = {"mode": opts.collective, "chosen": "none"}
        self.group: dist.ProcessGroup | None = None
        self.config: ModelConfig | None = None
        self.model: Decoder | None = None
        self.ctrl_group: dist.ProcessGroup | None = None  # the step protocol's group (CPU tensors)
        self.source: Any = None
        self.load_seconds = 0.0
        self.big_threads = self.small_threads = self._threads = 1
        # What setup resolved from the options (the options themselves stay as given).
        self.max_model_len = opts.max_model_len
        self.dtype = opts.dtype  # auto -> int4 | float32 (CPU), bfloat16 | float32 (GPU)
        self.kv_cache_dtype = opts.kv_cache_dtype
        self.num_kv_blocks = opts.num_kv_blocks

    def setup(self) -> None:
        # Large steps are compute-bound and use every core this rank has. Small decode steps
        # on torch's ops alone are dispatch-bound: extra OpenMP threads only add synchronisation
        # (badly so on a busy machine), so they run on one. With the native kernels the matmuls
        # and attention split well even at batch 1 (measured: 9.5 ms a step on 2 threads vs
        # 12.0 on 1), so every step uses every core.
        self.big_threads = pick_threads(self.world, self.opts.threads)
        native = load_native()[0] is not None and self.opts.device == "cpu"
        self.small_threads = self.big_threads if self.opts.threads > 0 or native else 1
        self._threads = self.big_threads
        torch.set_num_threads(self.big_threads)
        device = torch.device(self.opts.device)
        if device.type == "cuda":
            device = rank_device(self.rank)
        start = time.monotonic()
        src = open_source(self.opts.model_path)
        self.source = src
        cfg = src.config
        cfg.check_tp(self.world)  # before any collective: every rank refuses the same way
        if device.type == "cuda":
            # Before NCCL starts: the one-shot path must never use NVLink multicast (NVLS).
            for k, v in GPU_ENV.items():
                os.environ[k] = v
        if self.world > 1:
            if not dist.is_initialized():
                # Long timeout for start-up (ranks load at different speeds), short one for steps.
                dist.init_process_group("gloo" if device.type == "cpu" else "nccl", rank=self.rank,
                                        world_size=self.world, timeout=timedelta(seconds=300))
            self.group = dist.new_group(list(range(self.world)),
                                        timeout=timedelta(seconds=self.opts.collective_timeout_s))
            cpu_group = self.group if device.type == "cpu" else dist.new_group(
                list(range(self.world)), backend="gloo", timeout=timedelta(seconds=60))
            self.ctrl_group = cpu_group  # headers and token ids are CPU tensors: gloo even on GPU
        weights = load_shard(src, self.rank, self.world)
        max_len = self.max_model_len = resolved_len(self.opts, cfg.max_position)
        bs = self.opts.block_size
        blocks = self.opts.num_kv_blocks or auto_kv_blocks(self.opts.max_num_seqs, max_len, bs)
        if blocks * bs < max_len:  # a lone sequence must always fit: preemption relies on it
            raise ConfigError(f"{blocks} KV blocks of {bs} positions ({blocks * bs}) cannot hold one sequence of "
                              f"the maximum length, {max_len}: raise --num-kv-blocks or lower --max-model-len")
        if self.world > 1:
            dist.barrier()
            self.comm, self.collective_info = make_backend(self.opts.collective, self.rank, self.world,
                                                           self.group, cpu_group, device)
        self.config = cfg
        if device.type == "cuda":
            # bf16 weights and KV cache on the GPU (int4 is a CPU kernel); float32 on request.
            self.dtype = "float32" if self.opts.dtype == "float32" else "bfloat16"
        else:
            self.dtype = resolve_dtype(self.opts.dtype, src)
        self.model = Decoder(cfg, Shard(self.rank, self.world, cfg), weights, self.comm,
                             max_slots=self.opts.max_num_seqs, max_len=max_len, backend=self.opts.backend,
                             device=device, dtype=self.dtype, kv_dtype=self.opts.kv_cache_dtype, block_size=bs,
                             num_blocks=blocks, cuda_graphs=self.opts.cuda_graphs,
                             prefill_fp8=self.opts.prefill_fp8)
        if device.type == "cuda":
            # Check, compile and capture now (every rank: the captures' collectives pair up), not
            # on the first requests.
            log.info("GPU warm-up (backend check, fused ops, decode graphs) took %.1fs", self.model.warmup())
        self.num_kv_blocks = self.model.num_blocks
        self.kv_cache_dtype = str(self.model.k_cache.dtype).removeprefix("torch.")
        del weights
        self.load_seconds = time.monotonic() - start
        if self.world > 1:
            dist.barrier(group=self.group)

    # -- the step protocol ------------------------------------------------------------------

    @property
    def chunked_prefill(self) -> bool:
        """Whether a prefill step may continue a prompt whose start is already cached."""
        return self.model is not None and self.model.chunked_prefill

    def signal(self, kind: int) -> None:
        """Rank 0, between steps: a heartbeat while idle, or STOP."""
        if self.world > 1:
            broadcast.send(kind, self.ctrl_group)

    def run(self, step: Step) -> torch.Tensor:
        """Rank 0: broadcast the step to the followers, then run it here too."""
        if self.world > 1:
            broadcast.send(broadcast.STEP, self.ctrl_group, step)
        return self.step(step)

    def step(self, step: Step) -> torch.Tensor:
        """Run one forward on this rank; returns the full-vocab logits [B, vocab]."""
        assert self.model is not None and self.config is not None
        want = self.small_threads if step.num_tokens <= SMALL_STEP_TOKENS else self.big_threads
        if want != self._threads:
            torch.set_num_threads(want)
            self._threads = want
        local = self.model.forward(step)
        full = self.comm.all_gather_last(local)
        return full[:, : self.config.vocab_size]

    def follow(self) -> int:
        """Follower ranks: run rank 0's steps until told to stop. Returns an exit code."""
        while True:
            kind, step = broadcast.receive(self.ctrl_group)
            if kind == broadcast.STOP:
                return 0
            if step is not None:
                self.step(step)

    def shutdown(self) -> None:
        if self.world > 1 and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # the group may already be broken; we are exiting anyway
                pass

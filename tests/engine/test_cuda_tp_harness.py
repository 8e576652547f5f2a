"""One rank of a TP check of the GPU model's sharding: started by test_cuda.py with
torchrun-style env vars; not a test module itself.

  test_cuda_tp_harness.py MODEL_DIR OUT COLLECTIVE [cpu|cuda] [FOLLOW.pt]

cpu: float32 on CPU, gloo. cuda: bf16 on GPU `rank`, NCCL plus a gloo control group as the
engine's runner sets them up, decode steps replayed as CUDA graphs with the all-reduces inside.
Every rank saves the gathered logits of each step to OUT.rank<r>.pt and rank 0 the
collective's description (what `auto` chose and why) to OUT.json. With FOLLOW, the steps take
their greedy tokens from those saved logits (see test_cuda.scenario).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

if __name__ == "__main__":
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cuda import scenario

    from switchyard.engine.model.decoder import Decoder
    from switchyard.engine.model.weights import Shard, load_shard, open_source
    from switchyard.engine.runner.comm import GPU_ENV, make_backend

    torch.set_num_threads(1)
    model_dir, out, collective = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    kind = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    follow = torch.load(sys.argv[5]) if len(sys.argv) > 5 else None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if kind == "cuda":
        os.environ.update(GPU_ENV)  # never NVLink multicast
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timedelta(seconds=120),
                                device_id=device)
        group = dist.new_group(list(range(world)))
        cpu_group = dist.new_group(list(range(world)), backend="gloo")
        dtype = torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        group = cpu_group = None
    src = open_source(model_dir)
    cfg = src.config
    comm, info = make_backend(collective, rank, world, group, cpu_group, device, sweep_iters=2 if kind == "cpu" else 9)
    m = Decoder(cfg, Shard(rank, world, cfg), load_shard(src, rank, world), comm, max_slots=8, max_len=64,
                device=str(device), dtype=dtype, backend="torch")

    class Gathered:
        def forward(self, *a: object) -> torch.Tensor:
            return comm.all_gather_last(m.forward(*a))[:, : cfg.vocab_size]  # type: ignore[arg-type]

    logits = scenario([Gathered()], cfg.vocab_size, decode_steps=2, follow=follow)[0]
    torch.save(logits, out.with_suffix(f".rank{rank}.pt"))
    if rank == 0:
        out.with_suffix(".json").write_text(json.dumps(
            {**info, "graphs": m.status()["graphs_captured"], "eager_batch_buckets": m.status()["eager_batch_buckets"]}, default=str))
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()

"""One rank of a TP check of the GPU model's sharding, run on CPU (gloo): started by
test_cuda.py with torchrun-style env vars; not a test module itself.

  test_cuda_tp_harness.py MODEL_DIR OUT COLLECTIVE  -> rank 0 saves the gathered logits
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

if __name__ == "__main__":
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cuda import scenario

    from switchyard.engine.comm import make_backend
    from switchyard.engine.cuda_model import CudaModel
    from switchyard.engine.weights import Shard, load_shard, open_source

    torch.set_num_threads(1)
    model_dir, out, collective = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    src = open_source(model_dir)
    cfg = src.config
    comm, _ = make_backend(collective, rank, world, None, None, torch.device("cpu"), sweep_iters=2)
    m = CudaModel(cfg, Shard(rank, world, cfg), load_shard(src, rank, world), comm, max_slots=8, max_len=64,
                  device="cpu", dtype=torch.float32)

    class Gathered:
        def forward(self, *a: object) -> torch.Tensor:
            return comm.all_gather_last(m.forward(*a))[:, : cfg.vocab_size]  # type: ignore[arg-type]

    logits = scenario([Gathered()], cfg.vocab_size, decode_steps=2)[0]
    if rank == 0:
        torch.save(logits, out)
    dist.destroy_process_group()

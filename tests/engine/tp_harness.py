"""One rank of a multi-process engine check, started by the tests with torchrun-style env vars.

  tp_harness.py model MODEL_DIR OUT COLLECTIVE   -> rank 0 saves logits of a prefill + decode run
  tp_harness.py comm OUT                         -> rank 0 saves what the collectives checks found
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from switchyard.engine.model.step import Step
from switchyard.engine.runner.broadcast import STOP
from switchyard.engine.runner.comm import OneShotBackend, RingBackend, make_backend
from switchyard.engine.runner.model_runner import Runner
from switchyard.engine.runner.options import EngineOptions

PROMPTS = [[5, 17, 99, 3, 42], [7, 7, 200, 13, 1, 90, 61, 8, 250]]


def run_model(model_dir: Path, out: Path, collective: str) -> None:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    r = Runner(EngineOptions(model_path=model_dir, tp=world, collective=collective, max_num_seqs=4,
                             max_model_len=64, threads=1, dtype="float32"), rank, world)
    r.setup()
    if rank != 0:
        r.follow()
        r.shutdown()
        return
    T = max(map(len, PROMPTS))
    ids = torch.zeros(2, T, dtype=torch.int64)
    for i, p in enumerate(PROMPTS):
        ids[i, : len(p)] = torch.tensor(p)
    lens = torch.tensor([len(p) for p in PROMPTS])
    slots = torch.tensor([0, 1])
    pos = torch.arange(T).expand(2, T).contiguous()
    assert r.model is not None
    tables = r.model.slot_tables(slots)  # every rank gets rank 0's block tables with the step
    logits = [r.run(Step(ids, pos, slots, lens, lens, 0, tables))]
    ctx = lens.clone()
    for _ in range(6):
        nxt = logits[-1].argmax(-1).view(2, 1)
        positions = ctx.view(2, 1).clone()
        ctx = ctx + 1
        one = torch.ones(2, dtype=torch.int64)
        logits.append(r.run(Step(nxt, positions, slots, one, ctx, 2, tables)))
    r.signal(STOP)
    torch.save({"logits": torch.stack(logits), "collective": r.collective_info}, out)
    r.shutdown()


def run_comm(out: Path) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    ring, one = RingBackend(None, world), OneShotBackend(None, world, torch.device("cpu"))
    found: dict[str, object] = {"exact_equal": True, "ranks_identical": True}
    for n in (1, 7, 1000, 4096, 65537):
        x = (torch.arange(n, dtype=torch.float32) % 61) - 30 + rank
        a, b = ring.all_reduce(x.clone()), one.all_reduce(x.clone())
        if not torch.equal(a, b):
            found["exact_equal"] = False
        g = torch.Generator().manual_seed(1000 * rank + n)
        y = one.all_reduce(torch.randn(n, generator=g))
        every = [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(every, y)
        if not all(torch.equal(every[0], e) for e in every):
            found["ranks_identical"] = False
    _, info = make_backend("auto", rank, world, None, None, torch.device("cpu"), sweep_iters=3)
    found["auto"] = info
    if rank == 0:
        out.write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "model":
        run_model(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    else:
        run_comm(Path(sys.argv[2]))
    # Results are written: leave without C++ static destructors, where gloo's threads can abort
    # the process ("terminate called without an active exception") after a clean run.
    sys.stdout.flush()
    os._exit(0)

"""Ring vs one-shot all-reduce latency on this machine (gloo, local ranks), 1 KB .. 4 MB, and
the crossover that `--collective auto` picks at the same world size.

  python bench/collectives.py [--ranks 2 3 4] [--iters 15]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path


def _rank(out: Path, iters: int) -> None:
    import torch
    import torch.distributed as dist

    from switchyard.engine.runner.comm import OneShotBackend, RingBackend, latency_sweep, make_backend

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    cpu = torch.device("cpu")
    rows = latency_sweep(RingBackend(None, world), OneShotBackend(None, world, cpu), cpu, None, iters=iters)
    _, auto = make_backend("auto", rank, world, None, None, cpu)
    if rank == 0:
        out.write_text(json.dumps({"rows": rows, "auto": {k: v for k, v in auto.items() if k != "sweep"}}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--_rank_out", default="")
    a = ap.parse_args()
    if a._rank_out:
        _rank(Path(a._rank_out), a.iters)
        return
    root = Path(__file__).resolve().parents[1]
    print(f"cpu cores: {os.cpu_count()}, gloo over loopback, median of {a.iters}, slowest rank")
    for world in a.ranks:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "r.json"
            port = _free_port()
            env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
            procs = [subprocess.Popen([sys.executable, __file__, "--iters", str(a.iters), "--_rank_out", str(out)],
                                      env={**env, "RANK": str(r)}) for r in range(world)]
            codes = [p.wait() for p in procs]
            if any(codes):
                print(f"{world} ranks: failed ({codes})")
                continue
            res = json.loads(out.read_text())
        print(f"\n{world} ranks            ring us   oneshot us   oneshot/ring")
        for row in res["rows"]:
            kb = row["bytes"] / 1024
            size = f"{kb:.0f} KB" if kb < 1024 else f"{kb / 1024:.0f} MB"
            print(f"  {size:>8}  {row['ring_us']:14.0f} {row['oneshot_us']:12.0f} "
                  f"{row['oneshot_us'] / row['ring_us']:12.2f}")
        auto = res["auto"]
        print(f"  auto picked: {auto['chosen']}, oneshot up to {auto['oneshot_up_to_bytes']} bytes "
              f"({auto['reason']})")


if __name__ == "__main__":
    main()

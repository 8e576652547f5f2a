"""Collective backends behind one interface: `ring`, `oneshot`, and `auto` (oneshot up to a
measured crossover size, ring above it, ring everywhere when oneshot fails its start-up test).

After start-up there is no fallback: a collective that raises stops the server (fail-stop).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from switchyard.engine.model.parallel import CollectiveBackend, SingleRank

__all__ = ["CollectiveBackend", "SingleRank", "make_backend"]  # the interface lives beside the decoder

log = logging.getLogger("switchyard.engine.runner.comm")

FORCE_FAIL_ENV = "SWITCHYARD_ONESHOT_FORCE_FAIL"
# One-shot must never use NVLink multicast (NVLS); set before any symmetric-memory use.
GPU_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}


class _Base:
    name = "base"

    def __init__(self, group: dist.ProcessGroup | None, world: int) -> None:
        self.group = group
        self.world = world

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's tensor along the last dim (vocab-parallel logits)."""
        if self.world == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=-1)



class RingBackend(_Base):
    """torch.distributed.all_reduce: gloo on CPU, NCCL on GPU."""

    name = "ring"

    def graph_safe(self, nbytes: int) -> bool:
        # NCCL all-reduces captured in our decode graphs hung on 2 H200s (torch 2.11: the
        # capture never returned), while one-shot's captured and replayed correctly. Steps
        # whose collectives go through NCCL run eagerly.
        return False

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        return t


class OneShotBackend(_Base):
    """Every rank receives every rank's input and sums it locally in rank order 0..N-1,
    so all ranks hold bit-identical results.

    CPU: gloo all_gather + local sum. GPU: torch symmetric memory one_shot_all_reduce
    (peer-to-peer loads, one kernel; multicast disabled).
    """

    name = "oneshot"

    def graph_safe(self, nbytes: int) -> bool:
        return nbytes <= self._max_bytes

    def __init__(self, group: dist.ProcessGroup | None, world: int, device: torch.device,
                 max_bytes: int = 8 << 20) -> None:
        super().__init__(group, world)
        self.device = device
        self._symm: dict[torch.dtype, torch.Tensor] = {}
        self._max_bytes = max_bytes
        self._group_name = group.group_name if group is not None else dist.group.WORLD.group_name

    def _gpu_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        buf = self._symm.get(dtype)
        if buf is None:
            import torch.distributed._symmetric_memory as symm_mem

            for k, v in GPU_ENV.items():
                os.environ[k] = v
            numel = self._max_bytes // torch.tensor([], dtype=dtype).element_size()
            buf = symm_mem.empty(numel, dtype=dtype, device=self.device)
            symm_mem.rendezvous(buf, self._group_name)
            self._symm[dtype] = buf
        return buf

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cuda":
            n = t.numel()
            buf = self._gpu_buffer(t.dtype)
            if n > buf.numel():
                raise RuntimeError(f"oneshot: message of {n} elements exceeds the {buf.numel()} buffer")
            buf[:n].copy_(t.reshape(-1))
            out = torch.ops.symm_mem.one_shot_all_reduce(buf[:n], "sum", self._group_name)
            t.copy_(out.view_as(t))
            return t
        flat = t.contiguous()
        parts = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(parts, flat, group=self.group)
        acc = parts[0]
        for p in parts[1:]:
            acc.add_(p)
        t.copy_(acc)
        return t


@dataclass
class AutoReport:
    """What `auto` decided at start-up; shown in /health."""

    chosen: str = "ring"
    crossover_bytes: int = 0
    reason: str = ""
    sweep: list[dict[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"mode": "auto", "chosen": self.chosen, "oneshot_up_to_bytes": self.crossover_bytes,
                "reason": self.reason, "sweep": self.sweep}


class AutoBackend(_Base):
    name = "auto"

    def __init__(self, ring: RingBackend, oneshot: OneShotBackend | None, crossover_bytes: int,
                 report: AutoReport) -> None:
        super().__init__(ring.group, ring.world)
        self.ring, self.oneshot = ring, oneshot
        self.crossover = crossover_bytes
        self.report = report

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.oneshot is not None and t.numel() * t.element_size() <= self.crossover:
            return self.oneshot.all_reduce(t)
        return self.ring.all_reduce(t)

    def graph_safe(self, nbytes: int) -> bool:
        return self.oneshot is not None and nbytes <= self.crossover


def _vote(ok: bool, cpu_group: dist.ProcessGroup | None) -> bool:
    """True only when every rank says True (MIN over a CPU group)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
    return bool(flag.item())


def _capable(device: torch.device) -> str:
    """Empty when this rank can run oneshot, else why not."""
    if os.environ.get(FORCE_FAIL_ENV, "") not in ("", "0"):
        return f"oneshot start-up test forced to fail by {FORCE_FAIL_ENV}"
    if device.type == "cuda":
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except Exception as e:  # pragma: no cover - depends on the build
            return f"torch symmetric memory unavailable: {e}"
        if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
            return "torch.ops.symm_mem.one_shot_all_reduce not available"
    return ""


_TEST_SIZES = (1, 7, 256, 1000, 4096, 65537)  # elements: aligned and not


def _exact_check(ring: RingBackend, one: OneShotBackend, rank: int, device: torch.device,
                 cpu_group: dist.ProcessGroup | None) -> str:
    """Exact-valued inputs (small integers): sums are exact in float32, so oneshot must equal
    ring bit for bit, and every rank must hold the same bytes."""
    for n in _TEST_SIZES:
        base = (torch.arange(n, dtype=torch.float32) % 97) - 48 + rank * 3
        a = base.to(device)
        b = base.to(device)
        ring.all_reduce(a)
        one.all_reduce(b)
        if not torch.equal(a, b):
            return f"oneshot differs from ring at {n} elements"
        checksum = torch.tensor([float(b.double().sum().item())], dtype=torch.float64)
        lo, hi = checksum.clone(), checksum.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=cpu_group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=cpu_group)
        if lo.item() != hi.item():
            return f"ranks disagree on the oneshot result at {n} elements"
    return ""


def _time(fn: object, t: torch.Tensor, iters: int) -> float:
    for _ in range(2):
        fn(t)  # type: ignore[operator]
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn(t)  # type: ignore[operator]
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


SWEEP_BYTES = tuple(1 << k for k in range(10, 23))  # 1 KB .. 4 MB


def latency_sweep(ring: RingBackend, one: OneShotBackend, device: torch.device,
                  cpu_group: dist.ProcessGroup | None, sizes: tuple[int, ...] = SWEEP_BYTES,
                  iters: int = 9) -> list[dict[str, float]]:
    """Median latency of each backend per size, the slowest rank's figure (all ranks agree)."""
    rows = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        r = _time(ring.all_reduce, t, iters)
        o = _time(one.all_reduce, t, iters)
        both = torch.tensor([r, o], dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=cpu_group)
        rows.append({"bytes": nbytes, "ring_us": both[0].item() * 1e6, "oneshot_us": both[1].item() * 1e6})
    return rows


def crossover_from(rows: list[dict[str, float]]) -> int:
    """The size up to which oneshot should be used: the threshold that minimises the summed
    relative latency over the sweep (one noisy point cannot move it far). 0: never oneshot."""
    best_t, best_cost = 0, float("inf")
    for t in [0] + [int(r["bytes"]) for r in rows]:
        cost = sum((r["oneshot_us"] if r["bytes"] <= t else r["ring_us"]) / min(r["oneshot_us"], r["ring_us"])
                   for r in rows)
        if cost < best_cost - 1e-9:
            best_t, best_cost = t, cost
    return best_t


def make_backend(kind: str, rank: int, world: int, group: dist.ProcessGroup | None,
                 cpu_group: dist.ProcessGroup | None, device: torch.device,
                 sweep_iters: int = 9) -> tuple[CollectiveBackend, dict[str, object]]:
    """Build the requested backend; returns it and a description for /health."""
    if world == 1:
        return SingleRank(), {"mode": kind, "chosen": "none", "reason": "single rank"}
    ring = RingBackend(group, world)
    if kind == "ring":
        return ring, {"mode": "ring", "chosen": "ring"}
    if kind == "oneshot":
        why = _capable(device)
        if why:
            raise RuntimeError(f"--collective oneshot cannot run: {why}")
        return OneShotBackend(group, world, device), {"mode": "oneshot", "chosen": "oneshot"}
    if kind != "auto":
        raise ValueError(f"unknown collective {kind!r} (ring, oneshot, auto)")
    report = AutoReport()
    why = _capable(device)
    one: OneShotBackend | None = None
    try:
        if not why:
            one = OneShotBackend(group, world, device)
    except Exception as e:  # a broken symmetric-memory setup is a vote "no", not a crash
        why = f"oneshot setup failed: {e}"
    local_ok = not why
    if not _vote(local_ok, cpu_group):
        report.reason = why or "another rank could not run oneshot (see its log)"
        # Every rank learns the first failing rank's reason is not shared; say which rank we are.
        log.warning("auto: using ring on every rank: %s", report.reason)
        return AutoBackend(ring, None, 0, report), report.as_dict()
    assert one is not None
    try:
        why = _exact_check(ring, one, rank, device, cpu_group)
    except Exception as e:
        why = f"oneshot test raised: {e}"
    if not _vote(not why, cpu_group):
        report.reason = why or "the oneshot test failed on another rank"
        log.warning("auto: using ring on every rank: %s", report.reason)
        return AutoBackend(ring, None, 0, report), report.as_dict()
    rows = latency_sweep(ring, one, device, cpu_group, iters=sweep_iters)
    report.sweep = rows
    report.crossover_bytes = crossover_from(rows)
    report.chosen = "oneshot+ring" if report.crossover_bytes else "ring"
    report.reason = (f"oneshot up to {report.crossover_bytes} bytes, ring above" if report.crossover_bytes
                     else "oneshot passed its test but was never faster than ring")
    log.info("auto: %s", report.reason)
    return AutoBackend(ring, one if report.crossover_bytes else None, report.crossover_bytes, report), \
        report.as_dict()

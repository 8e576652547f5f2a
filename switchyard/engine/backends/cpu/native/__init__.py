"""Native CPU kernels, compiled on first use with the system C compiler and cached.

The hot spots of a CPU decode step: the int4 matmul (`int4_*.c`), decode attention with its
KV-cache write (`decode_attn_*.c`), the row-wise steps between them (`rowops.c`: RMSNorm
with the residual add, SwiGLU, RoPE, the logits' top-k), and a layer's steps around its
attention in two calls (`layer.c`), in three builds, the first this CPU can run:
- `amx-bf16` (Intel Sapphire Rapids and later): the int4 matmul on AMX tile multiplies, the
  rest as `avx512-bf16`;
- `avx512-bf16` (AMD Zen 4, Intel Sapphire Rapids and later): bfloat16 dot products;
- `avx2` (x86 since Haswell and Zen 1): float32 FMA;
- `avx2-w4a8` (by name only, SWITCHYARD_NATIVE=avx2-w4a8): `avx2` with the int4 matmul on
  int8 activations, llama.cpp's scheme: faster at batch 1, not equal to the float32 engine.
Both take the same packed weights and arguments. Anything missing (the CPU flags, a
compiler, a failed build, SWITCHYARD_NATIVE=0) means `load()` says why and the engine uses
torch's ops instead. SWITCHYARD_NATIVE=<build> picks one build on a CPU that could run several.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from switchyard.datasets import cache_dir

log = logging.getLogger("switchyard.engine.backends.cpu.native")

COMMON_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]


class Int4Weight(ctypes.Structure):
    """layer.c's `struct int4_weight`: one int4 projection's packed codes, scales, offsets."""

    _fields_ = [("w", ctypes.c_void_p), ("s", ctypes.c_void_p), ("z", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64)]


@dataclass(frozen=True)
class Build:
    name: str
    cpu_flags: frozenset[str]  # as /proc/cpuinfo spells them
    cc_flags: tuple[str, ...]
    matmul: str  # int4_<matmul>.c
    attention: str  # decode_attn_<attention>.c
    # The int4 weights' layout (linear.py packs it): Q4_1-style records, float16 scale and
    # minimum beside each block's codes, read as one stream; or codes apart from float32
    # scales and offsets (the AMX kernel's, kept as it was: no AMX CPU here to test a change).
    int4_records: bool = True
    # Chosen only by name (SWITCHYARD_NATIVE=<name>), never as the best this CPU runs: a build
    # whose numbers differ from the others' (avx2-w4a8 rounds activations to int8).
    by_name_only: bool = False

    @property
    def sources(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / f"int4_{self.matmul}.c", here / f"decode_attn_{self.attention}.c", here / "rowops.c",
                here / "layer.c", here / "token_mask.c"]


_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "f16c"})
_AVX512_CC = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mf16c")
BUILDS = [  # best first
    Build("amx-bf16", _AVX512 | {"amx_tile", "amx_bf16"}, (*_AVX512_CC, "-mamx-tile", "-mamx-bf16"), "amx", "avx512",
          int4_records=False),
    Build("avx512-bf16", _AVX512, _AVX512_CC, "avx512", "avx512"),
    Build("avx2", frozenset({"avx2", "fma", "f16c"}), ("-mavx2", "-mfma", "-mf16c"), "avx2", "avx2"),
    Build("avx2-w4a8", frozenset({"avx2", "fma", "f16c"}), ("-mavx2", "-mfma", "-mf16c"), "avx2_w4a8", "avx2",
          by_name_only=True),
]


# How long an OpenMP worker spins before it sleeps, in libgomp's units. A CPU decode step calls
# the kernels ~120 times with single-threaded work between them, and a worker that slept in
# between takes tens of microseconds to wake on a VM (bench/engine.py on a 2-core Zen 3:
# 44.3 tok/s at batch 1 with libgomp's default, 54.2 with this). Read once, when torch loads
# libgomp.
SPINCOUNT = "10000000"


def keep_workers_spinning() -> None:
    """Call before torch is imported (the engine's ranks, the engine bench); a value set by
    the user wins."""
    os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (what benchmark figures are named by)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build(compiler: str, build: Build) -> Path:
    flags = [*build.cc_flags, *COMMON_FLAGS]
    # Headers count too: a kernel that includes a changed one must be rebuilt.
    inputs = [*build.sources, *sorted(Path(__file__).parent.glob("*.h"))]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in inputs) + " ".join([compiler, *flags]).encode())
    out = cache_dir("kernels") / f"switchyard-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: ranks starting together never load a half-written file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, "-o", tmp, *map(str, build.sources)], check=True, capture_output=True, text=True,
                       timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def candidates() -> tuple[list[Build], str]:
    """The builds this CPU runs, best first, as SWITCHYARD_NATIVE allows; if none, why not."""
    want = os.environ.get("SWITCHYARD_NATIVE", "1")
    if want == "0":
        return [], "disabled by SWITCHYARD_NATIVE=0"
    allowed = [b for b in BUILDS if want == b.name or (want == "1" and not b.by_name_only)]
    if not allowed:
        return [], f"SWITCHYARD_NATIVE={want} names no build ({', '.join(b.name for b in BUILDS)}, 0 or 1)"
    flags = _cpu_flags()
    runs = [b for b in allowed if b.cpu_flags <= flags]
    return runs, "" if runs else f"CPU lacks {', '.join(sorted(allowed[-1].cpu_flags - flags))}"


def pick() -> tuple[Build | None, str]:
    """The build this CPU runs best, as SWITCHYARD_NATIVE allows: (build, "") or (None, why not)."""
    runs, why = candidates()
    return (runs[0], "") if runs else (None, why)


def _open(compiler: str, build: Build) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_build(compiler, build)))
    # Linux hands out the AMX tile state only to a process that asks (arch_prctl); a kernel
    # or VM that refuses it leaves the next build.
    if build.matmul == "amx" and lib.sy_amx_init():
        raise OSError("the OS refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    return lib


def build_named(name: str) -> Build:
    return next(b for b in BUILDS if b.name == name)


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str]:
    """(library, build name) when the native kernels are usable, else (None, why not)."""
    runs, why = candidates()
    if not runs:
        return None, why
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc/gcc) on PATH"
    failures = []
    for build in runs:  # an older compiler may lack a newer build's flags: take the next one
        try:
            lib = _open(compiler, build)
            break
        except subprocess.CalledProcessError as e:
            failures.append(f"{build.name} build failed: {(e.stderr or '').strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"{build.name} build or load failed: {e}")
    else:
        return None, "; ".join(failures)
    if failures:
        log.warning("native kernels: using %s; %s", build.name, "; ".join(failures))
    lib.sy_int4_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    i32 = ctypes.c_int
    # qkv, k cache, v cache, block tables, table width, positions, B, H, Hkv, D, blocks, block size, ...
    lib.sy_decode_attn.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, i64, i64, f32, p, i32, i32]
    lib.sy_add_rmsnorm.argtypes = [p, p, p, f32, p, i64, i64, i32]
    lib.sy_silu_mul.argtypes = [p, p, i64, i64, i32]
    lib.sy_rope.argtypes = [p, i64, i64, i64, i64, p, p, p, i64, i32]
    lib.sy_topk.argtypes = [p, i64, i64, i32, p, i32]
    lib.sy_gather_dot.argtypes = [p, p, p, p, i64, i64, i64, i64, i32]
    wp = ctypes.POINTER(Int4Weight)
    lib.sy_layer_in.argtypes = [p, p, p, f32, wp, p, p, p, i64, i64, i64, p, p, p, i64, i32]
    lib.sy_layer_out.argtypes = [p, p, p, f32, wp, wp, wp, p, p, p, p, p, i64, i32]
    for fn in (lib.sy_int4_mm, lib.sy_decode_attn, lib.sy_add_rmsnorm, lib.sy_silu_mul, lib.sy_rope, lib.sy_topk,
               lib.sy_gather_dot, lib.sy_layer_in, lib.sy_layer_out):
        fn.restype = ctypes.c_int
    return lib, build.name

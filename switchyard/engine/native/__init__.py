"""Native CPU kernels, compiled on first use with the system C compiler and cached.

Two hot spots of a CPU decode step: the int4 x bfloat16 matmul (`int4_bf16.c`) and decode
attention with its KV-cache write (`decode_attn.c`). Both need AVX-512 (with BF16: AMD Zen 4,
Intel Sapphire Rapids and later). Anything missing (the CPU flags, a compiler, a failed
build, SWITCHYARD_NATIVE=0) means `load()` says why and the engine uses torch's ops instead.
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
from pathlib import Path

from switchyard.datasets import cache_dir

log = logging.getLogger("switchyard.engine.native")

SOURCES = [Path(__file__).with_name(n) for n in ("int4_bf16.c", "decode_attn.c")]
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp", "-shared", "-fPIC"]
NEEDED_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build(compiler: str) -> Path:
    key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + " ".join([compiler, *FLAGS]).encode())
    out = cache_dir("kernels") / f"switchyard-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: ranks starting together never load a half-written file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, "-o", tmp, *map(str, SOURCES)], check=True, capture_output=True, text=True,
                       timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str]:
    """(library, "") when the native kernels are usable, else (None, why not)."""
    if os.environ.get("SWITCHYARD_NATIVE", "1") == "0":
        return None, "disabled by SWITCHYARD_NATIVE=0"
    missing = NEEDED_CPU_FLAGS - _cpu_flags()
    if missing:
        return None, f"CPU lacks {', '.join(sorted(missing))}"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc/gcc) on PATH"
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except subprocess.CalledProcessError as e:
        return None, f"build failed: {(e.stderr or '').strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"build or load failed: {e}"
    lib.sy_int4_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.sy_decode_attn.argtypes = ([ctypes.c_void_p] * 7 + [ctypes.c_int64] * 6 +
                                   [ctypes.c_float, ctypes.c_void_p, ctypes.c_int])
    for fn in (lib.sy_int4_mm, lib.sy_decode_attn):
        fn.restype = ctypes.c_int
    return lib, ""

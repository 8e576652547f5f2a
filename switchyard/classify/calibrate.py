"""Threshold calibration: which confidence sends a target share of a trace to the large pool.

The ONNX classifier reports the winning label and its probability. "Send to large" is
P(complex) >= t. For t >= 0.5 that is the rule `{label: complex, confidence: ">= t"}`; for t < 0.5
it also takes the requests labelled simple with confidence <= 1 - t, so two rules are printed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from switchyard.classify.features import extract


@dataclass(frozen=True)
class Calibration:
    threshold: float  # on P(positive label)
    share: float  # share of the trace at or above it
    n: int
    positive: str
    negative: str

    def rules_yaml(self, large_pool: str = "large") -> str:
        t = self.threshold
        lines = [f"  - name: {self.positive}", f"    when: {{label: {self.positive}, confidence: \">= {t:.4f}\"}}",
                 f"    pool: {large_pool}"]
        if t < 0.5:
            lines = [f"  - name: {self.positive}", f"    when: {{label: {self.positive}}}", f"    pool: {large_pool}",
                     f"  - name: borderline-{self.negative}",
                     f"    when: {{label: {self.negative}, confidence: \"<= {1 - t:.4f}\"}}",
                     f"    pool: {large_pool}"]
        return "\n".join(lines)


def threshold_for_share(p_positive: np.ndarray, target: float) -> tuple[float, float]:
    """The largest threshold t with share(P >= t) >= target (ties make the share inexact), and that share."""
    if not 0.0 <= target <= 1.0:
        raise ValueError("the target share must be between 0 and 1")
    p = np.sort(np.asarray(p_positive, dtype=np.float64))[::-1]
    n = len(p)
    if n == 0:
        raise ValueError("the trace has no requests")
    k = int(round(target * n))
    if k <= 0:
        t = float(np.nextafter(p[0], np.inf))  # just above the top: nobody goes large
        return min(t, 1.0), float((p >= t).mean())
    t = float(p[k - 1])
    return t, float((p >= t).mean())


def read_trace(path: Path) -> list[dict[str, Any]]:
    """OpenAI chat bodies from JSON Lines: each line a body, or an outcomes record with `request`
    (one body per case id)."""
    bodies: list[dict[str, Any]] = []
    seen: set[str] = set()
    from switchyard.classify.outcomes import read_bytes

    for n, line in enumerate(read_bytes(path).decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if isinstance(d, dict) and isinstance(d.get("request"), dict):
            key = str(d.get("id", n))
            if key in seen:
                continue
            seen.add(key)
            d = d["request"]
        if not isinstance(d, dict) or not isinstance(d.get("messages"), list):
            raise ValueError(f"{path}:{n}: expected an OpenAI chat body (with `messages`) or a record with `request`")
        bodies.append(d)
    return bodies


def calibrate(clf: Any, bodies: list[dict[str, Any]], target: float, positive: str = "complex") -> Calibration:
    labels = list(clf.labels)
    if positive not in labels:
        raise ValueError(f"label {positive!r} is not one of the model's labels {labels}")
    if len(labels) != 2:
        raise ValueError("calibration needs a two-label model")
    probs = clf.probabilities_many([extract(b) for b in bodies])[:, labels.index(positive)]
    t, share = threshold_for_share(probs, target)
    negative = labels[1 - labels.index(positive)]
    return Calibration(t, share, len(bodies), positive, negative)

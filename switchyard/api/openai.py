"""The x-switchyard-* headers every routed response carries."""

from __future__ import annotations

from switchyard.policy.rules import RouteDecision


def decision_headers(d: RouteDecision) -> dict[str, str]:
    lab = d.label
    h = {
        "x-switchyard-policy": d.policy,
        "x-switchyard-pool": d.pool,
        "x-switchyard-rule": d.rule,
        "x-switchyard-label": lab.name or "none",
    }
    if lab.name:
        h["x-switchyard-confidence"] = f"{lab.confidence:.4f}"
        h["x-switchyard-classifier"] = lab.kind
        h["x-switchyard-classifier-ms"] = f"{lab.ms:.3f}"
    return h

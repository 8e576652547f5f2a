"""Routing without a serving gateway, for --dry-run (the split alone) and --from-outcomes
(counterfactual scoring).

It is the gateway's own routing: an offline Gateway (in-memory session state, the policy's
real classifier, an llm classifier included) and `gateway.routing.route`, so a replayed
session is pinned, escalated and classified exactly as a serving gateway would do it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.classify.base import Label
from switchyard.classify.features import Features, extract
from switchyard.gateway import routing
from switchyard.gateway.gateway import offline_gateway
from switchyard.policy.rules import RouteDecision
from switchyard.policy.schema import PolicySpec

log = logging.getLogger(__name__)


def pick_large_pool(spec: PolicySpec, requested: str | None = None) -> str:
    """The pool whose share is "the large share": the named one, else `large`, else the last pool."""
    if requested and requested in spec.pools:
        return requested
    if "large" in spec.pools:
        return "large"
    return list(spec.pools)[-1]


def hard_label(spec: PolicySpec) -> str:
    labels = spec.classifier.labels
    return "complex" if "complex" in labels else labels[-1]


@dataclass(slots=True)
class RoutedCase:
    routed: routing.Routed
    features: Features

    @property
    def decision(self) -> RouteDecision:
        return self.routed.decision


class Router:
    def __init__(self, policy_file: str | Path, large_pool: str | None = None):
        self.policy_file = Path(policy_file)
        self.gateway = offline_gateway([self.policy_file])
        self.policy = self.gateway.policies()[0]
        self.spec = self.policy.spec
        self.name = self.policy.name
        self.large = pick_large_pool(self.spec, large_pool)
        self.hard = hard_label(self.spec)
        self.easy = next((x for x in self.spec.classifier.labels if x != self.hard), "simple")

    async def route(self, body: dict[str, Any], session_id: str | None = None) -> RoutedCase:
        headers = {"x-session-id": session_id} if session_id else {}
        features = extract(body, headers)
        routed = await routing.route(self.policy, features, body, session_id, sessions=self.gateway.state)
        return RoutedCase(routed, features)

    async def route_labelled(self, features: Features, body: dict[str, Any], label: Label) -> RouteDecision:
        """The rules' choice for a request given its label (no session: a sweep point)."""
        return (await routing.route(self.policy, features, body, label=label)).decision

    def hard_probability(self, label: Label) -> float:
        """The classifier's belief that the request is hard, from its (label, confidence)."""
        if not label.name:
            return 0.0
        if label.name == self.hard:
            return label.confidence
        return 1.0 - label.confidence

    def relabel(self, p_hard: float, threshold: float) -> Label:
        # Sweeps move the decision threshold; the confidence predicates of the rules then
        # see a decided label (confidence 1), so only the threshold decides.
        return Label(self.hard if p_hard >= threshold else self.easy, 1.0, "sweep")

    async def aclose(self) -> None:
        await self.gateway.aclose()

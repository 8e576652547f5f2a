"""Routing without the gateway: the policy's classifier and rules, in-process.

Used by --dry-run (the split alone) and --from-outcomes (counterfactual scoring). Session
pins are honoured the way the gateway keeps them (a session stays on its first pool);
the classifier's per-session caching is not modelled: every request is classified.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.classify.base import NO_LABEL, Classifier, Label, NoClassifier
from switchyard.classify.features import Features, extract
from switchyard.policy.loader import load_policy
from switchyard.policy.rules import CompiledPolicy, RouteDecision, compile_policy
from switchyard.policy.schema import PolicySpec

log = logging.getLogger(__name__)


def build_classifier(spec: PolicySpec, base_dir: Path) -> tuple[Classifier, str | None]:
    """The policy's classifier, or NoClassifier with the reason it could not be built."""
    if spec.classifier.kind == "none":
        return NoClassifier(), None
    try:
        from switchyard.classify.build import build_classifier as build
    except ImportError:
        return NoClassifier(), "switchyard.classify.build is not available: classifier replaced by none"
    try:
        return build(spec.classifier, base_dir=base_dir, call_pool=None), None
    except Exception as e:  # a classifier that cannot load must not stop a dry run
        return NoClassifier(), f"classifier {spec.classifier.kind} could not be built ({e}): replaced by none"


def pick_large_pool(spec: PolicySpec, requested: str | None = None) -> str:
    """The pool whose share is "the large share": the named one, else `large`, else the
    pool the classifier's hardest label is routed to, else the last pool."""
    if requested and requested in spec.pools:
        return requested
    if "large" in spec.pools:
        return "large"
    return list(spec.pools)[-1]


def hard_label(spec: PolicySpec) -> str:
    labels = spec.classifier.labels
    return "complex" if "complex" in labels else labels[-1]


@dataclass(slots=True)
class Routed:
    decision: RouteDecision
    features: Features


class Router:
    def __init__(self, policy_file: str | Path, large_pool: str | None = None):
        self.policy_file = Path(policy_file)
        self.spec = load_policy(self.policy_file)
        self.policy: CompiledPolicy = compile_policy(self.spec)
        self.name = self.policy.name
        self.classifier, note = build_classifier(self.spec, self.policy_file.parent)
        self.notes = [note] if note else []
        self.large = pick_large_pool(self.spec, large_pool)
        self.hard = hard_label(self.spec)
        self.easy = next((x for x in self.spec.classifier.labels if x != self.hard), "simple")
        self._pins: dict[str, str] = {}

    async def label(self, features: Features, body: dict[str, Any]) -> Label:
        try:
            return await self.classifier.classify(features, body)
        except Exception:  # fail open, as the gateway does: the policy's failure label
            if self.spec.classifier.kind == "none":
                return NO_LABEL
            return Label(self.spec.classifier.failure_label, 0.0, "fail-open", 0.0)

    async def route(self, body: dict[str, Any], session_id: str | None = None) -> Routed:
        headers = {"x-session-id": session_id} if session_id else {}
        features = extract(body, headers)
        label = await self.label(features, body)
        return Routed(self.decide(features, label, session_id), features)

    def decide(self, features: Features, label: Label, session_id: str | None) -> RouteDecision:
        decision = self.policy.evaluate(features, label, session_id)
        if session_id and self.spec.session.pin != "none":
            pinned = self._pins.setdefault(session_id, decision.pool)
            if pinned != decision.pool:
                decision = RouteDecision(
                    decision.policy, pinned, "(session pin)", f"session {session_id} pinned to {pinned}",
                    label, decision.fallbacks, None, session_id,
                )
        return decision

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
        try:
            await self.classifier.aclose()
        except Exception:
            log.debug("classifier close failed", exc_info=True)

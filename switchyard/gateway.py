"""The gateway's routing stage: model name -> target; features -> label -> rule -> pool.

api/ parses the request and calls `Gateway.route`; pools/dispatch sends it. No HTTP here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.classify.base import NO_LABEL, Classifier, Label, NoClassifier
from switchyard.classify.features import Features
from switchyard.policy.loader import PolicyError, PolicyIssue
from switchyard.policy.rules import CompiledPolicy, RouteDecision, compile_policy
from switchyard.policy.schema import PolicySpec
from switchyard.policy.store import PolicyStore
from switchyard.pools.pool import Pool, ReplicaRegistry
from switchyard.state.base import SessionRecord, StateStore

log = logging.getLogger("switchyard.gateway")

CallPool = Callable[[str, dict, float], Awaitable[dict]]


@dataclass(eq=False)
class LoadedPolicy:
    spec: PolicySpec
    compiled: CompiledPolicy
    path: Path
    pools: dict[str, Pool]
    classifier: Classifier

    @property
    def name(self) -> str:
        return self.compiled.name


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's `model` names: a routed policy, or one pool directly."""

    policy: LoadedPolicy
    pool: str | None = None  # set: direct to this pool, no classification


@dataclass
class Gateway:
    state: StateStore
    registry: ReplicaRegistry = field(default_factory=ReplicaRegistry)
    store: PolicyStore[LoadedPolicy] | None = None
    call_pool: CallPool | None = None  # set by the API layer: lets the llm classifier use a pool
    _models: dict[str, Target] = field(default_factory=dict)

    # --- policies -------------------------------------------------------------------------

    def load(self, paths: list[str | Path]) -> None:
        self.store = PolicyStore(paths, self._build)
        self.store.on_swap.append(self._reindex)
        self.store.load_all()

    def _build(self, spec: PolicySpec, path: Path) -> LoadedPolicy:
        compiled = compile_policy(spec)
        try:
            pools = {name: self.registry.build_pool(name, ps) for name, ps in spec.pools.items()}
        except ValueError as e:
            raise PolicyError([PolicyIssue(str(path), 1, str(e))]) from None
        classifier = self._build_classifier(spec, path)
        return LoadedPolicy(spec, compiled, path, pools, classifier)

    def _build_classifier(self, spec: PolicySpec, path: Path) -> Classifier:
        if spec.classifier.kind == "none":
            return NoClassifier()
        try:
            from switchyard.classify.build import ClassifierLoadError, build_classifier
        except ImportError as e:  # pragma: no cover - the classifier package is part of the install
            raise PolicyError([PolicyIssue(str(path), 1, f"classifier: not available: {e}")]) from None
        try:
            return build_classifier(spec.classifier, path.parent, self.call_pool)
        except ClassifierLoadError as e:
            raise PolicyError([PolicyIssue(str(path), _classifier_line(path), f"classifier: {e}")]) from None

    def _reindex(self) -> None:
        """Map every name a client may send as `model` to its target."""
        assert self.store is not None
        models: dict[str, Target] = {}
        policies = [self.store.by_name[n] for n in self.store.order]
        for lp in policies:
            models.setdefault(lp.name, Target(lp))
        if policies:
            models.setdefault("auto", Target(policies[0]))
        for lp in policies:  # pool names, then upstream ids: the first policy that has one wins
            for pname in lp.pools:
                models.setdefault(pname, Target(lp, pname))
        for lp in policies:
            for pname, pool in lp.pools.items():
                models.setdefault(pool.model, Target(lp, pname))
        self._models = models
        self.registry.attach([p for lp in policies for p in lp.pools.values()])

    def resolve(self, model: str) -> Target | None:
        return self._models.get(model)

    def model_names(self) -> list[tuple[str, Target]]:
        return list(self._models.items())

    def policies(self) -> list[LoadedPolicy]:
        assert self.store is not None
        return [self.store.by_name[n] for n in self.store.order]

    def all_pools(self) -> list[tuple[str, Pool]]:
        return [(f"{lp.name}/{name}", p) for lp in self.policies() for name, p in lp.pools.items()]

    # --- routing --------------------------------------------------------------------------

    async def route(self, target: Target, features: Features, body: dict, session_id: str | None) -> RouteDecision:
        lp = target.policy
        if target.pool is not None:
            return RouteDecision(
                lp.name, target.pool, "direct", f"model {features.model!r} names pool {target.pool!r}",
                NO_LABEL, lp.compiled.fallback.get(target.pool, ()), None, session_id,
            )
        spec = lp.spec
        cspec = spec.classifier
        uses_session = bool(session_id) and (
            spec.session.pin != "none" or cspec.classify_on != "every_request" or cspec.escalate_only
        )
        key = f"{lp.name}\0{session_id}" if uses_session else ""
        rec = await self.state.get_session(key) if uses_session else None
        label = await self._label(lp, features, body, rec)
        decision = lp.compiled.evaluate(features, label, session_id)
        if rec is not None and rec.pool in lp.pools and spec.session.pin != "none" and rec.label == label.name:
            # Pinned: a session stays on its pool (and replica) until its label changes.
            replica = rec.replica if spec.session.pin == "replica" else None
            if rec.pool != decision.pool or replica:
                decision = RouteDecision(
                    lp.name, rec.pool, decision.rule if rec.pool == decision.pool else "session-pin",
                    f"session pinned to pool {rec.pool}" + (f" replica {replica}" if replica else ""),
                    label, lp.compiled.fallback.get(rec.pool, ()), replica, session_id,
                )
        if uses_session:
            turns = features.turns if (rec is None or label.kind != "session") else rec.turns
            new = SessionRecord(lp.name, decision.pool, label.name, label.confidence,
                                rec.replica if rec else None, decision.rule, turns)
            await self.state.put_session(key, new, spec.session.ttl)
        return decision

    async def _label(self, lp: LoadedPolicy, f: Features, body: dict, rec: SessionRecord | None) -> Label:
        cspec = lp.spec.classifier
        if cspec.kind == "none":
            return NO_LABEL
        reuse = rec is not None and rec.label and (
            cspec.classify_on == "new_session"
            or (cspec.classify_on == "user_turn" and f.turns <= rec.turns)
        )
        if reuse:
            assert rec is not None
            return Label(rec.label, rec.confidence, "session", 0.0)
        t0 = time.perf_counter()
        try:
            label = await lp.classifier.classify(f, body)
        except Exception as e:  # a classifier bug must not fail the request: fail open, say so
            log.exception("classifier failed: %s", e)
            label = Label(cspec.failure_label, 1.0, "fail-open", (time.perf_counter() - t0) * 1000)
        if (
            cspec.escalate_only and rec is not None and rec.label in cspec.labels and label.name in cspec.labels
            and cspec.labels.index(label.name) < cspec.labels.index(rec.label)
        ):
            return Label(rec.label, rec.confidence, "session", label.ms)
        return label

    async def remember_replica(self, decision: RouteDecision, lp: LoadedPolicy, replica_url: str) -> None:
        """pin: replica keeps the session on the replica that served it (KV-cache locality)."""
        if lp.spec.session.pin != "replica" or not decision.session_id or decision.replica == replica_url:
            return
        key = f"{lp.name}\0{decision.session_id}"
        rec = await self.state.get_session(key)
        if rec is not None:
            await self.state.put_session(
                key,
                SessionRecord(rec.policy, rec.pool, rec.label, rec.confidence, replica_url, rec.rule, rec.turns),
                lp.spec.session.ttl,
            )

    async def aclose(self) -> None:
        if self.store:
            await self.store.aclose()
            for lp in self.policies():
                await lp.classifier.aclose()
        await self.registry.aclose()
        await self.state.aclose()


def _classifier_line(path: Path) -> int:
    try:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("classifier:"):
                return i
    except OSError:
        pass
    return 1

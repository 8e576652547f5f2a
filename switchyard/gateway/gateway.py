"""The running policies and their pools: load and hot-reload policy files, resolve what a
request's `model` names, route (gateway/routing.py) and send upstream (pools/dispatch.py).

No HTTP here: api/ parses requests and calls `Gateway.route` then `Gateway.dispatcher.send`.
Offline tools (`policy explain`, replay) build the same object on an in-memory state store, so
they route exactly as a serving gateway does, llm classifiers included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from switchyard.classify.base import NO_LABEL, Classifier, NoClassifier
from switchyard.classify.features import Features
from switchyard.errors import ClassifierLoadError, PolicyError, PolicyIssue
from switchyard.gateway import routing
from switchyard.policy.classifier import build_classifier
from switchyard.policy.envrefs import EnvAllow, EnvNotAllowed, file_line_of
from switchyard.policy.rules import CompiledPolicy, RouteDecision, compile_policy
from switchyard.policy.schema import PolicySpec
from switchyard.policy.store import PolicyStore
from switchyard.pools.dispatch import Dispatcher, DispatchEvents
from switchyard.pools.pool import Pool, ReplicaRegistry
from switchyard.state.base import SessionRecord, StateStore
from switchyard.state.memory import MemoryStore

log = logging.getLogger("switchyard.gateway")


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


class _NoEvents:
    def retried(self, pool: str) -> None:
        return None

    def fell_back(self, src: str, dst: str) -> None:
        return None

    def upstream_failed(self, pool: str, replica: str, reason: str) -> None:
        return None


class Gateway:
    def __init__(self, state: StateStore, events: DispatchEvents | None = None,
                 classifier_dirs: Sequence[str | Path] = (), allow_env: Sequence[str] = ()) -> None:
        self.state = state
        self.classifier_dirs = [Path(d) for d in classifier_dirs]  # besides the policy's and the shipped one
        self.env = EnvAllow(tuple(allow_env))  # the ${NAME}s policies may expand (policy/envrefs.py)
        self.registry = ReplicaRegistry(self.env)
        self.dispatcher = Dispatcher(events or _NoEvents(), state)
        self.store: PolicyStore[LoadedPolicy] | None = None
        self._models: dict[str, Target] = {}
        self._prune: asyncio.Task | None = None

    # --- policies -------------------------------------------------------------------------

    def load(self, paths: list[str | Path]) -> None:
        self.store = PolicyStore(paths, self._build)
        self.store.on_swap.append(self._reindex)
        self.store.load_all()

    def _build(self, spec: PolicySpec, path: Path) -> LoadedPolicy:
        compiled = compile_policy(spec, str(path))
        try:
            pools = {name: self.registry.build_pool(name, ps) for name, ps in spec.pools.items()}
        except EnvNotAllowed as e:
            raise PolicyError([PolicyIssue(str(path), file_line_of(path, e.name), str(e))]) from None
        except ValueError as e:
            raise PolicyError([PolicyIssue(str(path), 1, str(e))]) from None
        return LoadedPolicy(spec, compiled, path, pools, self.build_classifier(spec, path, pools))

    def build_classifier(self, spec: PolicySpec, path: Path, pools: Mapping[str, Pool] | None = None) -> Classifier:
        """The policy's classifier, as serving builds it; PolicyError when it will not load. An llm
        classifier asks the pool of that name in `pools` (this policy's own; built when not given)."""
        if spec.classifier.kind == "none":
            return NoClassifier()
        if pools is None and spec.classifier.kind == "llm":
            pools = {name: self.registry.build_pool(name, ps) for name, ps in spec.pools.items()
                     if not isinstance(ps.replicas, int)}
        own = pools or {}

        async def call_pool(pool_name: str, body: dict, timeout: float) -> dict:
            return await self.call_pool(own, pool_name, body, timeout)

        try:
            return build_classifier(spec.classifier, path.parent, call_pool, self.classifier_dirs)
        except ClassifierLoadError as e:
            raise PolicyError([PolicyIssue(str(path), _classifier_line(path), f"classifier: {e}",
                                           ("classifier",))]) from None

    def _reindex(self) -> None:
        """Map every name a client may send as `model` to its target."""
        policies = self.policies()
        models: dict[str, Target] = {}
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
        try:  # replicas a policy edit dropped: close their connection pools
            self._prune = asyncio.get_running_loop().create_task(self.registry.prune())
        except RuntimeError:  # the first load, before the server's loop: nothing to prune yet
            pass

    def resolve(self, model: str) -> Target | None:
        return self._models.get(model)

    def model_names(self) -> list[tuple[str, Target]]:
        return list(self._models.items())

    def policies(self) -> list[LoadedPolicy]:
        if self.store is None:
            return []
        return [self.store.by_name[n] for n in self.store.order]

    def policy(self, name: str) -> LoadedPolicy | None:
        return self.store.by_name.get(name) if self.store is not None else None

    def all_pools(self) -> list[tuple[str, Pool]]:
        return [(f"{lp.name}/{name}", p) for lp in self.policies() for name, p in lp.pools.items()]

    # --- routing --------------------------------------------------------------------------

    async def route(self, target: Target, features: Features, body: dict, session_id: str | None,
                    caller: str = "", commit: bool = True) -> routing.Routed:
        if target.pool is not None:
            return routing.direct(target.policy, target.pool, features.model, session_id)
        return await routing.route(target.policy, features, body, session_id, sessions=self.state,
                                   caller=caller, commit=commit)

    async def remember_replica(self, decision: RouteDecision, lp: LoadedPolicy, replica_url: str,
                               caller: str = "") -> None:
        """pin: replica keeps the session on the replica that served it (KV-cache locality)."""
        if lp.spec.session.pin != "replica" or not decision.session_id or decision.replica == replica_url:
            return
        key = routing.session_key(lp.name, decision.session_id, caller)
        rec = await self.state.get_session(key)
        if rec is not None:
            await self.state.put_session(
                key,
                SessionRecord(rec.policy, rec.pool, rec.label, rec.confidence, replica_url, rec.rule, rec.turns),
                lp.spec.session.ttl,
            )

    async def call_pool(self, pools: Mapping[str, Pool], pool_name: str, body: dict, timeout: float) -> dict:
        """A chat completion through one of a policy's pools (its llm classifier asks for a label)."""
        if pool_name not in pools:
            raise LookupError(f"no pool named {pool_name!r}")
        decision = RouteDecision("", pool_name, "classifier", "classifier call", NO_LABEL)
        answer = await asyncio.wait_for(
            self.dispatcher.send(pools, decision, dict(body), "/chat/completions", False), timeout)
        if answer.status != 200:
            raise RuntimeError(f"classifier pool {pool_name!r} answered {answer.status}")
        return orjson.loads(answer.body)

    async def aclose(self) -> None:
        if self.store:
            await self.store.aclose()
            for lp in self.policies():
                await lp.classifier.aclose()
        if self._prune is not None:
            await asyncio.gather(self._prune, return_exceptions=True)
        await self.registry.aclose()
        await self.state.aclose()


def offline_gateway(paths: list[str | Path] | None = None) -> Gateway:
    """A gateway that routes without serving (in-memory state, nothing in the background):
    `policy explain` and replay route through it exactly as a serving gateway does."""
    gw = Gateway(MemoryStore())
    if paths:
        gw.load(paths)
    return gw


def _classifier_line(path: Path) -> int:
    try:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("classifier:"):
                return i
    except OSError:
        pass
    return 1

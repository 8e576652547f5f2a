"""The one routing function: (policy, request features, session state, classifier) -> a decision
and its trace.

The gateway's proxy, `/v1/route`, the UI preview, `switchyard policy explain`, and replay's dry
run and counterfactual all call `route`; none keeps its own copy, so what the preview explains
is what production does. The trace says which rules were tried and why each matched or not,
the label and where it came from (the classifier, the session, a fail-open), and the session
record the decision started from.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from switchyard.classify.base import NO_LABEL, Classifier, Label
from switchyard.classify.features import Features
from switchyard.policy.rules import CompiledPolicy, RouteDecision, RuleCheck
from switchyard.policy.schema import PolicySpec
from switchyard.state.base import SessionRecord, StateStore
from switchyard.state.base import session_key as state_session_key

log = logging.getLogger("switchyard.routing")

PIN_RULE = "session-pin"
MAX_SESSION_ID_BYTES = 256
AGENT_SESSION_HEADERS = ("session-id", "thread-id", "x-claude-code-session-id")  # what agent CLIs send of themselves
_AGENT_HEADER_KEYS = tuple(h.encode() for h in AGENT_SESSION_HEADERS)


class RoutingPolicy(Protocol):
    """What routing needs of a policy: its spec, its compiled rules and its classifier."""

    @property
    def spec(self) -> PolicySpec: ...

    @property
    def compiled(self) -> CompiledPolicy: ...

    @property
    def classifier(self) -> Classifier: ...


@dataclass(frozen=True, slots=True)
class Routed:
    decision: RouteDecision
    checks: tuple[RuleCheck, ...] = ()  # every rule tried, in order, up to the one that matched
    session: SessionRecord | None = None  # the session's record this decision started from
    classifier_error: str | None = None  # why the label is a fail-open one
    classify_start: float = 0.0  # perf_counter when the classifier was called (0: none was)

    def trace(self) -> dict[str, Any]:
        """The decision and how it was reached, as every entry point shows it."""
        d = self.decision.to_dict()
        lab = self.decision.label
        d["classifier_ms"] = round(lab.ms, 3) if lab.name else None
        d["classifier_error"] = self.classifier_error
        d["trace"] = [c.to_dict() for c in self.checks]
        d["session"] = None if self.session is None else {
            "pool": self.session.pool, "label": self.session.label or None, "replica": self.session.replica,
            "rule": self.session.rule, "turns": self.session.turns,
        }
        return d


def session_id_of(body: Mapping[str, Any], headers: Mapping[str, str], hint: str | None = None) -> str | None:
    """The session a request belongs to: `x-session-id`, else `metadata.session_id`, else `hint`
    (what the client's API says of itself: api/dialect.py's Parsed.session_hint: Claude Code's
    metadata.user_id session, Codex's prompt_cache_key, a Responses chain's root), else an agent
    CLI's own session header (Codex: `session-id`, `thread-id`; Claude Code:
    `x-claude-code-session-id`), else `user`. Ids longer than MAX_SESSION_ID_BYTES are kept as a
    digest, so a client cannot make the gateway store megabytes per session."""
    sid = headers.get("x-session-id")
    if not sid:
        meta = body.get("metadata")
        s = meta.get("session_id") if isinstance(meta, dict) else None
        sid = s if isinstance(s, str) and s else hint
    if not sid:
        sid = _agent_session(headers)
    if not sid:
        user = body.get("user")
        sid = user if isinstance(user, str) and user else None
    # A UTF-8 character is at most 4 bytes: short ids skip the encode (every request comes here).
    if sid and len(sid) > MAX_SESSION_ID_BYTES // 4 and len(sid.encode()) > MAX_SESSION_ID_BYTES:
        sid = "sha256:" + hashlib.sha256(sid.encode()).hexdigest()
    return sid


def _agent_session(headers: Mapping[str, str]) -> str | None:
    """The first of AGENT_SESSION_HEADERS the request has: one pass over Starlette's raw headers
    (three .get()s would scan them three times on every request without a session)."""
    raw = getattr(headers, "raw", None)
    if raw is None:
        return next((v for v in map(headers.get, AGENT_SESSION_HEADERS) if v), None)
    found = {k: v for k, v in raw if k in _AGENT_HEADER_KEYS}
    if not found:
        return None
    return next((found[k].decode("latin-1") for k in _AGENT_HEADER_KEYS if found.get(k)), None)


def session_key(policy: str, session_id: str, caller: str = "") -> str:
    """Where a session's state lives: per policy, per caller (API key id) and per session id, so
    one key can never steer another key's session (and in-memory stores bound each caller's)."""
    return state_session_key(policy, session_id, caller)


def direct(policy: RoutingPolicy, pool: str, model: str, session_id: str | None = None) -> Routed:
    """A request whose `model` names a pool or an upstream model: that pool, unclassified."""
    return Routed(RouteDecision(
        policy.compiled.name, pool, "direct", f"model {model!r} names pool {pool!r}", NO_LABEL,
        policy.compiled.fallback.get(pool, ()), None, session_id,
    ))


async def route(policy: RoutingPolicy, features: Features, body: dict[str, Any], session_id: str | None = None,
                *, sessions: StateStore | None = None, caller: str = "", commit: bool = True,
                label: Label | None = None) -> Routed:
    """Route one request.

    `sessions` None routes without session state (one request alone); `commit` False reads the
    session's state without writing it (`/v1/route`, the UI preview); `label`, when given, is taken as
    the classifier's answer (replay's threshold sweeps relabel a request at each threshold).
    """
    spec = policy.spec
    cspec = spec.classifier
    uses_session = sessions is not None and bool(session_id) and (
        spec.session.pin != "none" or cspec.classify_on != "every_request" or cspec.escalate_only
    )
    key = session_key(policy.compiled.name, session_id, caller) if uses_session and session_id else ""
    rec = None
    if key and sessions is not None:  # an in-memory store answers at once: no coroutine a call
        get_now = getattr(sessions, "get_session_now", None)
        rec = get_now(key) if get_now is not None else await sessions.get_session(key)
    error = None
    t_classify = 0.0
    if label is None:
        if cspec.kind == "none":  # no classifier: no coroutine to await
            label = NO_LABEL
        else:
            label, error, t_classify = await _label(policy, features, body, rec)
    decision, checks = policy.compiled.evaluate(features, label, session_id)
    if rec is not None and rec.pool in spec.pools and spec.session.pin != "none" and rec.label == label.name:
        # Pinned: a session stays on its pool (and replica) until its label changes.
        replica = rec.replica if spec.session.pin == "replica" else None
        if rec.pool != decision.pool or replica:
            decision = RouteDecision(
                decision.policy, rec.pool, decision.rule if rec.pool == decision.pool else PIN_RULE,
                f"session pinned to pool {rec.pool}" + (f" replica {replica}" if replica else ""),
                label, policy.compiled.fallback.get(rec.pool, ()), replica, session_id,
            )
    if key and commit and sessions is not None:
        turns = features.turns if (rec is None or label.kind != "session") else rec.turns
        record = SessionRecord(decision.policy, decision.pool, label.name, label.confidence,
                               rec.replica if rec else None, decision.rule, turns)
        put_now = getattr(sessions, "put_session_now", None)
        if put_now is not None:
            put_now(key, record, spec.session.ttl)
        else:
            await sessions.put_session(key, record, spec.session.ttl)
    return Routed(decision, checks, rec, error, t_classify)


async def _label(policy: RoutingPolicy, f: Features, body: dict[str, Any],
                 rec: SessionRecord | None) -> tuple[Label, str | None, float]:
    """(label, why the classifier failed, perf_counter when it was called: 0 when it was not)."""
    cspec = policy.spec.classifier  # kind "none" never gets here (route answers NO_LABEL itself)
    reuse = rec is not None and rec.label and (
        cspec.classify_on == "new_session"
        or (cspec.classify_on == "user_turn" and f.turns <= rec.turns)
    )
    if reuse:
        assert rec is not None
        return Label(rec.label, rec.confidence, "session", 0.0), None, 0.0
    t0 = time.perf_counter()
    error = None
    try:
        label = await policy.classifier.classify(f, body)
    except Exception as e:  # a classifier bug must not fail the request: fail open, say so
        log.exception("classifier failed: %s", e)
        error = f"{type(e).__name__}: {e}"
        # A fail-open label is a firm decision (the llm classifier's own fail-opens say 1.0 too):
        # a confidence-gated rule still sends it where `on_failure` means it to go.
        label = Label(cspec.failure_label, 1.0, "fail-open", (time.perf_counter() - t0) * 1000)
    if (
        cspec.escalate_only and rec is not None and rec.label in cspec.labels and label.name in cspec.labels
        and cspec.labels.index(label.name) < cspec.labels.index(rec.label)
    ):
        return Label(rec.label, rec.confidence, "session", label.ms), error, t0
    return label, error, t0

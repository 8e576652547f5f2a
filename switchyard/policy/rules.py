"""Rule evaluation: compiled predicates over request features, first match wins."""

from __future__ import annotations

import hashlib
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import re2

from switchyard.classify.base import Label
from switchyard.classify.features import Features
from switchyard.errors import PolicyError, PolicyIssue
from switchyard.policy.schema import PolicySpec

Predicate = Callable[[Features, Label], bool]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_CMP = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(-?\d+(?:\.\d+)?)\s*$")
# `text` predicates run on RE2 (linear time in the text, no backtracking: a pattern like (a+)+$
# cannot stall the event loop) over at most this much of the last user turn.
TEXT_REGEX_CHARS = 64 * 1024
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error comes back to the policy author, not to stderr
NUMERIC_KEYS = {"tools", "turns", "prompt_tokens", "confidence", "messages", "tool_calls_so_far"}
KNOWN_KEYS = NUMERIC_KEYS | {"label", "model", "text", "tool_result", "tool_error", "tool_choice", "response_format"}
# What a request's `tool_choice` and `response_format` may be, as the predicates name them.
TOOL_CHOICES = frozenset({"auto", "none", "required", "named"})
RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema"})


def compile_text_regex(pattern: str) -> Any:
    """A `text` predicate's pattern, on RE2. RuleError for bad syntax and for what RE2 refuses
    by design (backreferences, lookaround: constructs that need backtracking)."""
    if len(pattern) > 4096:
        raise RuleError("text: a regular expression may be at most 4096 characters")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise RuleError(f"text: bad regular expression {pattern!r} ({why}); it runs on RE2, which has no "
                        "backreferences or lookaround") from None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    policy: str
    pool: str
    rule: str
    reason: str
    label: Label
    fallbacks: tuple[str, ...] = ()
    replica: str | None = None  # a pinned replica (session pin: replica)
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "pool": self.pool,
            "rule": self.rule,
            "reason": self.reason,
            "label": self.label.name or None,
            "confidence": round(self.label.confidence, 4) if self.label.name else None,
            "classifier": self.label.kind,
            "fallbacks": list(self.fallbacks),
            "replica": self.replica,
            "session_id": self.session_id,
        }


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """One rule tried for a request: its name, its predicates in words, whether it matched."""

    rule: str
    when: str
    matched: bool

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "match": self.matched, "when": self.when}


class RuleError(ValueError):
    pass


def _numeric(key: str, spec: Any) -> tuple[Predicate, str]:
    if isinstance(spec, bool):
        raise RuleError(f"{key}: expected a number or a comparison like '>= 8', got {spec!r}")
    if isinstance(spec, int | float):
        op, value, text = operator.eq, float(spec), f"{key} == {spec}"
    elif isinstance(spec, str) and (m := _CMP.match(spec)):
        sym = m.group(1) or "=="
        op, value, text = _OPS[sym], float(m.group(2)), f"{key} {sym} {m.group(2)}"
    else:
        raise RuleError(f"{key}: expected a number or a comparison like '>= 8', got {spec!r}")
    if key == "confidence":
        return (lambda f, lab: bool(lab.name) and op(lab.confidence, value)), text
    attr = key
    return (lambda f, lab: op(getattr(f, attr), value)), text


def _one_of(spec: Any, key: str) -> frozenset[str]:
    if isinstance(spec, str):
        return frozenset([spec])
    if isinstance(spec, list) and spec and all(isinstance(s, str) for s in spec):
        return frozenset(spec)
    raise RuleError(f"{key}: expected a name or a list of names, got {spec!r}")


def compile_predicate(key: str, spec: Any) -> tuple[Predicate, str]:
    if not isinstance(key, str):
        raise RuleError(f"predicate names are strings, got {key!r}")
    if key in NUMERIC_KEYS:
        return _numeric(key, spec)
    if key == "label":
        names = _one_of(spec, key)
        return (lambda f, lab: lab.name in names), f"label in {sorted(names)}"
    if key == "model":
        names = _one_of(spec, key)
        return (lambda f, lab: f.model in names), f"model in {sorted(names)}"
    if key in ("tool_choice", "response_format"):
        # Structured output: e.g. send `required` tool calls or a JSON schema to the pool whose
        # engine constrains its decoding, or to the larger model.
        allowed = TOOL_CHOICES if key == "tool_choice" else RESPONSE_FORMATS
        names = _one_of(spec, key)
        if not names <= allowed:
            raise RuleError(f"{key}: {sorted(names - allowed)} is not one of {sorted(allowed)}")
        attr = key
        return (lambda f, lab: getattr(f, attr) in names), f"{key} in {sorted(names)}"
    if key in ("tool_result", "tool_error"):
        if not isinstance(spec, bool):
            raise RuleError(f"{key}: expected true or false, got {spec!r}")
        attr = key
        return (lambda f, lab: getattr(f, attr) is spec), f"{key} is {spec}"
    if key == "text":
        if not isinstance(spec, str):
            raise RuleError(f"text: expected a regular expression string, got {spec!r}")
        rx = compile_text_regex(spec)
        return (lambda f, lab: rx.search(f.text[:TEXT_REGEX_CHARS]) is not None), f"text ~ /{spec}/"
    if key.startswith("header."):
        name = key[len("header.") :].lower()
        if not name:
            raise RuleError("header.NAME: the header name is missing")
        if isinstance(spec, bool):
            return (lambda f, lab: (name in f.headers) is spec), f"header {name} present is {spec}"
        values = _one_of(spec, key)
        return (lambda f, lab: f.headers.get(name) in values), f"header {name} in {sorted(values)}"
    raise RuleError(
        f"unknown predicate {key!r}; known: {', '.join(sorted(KNOWN_KEYS))}, header.NAME"
    )


@dataclass(slots=True)
class CompiledRule:
    name: str
    predicates: list[tuple[Predicate, str]]
    pool: str | None
    split: list[tuple[str, int]] | None
    total: int = 0
    when: str = ""  # the predicates in words, worked out once (every request's trace shows them)

    def __post_init__(self) -> None:
        self.when = " and ".join(text for _, text in self.predicates) or "always"

    def matches(self, f: Features, lab: Label) -> bool:
        for pred, _ in self.predicates:
            if not pred(f, lab):
                return False
        return True

    def choose(self, session_id: str | None, rng: random.Random) -> str:
        if self.pool is not None:
            return self.pool
        assert self.split is not None
        if session_id:
            digest = hashlib.blake2b(f"{self.name}\0{session_id}".encode(), digest_size=8).digest()
            point = int.from_bytes(digest, "big") % self.total
        else:
            point = rng.randrange(self.total)
        for pool, w in self.split:
            if point < w:
                return pool
            point -= w
        return self.split[-1][0]


@dataclass(slots=True)
class CompiledPolicy:
    spec: PolicySpec
    name: str
    rules: list[CompiledRule]
    fallback: dict[str, tuple[str, ...]]
    rng: random.Random = field(default_factory=random.Random)

    def evaluate(self, f: Features, label: Label, session_id: str | None = None
                 ) -> tuple[RouteDecision, tuple[RuleCheck, ...]]:
        """The first rule that matches, and every rule tried up to it (the trace)."""
        checks: list[RuleCheck] = []
        for rule in self.rules:
            hit = rule.matches(f, label)
            checks.append(RuleCheck(rule.name, rule.when, hit))
            if hit:
                pool = rule.choose(session_id, self.rng)
                reason = rule.when
                if rule.split is not None:
                    reason += f"; split {dict(rule.split)} -> {pool}"
                return RouteDecision(
                    self.name, pool, rule.name, reason, label, self.fallback.get(pool, ()), None, session_id
                ), tuple(checks)
        # No rule matched: the last pool of the last rule keeps requests flowing, said in the reason.
        last = self.rules[-1]
        pool = last.pool or last.split[0][0]  # type: ignore[index]
        return RouteDecision(
            self.name, pool, "(no match)", "no rule matched; last rule's pool", label,
            self.fallback.get(pool, ()), None, session_id,
        ), tuple(checks)


def compile_policy(spec: PolicySpec, file: str = "") -> CompiledPolicy:
    """Raises PolicyError whose issues carry each bad predicate's place in the document (the
    loader, which knows the lines, fills them in)."""
    issues: list[PolicyIssue] = []
    rules: list[CompiledRule] = []
    for i, r in enumerate(spec.routes):
        preds = []
        for key, value in r.when.items():
            try:
                preds.append(compile_predicate(key, value))
            except RuleError as e:
                issues.append(PolicyIssue(file, 0, f"routes[{i}].when.{key}: {e}", ("routes", i, "when", key)))
        if isinstance(r.pool, str):
            rules.append(CompiledRule(r.name, preds, r.pool, None))
        else:
            split = [(p, w) for p, w in r.pool.items() if w > 0]
            rules.append(CompiledRule(r.name, preds, None, split, sum(w for _, w in split)))
    if issues:
        raise PolicyError(issues)
    return CompiledPolicy(
        spec, spec.name or "policy", rules, {k: tuple(v) for k, v in spec.fallback.items()}
    )

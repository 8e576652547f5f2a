"""The policy editor's server side: validate as you type, preview a request, apply an edit.

Validation is the loader's own (`parse_policy`: the errors of `switchyard policy check`,
with their lines) plus what the gateway would refuse when serving the file (a planning
policy's replica counts, a policy name another file uses, an ONNX classifier that will not
load). Apply writes the file and goes through `PolicyStore.install`, the swap the hot-reload
path uses: an edit that fails never replaces the running policy, and the
file is put back as it was so the disk keeps matching what serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from switchyard.classify.base import Classifier
from switchyard.classify.features import extract
from switchyard.errors import PolicyError, PolicyIssue
from switchyard.gateway import routing
from switchyard.gateway.gateway import Gateway, LoadedPolicy
from switchyard.policy.envrefs import EnvNotAllowed, line_of
from switchyard.policy.loader import compose_bounded, parse_policy
from switchyard.policy.rules import KNOWN_KEYS, CompiledPolicy, compile_policy
from switchyard.policy.schema import PolicySpec
from switchyard.policy.store import PARSE_DEADLINE_S


@dataclass(frozen=True, slots=True)
class _Edited:
    """An edited policy as routing sees it (routing.RoutingPolicy)."""

    spec: PolicySpec
    compiled: CompiledPolicy
    classifier: Classifier


REDACTED = "<redacted>"


_MERGE = "tag:yaml.org,2002:merge"
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/@:]*):([^/@]*)@")


def _entries(node: yaml.MappingNode, seen: set[int]) -> Iterator[tuple[yaml.Node, yaml.Node]]:
    """A mapping's key/value pairs, those it takes through YAML merge keys (`<<: {...}` or
    `<<: [*a, *b]`) included: a key set through a merge is set all the same."""
    for k, v in node.value:
        if k.tag == _MERGE or getattr(k, "value", None) == "<<":
            for m in (v.value if isinstance(v, yaml.SequenceNode) else [v]):
                if isinstance(m, yaml.MappingNode) and id(m) not in seen:
                    seen.add(id(m))
                    yield from _entries(m, seen)
        else:
            yield k, v


def _redacted_url(url: str) -> str | None:
    """A replica URL with its password replaced by REDACTED; None when it has no password."""
    m = _USERINFO.match(url)
    return None if m is None or not m.group(2) else f"{m.group(1)}:{REDACTED}@" + url[m.end():]


def _secret_spans(text: str) -> list[tuple[str, str, int, int, str]]:
    """(kind, what, start, end, value) of each secret in a policy's text: a literal
    `pools.NAME.api_key` (kind "key", what: the pool's name) and a replica URL's password (kind
    "url", what: the URL as redacted), merge keys followed. A '${VARIABLE}' reference is no
    secret and is left alone. Composed under the loader's node limit: a text past it has no
    spans (and fails validation anyway)."""
    try:
        root = compose_bounded(text)
    except (yaml.YAMLError, PolicyError, RecursionError, ValueError):
        return []
    spans: dict[int, tuple[str, str, int, int, str]] = {}  # by start: an anchored value counts once

    def add(kind: str, what: str, node: yaml.ScalarNode) -> None:
        spans.setdefault(node.start_mark.index, (kind, what, node.start_mark.index, node.end_mark.index, node.value))

    if isinstance(root, yaml.MappingNode):
        for k, pools in _entries(root, set()):
            if getattr(k, "value", None) != "pools" or not isinstance(pools, yaml.MappingNode):
                continue
            for pk, pool in _entries(pools, set()):
                if not isinstance(pool, yaml.MappingNode):
                    continue
                for ak, av in _entries(pool, set()):
                    key = getattr(ak, "value", None)
                    if key == "api_key" and isinstance(av, yaml.ScalarNode) and av.value \
                            and not av.value.startswith("${"):
                        add("key", str(pk.value), av)
                    elif key == "replicas" and isinstance(av, yaml.SequenceNode):
                        for rep in av.value:
                            if not isinstance(rep, yaml.MappingNode):
                                continue
                            for uk, uv in _entries(rep, set()):
                                if getattr(uk, "value", None) == "url" and isinstance(uv, yaml.ScalarNode):
                                    shown = _redacted_url(uv.value)
                                    if shown is not None:
                                        add("url", shown, uv)
    return sorted(spans.values(), key=lambda s: s[2])


def redact_secrets(text: str) -> str:
    """The policy text as the UI may show it: literal upstream keys and URL passwords replaced by REDACTED."""
    for kind, what, start, end, _ in reversed(_secret_spans(text)):
        text = text[:start] + json.dumps(REDACTED if kind == "key" else what) + text[end:]
    return text


def restore_secrets(text: str, running: str) -> str:
    """An edit sent back from the UI: each REDACTED key takes the running file's key of that pool,
    each redacted URL the running file's URL it stands for."""
    if REDACTED not in text:  # nothing to put back: compose nothing
        return text
    old = {(kind, what): value for kind, what, _, _, value in _secret_spans(running)}
    for kind, what, start, end, value in reversed(_secret_spans(text)):
        redacted = value == REDACTED if kind == "key" else value == what
        if redacted and (kind, what) in old:
            text = text[:start] + json.dumps(old[(kind, what)]) + text[end:]
    return text


def issue_dicts(issues: list[PolicyIssue]) -> list[dict[str, Any]]:
    return [{"line": i.line, "reason": i.reason} for i in issues]


def schema_hints() -> dict[str, Any]:
    """The JSON Schema of `switchyard policy schema` plus the rule predicates (a `when` is free-form in it)."""
    schema = PolicySpec.model_json_schema()
    return {"schema": schema, "predicates": sorted(KNOWN_KEYS) + ["header.NAME"]}


class PolicyEditor:
    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self._lock = asyncio.Lock()  # one apply at a time: each one reads, writes and reloads a file
        self._classifiers: dict[tuple[str, str], Classifier] = {}

    def find(self, name: str) -> LoadedPolicy | None:
        return self.gateway.policy(name)

    # --- validate -------------------------------------------------------------------------

    async def validate(self, name: str, text: str) -> tuple[PolicySpec | None, list[PolicyIssue]]:
        """The loader's checks (in a thread, with a deadline: a pathological text never stalls the
        event loop) plus what serving the text would refuse."""
        lp = self.find(name)
        path = lp.path if lp is not None else Path(f"{name}.yaml")
        try:
            spec = await asyncio.wait_for(
                asyncio.to_thread(parse_policy, text, str(path), path.stem), PARSE_DEADLINE_S)
        except PolicyError as e:
            return None, e.issues
        except TimeoutError:
            return None, [PolicyIssue(str(path), 1, f"took longer than {PARSE_DEADLINE_S:g}s to read and validate")]
        issues = self._serve_problems(spec, path, text, name)
        return (spec if not issues else None), issues

    def _serve_problems(self, spec: PolicySpec, path: Path, text: str, name: str) -> list[PolicyIssue]:
        issues = []
        lines = text.splitlines()
        for pname, ps in spec.pools.items():
            if isinstance(ps.replicas, int):
                issues.append(PolicyIssue(str(path), _key_line(lines, pname), (
                    f"pool {pname!r} lists a replica count ({ps.replicas}), not URLs: this is a planning "
                    "policy; run `switchyard plan --emit DIR` and serve the policy it writes")))
        for pname, ps in spec.pools.items():  # a ${NAME} the operator did not allow: refused when served
            if ps.api_key:
                try:
                    self.gateway.env.check(ps.api_key, f"pool {pname!r}: api_key")
                except EnvNotAllowed as e:
                    issues.append(PolicyIssue(str(path), line_of(text, e.name), str(e)))
        new_name = spec.name or path.stem
        if new_name != name and self.find(new_name) is not None:
            issues.append(PolicyIssue(str(path), _key_line(lines, "name"),
                                      f"policy name {new_name!r} is used by another file"))
        if spec.classifier.kind == "onnx":
            try:
                self._classifier(spec, path)
            except PolicyError as e:
                issues.extend(e.issues)
        return issues

    def _classifier(self, spec: PolicySpec, path: Path) -> Classifier:
        """Built as the gateway builds it, cached per classifier block (typing must not reload a model)."""
        key = (spec.classifier.model_dump_json(), str(path.parent))
        clf = self._classifiers.get(key)
        if clf is None:
            clf = self.gateway.build_classifier(spec, path)
            if len(self._classifiers) >= 8:
                self._classifiers.pop(next(iter(self._classifiers)))
            self._classifiers[key] = clf
        return clf

    # --- preview --------------------------------------------------------------------------

    async def preview(self, name: str, text: str, body: dict, headers: dict[str, str]) -> dict[str, Any]:
        """The decision for `body` under the edited text and under the running policy, each with its
        trace, from the gateway's own routing function. A request with a session id starts from
        the state the gateway keeps for that session, read and never written, as `/v1/route` does:
        the preview shows where that session's next turn goes now, and would go once the edit is
        applied (a reload keeps session state). The sessions are those of callers without a key:
        a key's sessions are keyed by its id, which the editor has none of."""
        spec, issues = await self.validate(name, text)
        features = extract(body, headers)
        out: dict[str, Any] = {"features": features.summary(), "issues": issue_dicts(issues)}
        sid = routing.session_id_of(body, headers)
        lp = self.find(name)
        if spec is not None:
            path = lp.path if lp is not None else Path(f"{name}.yaml")
            if lp is not None and lp.spec.classifier == spec.classifier:
                clf = lp.classifier
            else:
                try:
                    clf = self._classifier(spec, path)
                except PolicyError as e:
                    out["issues"] = issue_dicts(e.issues)
                    return out
            edited = _Edited(spec, compile_policy(spec, str(path)), clf)
            out["edited"] = (await routing.route(edited, features, body, sid, sessions=self.gateway.state,
                                                 commit=False)).trace()
        if lp is not None:
            running = (await routing.route(lp, features, body, sid, sessions=self.gateway.state,
                                           commit=False)).trace()
            pool = lp.pools.get(running["pool"])
            running["replicas"] = [r.snapshot() for r in pool.replicas] if pool else []
            running["upstream_model"] = pool.model if pool else None
            out["running"] = running
        return out

    # --- apply ----------------------------------------------------------------------------

    async def apply(self, name: str, text: str) -> tuple[int, dict[str, Any]]:
        async with self._lock:
            lp = self.find(name)
            if lp is None:
                return 404, {"ok": False, "issues": [{"line": 0, "reason": f"no running policy named {name!r}"}]}
            old = lp.path.read_text(encoding="utf-8")
            # The same node limit and deadline as validation, before anything composes the text.
            try:
                text = await asyncio.wait_for(asyncio.to_thread(restore_secrets, text, old), PARSE_DEADLINE_S)
            except TimeoutError:
                return 422, {"ok": False, "policy": name, "issues": [{"line": 1, "reason": (
                    f"took longer than {PARSE_DEADLINE_S:g}s to read")}], "message": "not applied: the running "
                    "policy stays"}
            spec, issues = await self.validate(name, text)
            if spec is None:
                return 422, {"ok": False, "policy": name, "issues": issue_dicts(issues),
                             "message": "not applied: the running policy stays"}
            store = self.gateway.store
            assert store is not None
            path = lp.path
            _write_atomic(path, text)
            st = store.install(path, spec)
            if not st.ok:
                _write_atomic(path, old)  # the disk keeps matching the policy that serves
                return 422, {"ok": False, "policy": name, "issues": issue_dicts(st.issues),
                             "message": "not applied: the running policy stays"}
            new_name = store.files.get(path.resolve(), name)
            return 200, {"ok": True, "policy": new_name, "file": str(path), "at": st.at,
                         "message": f"applied: policy {new_name} reloaded from {path}"}

    async def aclose(self) -> None:
        for clf in self._classifiers.values():
            await clf.aclose()
        self._classifiers.clear()


def _key_line(lines: list[str], key: str) -> int:
    rx = re.compile(rf"^\s*{re.escape(key)}\s*:")
    return next((i for i, line in enumerate(lines, 1) if rx.match(line)), 1)


def _write_atomic(path: Path, text: str) -> None:
    """Replace the file in one rename, keeping its mode: the watcher never reads half a policy."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

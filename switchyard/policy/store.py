"""The running policies: loaded from files, swapped atomically on a valid edit, kept on a broken one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from switchyard.errors import PolicyError, PolicyIssue
from switchyard.policy.loader import load_policy, policy_files
from switchyard.policy.schema import PolicySpec

log = logging.getLogger("switchyard.policy")

PARSE_DEADLINE_S = 5.0  # reading and validating one policy file; a sane one takes milliseconds

T = TypeVar("T")


@dataclass
class ReloadStatus:
    file: str
    ok: bool
    at: float
    issues: list[PolicyIssue] = field(default_factory=list)  # why a rejected edit was rejected

    @property
    def error(self) -> str:
        return "\n".join(str(i) for i in self.issues)


@dataclass
class PolicyStore(Generic[T]):
    """Policy files -> runtime objects (built by `build`), one per file, keyed by policy name.

    `build` turns a validated spec into what serves it (pools, classifier); it may raise
    PolicyError too (a classifier file that will not load): then the old object keeps serving.
    """

    paths: list[str | Path]
    build: Callable[[PolicySpec, Path], T]
    by_name: dict[str, T] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)  # file -> policy name
    order: list[str] = field(default_factory=list)
    status: dict[str, ReloadStatus] = field(default_factory=dict)
    on_swap: list[Callable[[], None]] = field(default_factory=list)
    _watch_task: asyncio.Task | None = None

    def load_all(self) -> None:
        """Initial load: every file must be valid (errors from all files reported together)."""
        files = policy_files(self.paths)
        if not files:
            raise PolicyError([PolicyIssue(str(p), 0, "no policy files found") for p in self.paths])
        issues: list[PolicyIssue] = []
        built: dict[str, T] = {}
        names: dict[Path, str] = {}
        order: list[str] = []
        for f in files:
            try:
                spec = load_policy(f)
                name = spec.name or f.stem
                if name in built:
                    raise PolicyError([PolicyIssue(str(f), 1, f"policy name {name!r} is used by another file")])
                built[name] = self.build(spec, f)
                names[f.resolve()] = name
                order.append(name)
            except PolicyError as e:
                issues.extend(e.issues)
        if issues:
            raise PolicyError(issues)
        self.by_name, self.files, self.order = built, names, order
        for f, name in names.items():
            self.status[name] = ReloadStatus(str(f), True, time.time())
        self._swapped()

    async def reload_file(self, path: Path) -> ReloadStatus:
        """Re-read one file; swap its policy in only when it is valid and builds.

        Reading and validating run in a thread with a deadline, so a pathological file never
        stalls the event loop; building (pools, classifier) and the swap happen on the loop."""
        path = path.resolve()
        try:
            spec = await asyncio.wait_for(asyncio.to_thread(load_policy, path), PARSE_DEADLINE_S)
        except PolicyError as e:
            return self._rejected(path, e)
        except TimeoutError:
            return self._rejected(path, PolicyError([PolicyIssue(
                str(path), 1, f"took longer than {PARSE_DEADLINE_S:g}s to read and validate")]))
        return self.install(path, spec)

    def install(self, path: Path, spec: PolicySpec) -> ReloadStatus:
        """Swap in a validated spec read from `path`, if it builds."""
        path = path.resolve()
        old_name = self.files.get(path)
        try:
            name = spec.name or path.stem
            if name != old_name and name in self.by_name:
                raise PolicyError([PolicyIssue(str(path), 1, f"policy name {name!r} is used by another file")])
            obj = self.build(spec, path)
        except PolicyError as e:
            return self._rejected(path, e)
        by_name = dict(self.by_name)
        order = list(self.order)
        if old_name and old_name != name:
            by_name.pop(old_name, None)
            order = [name if n == old_name else n for n in order]
        elif not old_name:
            order.append(name)
        by_name[name] = obj
        self.by_name = by_name  # one assignment: a request sees the old set or the new one, never a mix
        self.order = order
        self.files[path] = name
        st = ReloadStatus(str(path), True, time.time())
        self.status[name] = st
        log.info("policy %s reloaded from %s", name, path)
        self._swapped()
        return st

    def _rejected(self, path: Path, e: PolicyError) -> ReloadStatus:
        st = ReloadStatus(str(path), False, time.time(), e.issues)
        old_name = self.files.get(path)
        if old_name:
            self.status[old_name] = st
        log.error("policy edit rejected, the running policy stays:\n%s", e)
        return st

    async def reload_all(self) -> list[ReloadStatus]:
        return [await self.reload_file(f) for f in policy_files(self.paths)]

    def _swapped(self) -> None:
        for cb in self.on_swap:
            cb()

    @property
    def default(self) -> T:
        return self.by_name[self.order[0]]

    def start_watching(self) -> None:
        self._watch_task = asyncio.create_task(self._watch(), name="policy-watch")

    async def _watch(self) -> None:
        from watchfiles import Change, awatch

        targets = {Path(p).resolve() for p in self.paths}
        dirs = {t if t.is_dir() else t.parent for t in targets}
        watched = {f.resolve() for f in policy_files(self.paths)}

        def relevant(change: Change, path: str) -> bool:
            p = Path(path).resolve()
            return p in watched or (p.parent in targets and p.suffix in {".yaml", ".yml"})

        async for changes in awatch(*dirs, watch_filter=relevant, debounce=200, step=50):
            for _, path in sorted(changes, key=lambda c: c[1]):
                p = Path(path)
                if p.exists():
                    await self.reload_file(p)

    async def aclose(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except (asyncio.CancelledError, Exception):
                pass

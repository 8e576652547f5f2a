"""Which cases a classifier may learn from, and which it is judged on.

Two rules keep a classifier's held-out score (and every replay score routed by it) honest:

1. Near-duplicates stay together. Cases are joined into groups: BFCL's case id families (a live
   case `live_multiple_862-181-3` belongs to family 181 of live_multiple, the variants of a
   multi-turn conversation share its index) and, on top, every case that offers the identical
   tool set (BFCL builds parallel_N and simple_python_M from one function, and a question
   reworded over the same tools is the same problem). A group lies wholly on one side.
2. Replay suites are never trained on. Every group holding a case of a named suite
   (`tooluse-92` by default, or any suite a user names) is held out, whole; of the other
   groups, one in `test_share` (by a hash of the group's key) is held out too.

The groups are worked out over the whole BFCL universe (every case the shipped classifier is
trained on), plus the cases at hand that are not BFCL's: a case's group, and so its side of the
split, does not depend on which other cases a training run happens to see. That makes the
split of the BFCL-category classifier and of a classifier trained from outcomes the same, so
one held-out set judges both. The split is recorded in the model's sidecar (`record()`), and
`Split.from_record` rebuilds it, so replay can keep to the cases a model never saw.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

METHOD = "groups/v1"
TEST_SHARE = 5
DEFAULT_SUITES = ("tooluse-92",)
GROUPS_RULE = (
    "BFCL case id families (live_*: the middle number of the id; multi_turn_*: the index its "
    "variants share; other cases: the id), joined with every case offering the identical tool set"
)

_LIVE = re.compile(r"^(live_[a-z_]+?)_\d+-(\d+)-\d+$")
_MULTI_TURN = re.compile(r"^multi_turn_[a-z_]+?_(\d+)$")


class SplitError(ValueError):
    """A suite that cannot be read, or a split record this code cannot rebuild."""


def family(case_id: str) -> str:
    """The id family a case belongs to (itself, for ids without one)."""
    m = _LIVE.match(case_id)
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    m = _MULTI_TURN.match(case_id)
    if m:
        return f"multi_turn:{m.group(1)}"
    return case_id


def toolset_key(body: dict[str, Any]) -> str | None:
    """A digest of the tools a request offers (order-free); None without tools."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    parts = sorted(json.dumps(t.get("function", t) if isinstance(t, dict) else t, sort_keys=True) for t in tools)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


class Groups:
    """Union-find over id families and tool sets; a group's key is its smallest family name."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}
        self._family: dict[str, str] = {}  # case id -> its family node
        self._keys: dict[str, str] | None = None  # root -> group key, rebuilt after an add

    def _find(self, x: str) -> str:
        parent = self._parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def add(self, case_id: str, body: dict[str, Any]) -> None:
        node = "f:" + family(case_id)
        self._family[case_id] = node
        root = self._find(node)
        tk = toolset_key(body)
        if tk is not None:
            other = self._find("t:" + tk)
            if other != root:
                self._parent[other] = root
        self._keys = None

    def __contains__(self, case_id: str) -> bool:
        return case_id in self._family

    def key(self, case_id: str) -> str:
        """The case's group key (for an id never added: its own family)."""
        node = self._family.get(case_id)
        if node is None:
            return family(case_id)
        if self._keys is None:
            keys: dict[str, str] = {}
            for n in self._parent:
                if n.startswith("f:"):
                    r = self._find(n)
                    if r not in keys or n[2:] < keys[r]:
                        keys[r] = n[2:]
            self._keys = keys
        return self._keys[self._find(node)]

    def copy(self) -> Groups:
        g = Groups()
        g._parent = dict(self._parent)
        g._family = dict(self._family)
        return g


@lru_cache(maxsize=1)
def bfcl_groups() -> Groups:
    """The groups of every BFCL case the classifiers are built from (read once per process)."""
    from switchyard.classify.bfcl import load_cases
    from switchyard.datasets import bfcl_zip

    g = Groups()
    with bfcl_zip() as zf:
        for c in load_cases(zf):
            g.add(c.id, c.body)
    return g


@dataclass(frozen=True)
class Suite:
    name: str
    ids: tuple[str, ...]


def load_suite(spec: str) -> Suite:
    """A suite's case ids: a shipped suite's name, `bfcl:CATEGORY[:N]` (its first N cases, as
    replay reads them), a suite JSON file ({"cases": [{"id": ...}]}, or a list of ids), or a
    JSONL trace (each line's `id`; lines without one are FILESTEM-LINENO, as replay names them)."""
    from switchyard.datasets import SUITES

    if spec in SUITES:
        data = json.loads(SUITES[spec].read_text(encoding="utf-8"))
        return Suite(spec, tuple(str(c["id"]) for c in data["cases"]))
    if spec.startswith("bfcl:"):
        return _bfcl_suite(spec)
    p = Path(spec)
    if not p.is_file():
        raise SplitError(f"suite {spec!r}: not a shipped suite ({', '.join(SUITES)}), bfcl:CATEGORY[:N] or a file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SplitError(f"suite {spec}: cannot read ({e})") from None
    ids: list[str] = []
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SplitError(f"suite {spec}: not JSON ({e.msg})") from None
        items = data.get("cases") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise SplitError(f"suite {spec}: expected {{\"cases\": [...]}} or a list of ids")
        ids = [str(c["id"]) if isinstance(c, dict) and "id" in c else str(c) for c in items]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SplitError(f"suite {spec}:{n}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise SplitError(f"suite {spec}:{n}: expected an object per line")
            ids.append(str(obj.get("id", f"{p.stem}-{n}")))
    if not ids:
        raise SplitError(f"suite {spec}: no cases in it")
    return Suite(p.name, tuple(dict.fromkeys(ids)))


def _bfcl_suite(spec: str) -> Suite:
    from switchyard.datasets import bfcl_zip

    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1] or (len(parts) == 3 and not parts[2].isdigit()):
        raise SplitError(f"suite {spec!r}: expected bfcl:CATEGORY or bfcl:CATEGORY:N")
    limit = int(parts[2]) if len(parts) == 3 else None
    with bfcl_zip() as zf:
        try:
            text = zf.read(f"bfcl_eval/data/BFCL_v4_{parts[1]}.json").decode("utf-8")
        except KeyError:
            raise SplitError(f"suite {spec!r}: no BFCL category {parts[1]!r}") from None
    ids = [json.loads(line)["id"] for line in text.splitlines() if line.strip()]
    return Suite(spec, tuple(ids[:limit]))


@dataclass
class Split:
    """Held out: the groups of every suite case, and one group in `test_share` of the rest."""

    groups: Groups
    suites: list[Suite] = field(default_factory=list)
    test_share: int = TEST_SHARE

    def __post_init__(self) -> None:
        if self.test_share < 2:
            raise SplitError("test_share must be at least 2 (one group in test_share is held out)")
        self._suite_of: dict[str, str] = {}
        for s in self.suites:
            for cid in s.ids:
                self._suite_of.setdefault(self.groups.key(cid), s.name)

    @classmethod
    def build(cls, cases: Iterable[tuple[str, dict[str, Any]]] = (), suites: Iterable[str] = DEFAULT_SUITES,
              test_share: int = TEST_SHARE) -> Split:
        """The split over the BFCL universe plus `cases` (id, request body) that are not BFCL's."""
        return cls(_with_cases(cases), [load_suite(s) for s in suites], test_share)

    @classmethod
    def from_record(cls, record: Any, cases: Iterable[tuple[str, dict[str, Any]]] = ()) -> Split:
        """The split a model was trained with, from its sidecar's `trained.split`."""
        if not isinstance(record, dict) or record.get("method") != METHOD:
            got = record.get("method") if isinstance(record, dict) else record
            raise SplitError(f"split {got!r} is not {METHOD!r}: retrain the model with this switchyard")
        suites = record.get("suites")
        share = record.get("test_share")
        if not isinstance(suites, dict) or not isinstance(share, int):
            raise SplitError("split record without `suites` and `test_share`")
        return cls(_with_cases(cases), [Suite(n, tuple(ids)) for n, ids in suites.items()], share)

    def reason(self, case_id: str) -> str | None:
        """Why the case is held out (`suite NAME`, `one group in N`), or None: a training case."""
        key = self.groups.key(case_id)
        suite = self._suite_of.get(key)
        if suite is not None:
            return f"suite {suite}"
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return f"one group in {self.test_share}" if int.from_bytes(digest, "big") % self.test_share == 0 else None

    def held_out(self, case_id: str) -> bool:
        return self.reason(case_id) is not None

    def record(self) -> dict[str, Any]:
        return {
            "method": METHOD,
            "groups": GROUPS_RULE,
            "held_out": f"every group with a case of a suite below, and one group in {self.test_share} of "
                        "the rest (blake2b of the group key)",
            "test_share": self.test_share,
            "suites": {s.name: list(s.ids) for s in self.suites},
        }


def _with_cases(cases: Iterable[tuple[str, dict[str, Any]]]) -> Groups:
    base = bfcl_groups()
    extra = [(cid, body) for cid, body in cases if cid not in base]
    if not extra:
        return base
    g = base.copy()
    for cid, body in extra:
        g.add(cid, body)
    return g

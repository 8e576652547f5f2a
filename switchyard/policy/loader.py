"""Load and validate policy files, with errors that name the file, the line and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from switchyard.errors import PolicyError, PolicyIssue
from switchyard.policy.rules import compile_policy
from switchyard.policy.schema import PolicySpec, reference_problems

__all__ = ["PolicyError", "PolicyIssue", "compose_bounded", "load_policy", "parse_policy", "policy_files"]

MAX_POLICY_BYTES = 1 << 20


def _line_map(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path in the YAML document to its 1-based line."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
            # A value keeps its key's line: errors about a value point at "key: value".
            out[path + (key,)] = k.start_mark.line + 1
            _line_map(v, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)
    return out


MAX_NODES = 50_000  # a real policy has a few hundred; 7 levels of nested aliases make millions


MAX_SEPARATORS = 2 * MAX_NODES  # commas and lines: a cheap bound checked before composing


def _too_many_separators(text: str) -> int | None:
    """Commas and lines, when there are more than any policy has (no YAML is composed to know it:
    a flow list of 200,000 items would otherwise be composed up to the node limit first)."""
    n = text.count(",") + text.count("\n")
    return n if n > MAX_SEPARATORS else None


class _TooManyNodes(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing past MAX_NODES nodes. Composing is the slow part (pure
    Python, tens of microseconds a node): a flat 1 MB list took 15 s of CPU, long after the
    caller's deadline had answered. Each node or alias composed adds at least one node to the
    expansion, so this never refuses what _check_expansion would accept."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._composed += 1
        if self._composed > MAX_NODES:
            raise _TooManyNodes(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)


def compose_bounded(text: str, file: str = "<policy>") -> yaml.Node | None:
    """The YAML node tree of a text, composed under the loader's node limit (PolicyError past it):
    for whatever reads a policy's text besides the loader (the UI's secret redaction)."""
    if _too_many_separators(text) is not None:
        raise PolicyError([PolicyIssue(file, 1, f"the document holds more than {MAX_NODES:,} YAML nodes")])
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_node()
    except _TooManyNodes as e:
        raise PolicyError([PolicyIssue(file, e.line, f"the document holds more than {MAX_NODES:,} YAML nodes")]) \
            from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes the document holds once every alias is expanded (memoized: linear in the nodes)."""
    got = memo.get(id(node))
    if got is not None:
        return got
    memo[id(node)] = 1  # a recursive alias counts once, not forever
    n = 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            n += _expanded_size(k, memo) + _expanded_size(v, memo)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            n += _expanded_size(item, memo)
    memo[id(node)] = n
    return n


def _check_expansion(node: yaml.Node, file: str) -> None:
    memo: dict[int, int] = {}
    total = _expanded_size(node, memo)
    if total <= MAX_NODES:
        return
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode) and node.value:  # point at the biggest top-level key
        key, _ = max(node.value, key=lambda kv: memo.get(id(kv[1]), 0))
        line = key.start_mark.line + 1
    raise PolicyError([PolicyIssue(file, line, (
        f"the document expands to {total:,} nodes through YAML aliases (&anchor / *alias); a policy may "
        f"expand to at most {MAX_NODES:,}"))])


def _line_for(loc: tuple, lines: dict[tuple, int]) -> int:
    loc = tuple(x for x in loc if not (isinstance(x, str) and x in {"list[ReplicaSpec]", "int", "str"}))
    # pydantic puts union branches and "function-after" names into loc; skip what is not a key.
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get((), 1)


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in {"list[ReplicaSpec]", "int", "str", "dict[str,int]"} or "function" in str(part):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def parse_policy(text: str, file: str = "<policy>", default_name: str | None = None) -> PolicySpec:
    """Parse and validate policy text; raise PolicyError with every issue found."""
    if len(text.encode("utf-8", "replace")) > MAX_POLICY_BYTES:
        raise PolicyError([PolicyIssue(file, 1, f"policy file over {MAX_POLICY_BYTES} bytes")])
    seps = _too_many_separators(text)
    if seps is not None:
        raise PolicyError([PolicyIssue(file, 1, (
            f"the document has {seps:,} commas and lines; a policy may hold at most {MAX_NODES:,} YAML nodes "
            f"and {MAX_SEPARATORS:,} commas and lines"))])
    try:
        loader = _BoundedLoader(text)
        try:
            node = loader.get_single_node()
            # Aliases share nodes, so the document composes in linear time whatever it expands to;
            # building the data (and validating it) walks every expansion: count before that.
            if node is not None:
                _check_expansion(node, file)
            data: Any = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except PolicyError:
        raise
    except _TooManyNodes as e:
        raise PolicyError([PolicyIssue(file, e.line, (
            f"the document holds more than {MAX_NODES:,} YAML nodes; a policy may hold (and expand to) "
            f"at most {MAX_NODES:,}"))]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise PolicyError([PolicyIssue(file, line, f"YAML syntax: {e.problem or e}")]) from None
    except yaml.YAMLError as e:
        raise PolicyError([PolicyIssue(file, 1, f"YAML: {e}")]) from None
    except (RecursionError, ValueError, TypeError) as e:  # pathological inputs
        raise PolicyError([PolicyIssue(file, 1, f"YAML: {type(e).__name__}: {e}")]) from None
    if node is None or data is None:
        raise PolicyError([PolicyIssue(file, 1, "the policy is empty")])
    if not isinstance(data, dict):
        raise PolicyError([PolicyIssue(file, 1, "a policy is a mapping (version, pools, routes, ...)")])
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise PolicyError([PolicyIssue(file, 1, f"top-level keys must be names, got {bad_keys[0]!r}")])
    lines = _line_map(node)
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as e:
        issues = []
        for err in e.errors(include_url=False):
            loc = tuple(err["loc"])
            where = _format_loc(loc)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown key {loc[-1]!r}"
            issues.append(PolicyIssue(file, _line_for(loc, lines), f"{where}: {msg}" if where else msg, loc))
        raise PolicyError(issues) from None
    except (RecursionError, TypeError) as e:
        raise PolicyError([PolicyIssue(file, 1, f"{type(e).__name__}: {e}")]) from None
    refs = reference_problems(spec)
    if refs:
        raise PolicyError([PolicyIssue(file, _line_for(loc, lines), msg, loc) for loc, msg in refs])
    if spec.name is None and default_name:
        spec = spec.model_copy(update={"name": default_name})
    # Compile the rules now, so a bad regex or predicate is a load error, not a request error.
    try:
        compile_policy(spec, file)
    except PolicyError as e:
        raise PolicyError([PolicyIssue(file, _line_for(i.path, lines), i.reason, i.path) for i in e.issues]) from None
    return spec


def load_policy(path: str | Path) -> PolicySpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError([PolicyIssue(str(p), 0, "no such file")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError([PolicyIssue(str(p), 0, f"cannot read: {e}")]) from None
    return parse_policy(text, str(p), default_name=p.stem)


def policy_files(paths: list[str | Path]) -> list[Path]:
    """Expand folders into their *.yaml / *.yml files, in a stable order."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in {".yaml", ".yml"}))
        else:
            out.append(p)
    return out

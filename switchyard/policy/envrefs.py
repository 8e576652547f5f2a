"""Which environment variables a policy's `${NAME}` may expand: only those the operator allowed.

Whoever may edit a policy (the UI's editor takes edits from afar with the admin key) chooses the
upstream URL a pool's `api_key` is sent to, so an unbounded `${NAME}` would send any variable of
the gateway's environment to a server of their choosing. Allowed: names starting with
SWITCHYARD_ (the admin key excepted) and the names or fnmatch patterns given with `--allow-env`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

PREFIX = "SWITCHYARD_"
NEVER = frozenset({"SWITCHYARD_ADMIN_KEY"})  # the admin key expands only where listed by its own name
REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class EnvNotAllowed(ValueError):
    def __init__(self, name: str, what: str, allow: EnvAllow):
        self.name = name
        super().__init__(f"{what}: ${{{name}}} is not an environment variable policies may read; allowed: "
                         f"{allow.describe()} (the operator adds names with --allow-env)")


@dataclass(frozen=True, slots=True)
class EnvAllow:
    patterns: tuple[str, ...] = ()  # names or fnmatch patterns (OPENAI_*), from --allow-env

    def allows(self, name: str) -> bool:
        if name in self.patterns:
            return True
        if name.startswith(PREFIX) and name not in NEVER:
            return True
        return any(fnmatchcase(name, p) for p in self.patterns if name not in NEVER)

    def describe(self) -> str:
        return ", ".join([f"{PREFIX}*", *self.patterns])

    def check(self, value: str, what: str) -> None:
        for m in REF.finditer(value):
            if not self.allows(m.group(1)):
                raise EnvNotAllowed(m.group(1), what, self)


def line_of(text: str, name: str) -> int:
    """The 1-based line of the first `${name}` in a policy's text (1 when not found)."""
    i = text.find("${" + name + "}")
    return text.count("\n", 0, i) + 1 if i >= 0 else 1


def file_line_of(path: Path, name: str) -> int:
    try:
        return line_of(path.read_text(encoding="utf-8", errors="replace"), name)
    except OSError:
        return 1

"""The docs against the code: every repo path, Python module, make target, link and `switchyard`
command that README.md and docs/*.md name exists, and the README's two set-up commands and its
tour are what the tour test runs.

Fast and offline: the docs are read as text, and one subprocess (tests/docs_probe.py) resolves
every quoted `switchyard ...` command against the CLI, runs `switchyard PATH --help` for each
distinct one, and imports the named modules. Whatever file lands in docs/ is checked as it
comes, so a page that names a path that moved fails here with the page, the line and the path.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("docs_probe.py")

# Code blocks in these languages are examples of other formats: their words are not commands or paths
# (a policy's `path:` is relative to its own file, Python is run by the tour test).
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml", "jsonl", "html", "js", "javascript"}
FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"(?<![\w/.-])switchyard(?:\.[A-Za-z_]\w*)+")
OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
ENV = re.compile(r"^[A-Za-z_]\w*=")


@dataclass(frozen=True)
class Where:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Text:
    """One piece of a page: an inline code span, a line of a shell block, or a prose line."""
    kind: str  # "span" | "shell" | "prose"
    text: str
    where: Where


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def pieces(page: Path) -> Iterator[Text]:
    rel = str(page.relative_to(ROOT))
    lang: str | None = None
    pending, start = "", 0
    for n, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = fence.group(2).lower() if lang is None else None
            continue
        if lang is None:
            yield Text("prose", line, Where(rel, n))
            for m in SPAN.finditer(line):
                yield Text("span", m.group(1), Where(rel, n))
        elif lang not in NOT_SHELL:
            if not pending:
                start = n
            if line.rstrip().endswith("\\"):  # a command continued on the next line
                pending += line.rstrip()[:-1] + " "
                continue
            yield Text("shell", pending + line, Where(rel, start))
            pending = ""


@cache
def all_pieces() -> tuple[Text, ...]:
    return tuple(p for page in pages() for p in pieces(page))


def words_of(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in an example: split it plainly
        return text.split("#", 1)[0].split()


def commands(text: str) -> Iterator[list[str]]:
    """Each simple command of a shell line, its leading VAR=value assignments dropped."""
    for part in re.split(r"&&|\|\||[|;]", text):
        words = words_of(part)
        while words and ENV.match(words[0]):
            words = words[1:]
        if words:
            yield words


def quoted_commands() -> Iterator[tuple[str, list[str], Where]]:
    """(program, its arguments, where) for every command a page gives: shell lines, and inline
    spans that start with a program (`switchyard ...`, `make ...`)."""
    for p in all_pieces():
        if p.kind == "prose":
            continue
        for words in commands(p.text):
            prog = words[0].rsplit("/", 1)[-1]
            if p.kind == "span" and prog not in ("switchyard", "make"):
                continue
            yield prog, words[1:], p.where


# -- paths ------------------------------------------------------------------------------------------


@cache
def ignored() -> tuple[str, ...]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return tuple(x.strip().strip("/") for x in lines if x.strip() and not x.startswith("#") and "/" not in x.strip().strip("/"))


@cache
def roots() -> dict[str, Path]:
    """First path segments a doc's path may start with, and where they resolve: the repo's own
    top-level entries, else the package's (`api/dialect.py` is `switchyard/api/dialect.py`), else
    the engine's (docs/engine.md's map: `core/scheduler.py`)."""
    out: dict[str, Path] = {}
    for base in (ROOT / "switchyard" / "engine", ROOT / "switchyard", ROOT):
        for entry in base.iterdir():
            name = entry.name
            if name.startswith(".") or name == "__pycache__" or any(fnmatch.fnmatch(name, g) for g in ignored()):
                continue
            out[name] = base
    return out


def path_words() -> Iterator[tuple[str, Where]]:
    for p in all_pieces():
        if p.kind == "prose":
            continue
        for w in p.text.split():
            w = w.strip("`'\"()[],;:").rstrip(".")
            if "/" in w and not re.search(r"://|^[/~$<]|[{}=]", w) and w.split("/", 1)[0] in roots():
                yield w, p.where


def exists(word: str) -> bool:
    base = roots()[word.split("/", 1)[0]]
    if any(c in word for c in "*?["):
        return any(base.glob(word))
    return (base / word).exists()


def test_every_path_the_docs_name_exists() -> None:
    missing = sorted({f"{where}: {w}" for w, where in path_words() if not exists(w)})
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    heads = [p.text.lstrip("#") for p in pieces(page) if p.kind == "prose" and re.match(r"^#{1,6} ", p.text)]
    return frozenset(slug(h) for h in heads)


def test_every_link_leads_somewhere() -> None:
    broken = []
    for p in all_pieces():
        if p.kind != "prose":
            continue
        page = ROOT / p.where.file
        for m in LINK.finditer(re.sub(SPAN, "", p.text)):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):  # http(s), mailto: not ours to check offline
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{p.where}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{p.where}: {target} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_maps_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(readme)}
    unmapped = [f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not unmapped, f"docs pages the README's map does not link: {unmapped}"


# -- make targets, modules, commands ------------------------------------------------------------------


@cache
def make_targets() -> dict[str, str]:
    """Target -> its recipe, from the Makefile."""
    targets: dict[str, str] = {}
    current = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line)
        if m:
            current = m.group(1)
            targets[current] = ""
        elif line.startswith("\t") and current is not None:
            targets[current] += line.strip() + "\n"
        elif not line.strip().startswith("#") and line.strip():
            current = None
    return targets


def test_every_make_target_the_docs_name_exists() -> None:
    missing = sorted({f"{where}: make {' '.join(args)}" for prog, args, where in quoted_commands()
                      if prog == "make" and any(a not in make_targets() for a in args if not OPTION.match(a))})
    assert not missing, "make targets named in the docs that the Makefile lacks:\n" + "\n".join(missing)


@cache
def probe() -> dict:
    cmds = [(args, where) for prog, args, where in quoted_commands() if prog == "switchyard"]
    mods = sorted({m.group(0) for p in all_pieces() if p.kind != "prose" for m in MODULE.finditer(p.text)})
    req = {"commands": [a for a, _ in cmds], "modules": mods}
    out = subprocess.run([sys.executable, str(PROBE)], input=json.dumps(req), capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    res["where"] = [str(w) for _, w in cmds]
    res["args"] = [a for a, _ in cmds]
    return res


def test_every_switchyard_command_the_docs_quote_exists() -> None:
    res = probe()
    assert res["commands"], "no `switchyard ...` command found in the docs: the extraction broke"
    bad = []
    for where, args, r in zip(res["where"], res["args"], res["commands"], strict=True):
        line = "switchyard " + " ".join(args)
        if r["error"]:
            bad.append(f"{where}: {line}: {r['error']}")
        elif r["help_exit"] != 0:
            bad.append(f"{where}: `switchyard {' '.join(r['path'])} --help` exited {r['help_exit']}")
        elif r["unknown_options"]:
            bad.append(f"{where}: {line}: `switchyard {' '.join(r['path'])}` has no {', '.join(r['unknown_options'])}")
    assert not bad, "commands in the docs that the CLI does not have:\n" + "\n".join(bad)


def test_the_console_script_answers() -> None:
    """The installed entry point itself, once (the probe goes through the same typer app)."""
    script = Path(sys.executable).with_name("switchyard")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage: switchyard" in out.stdout, out.stderr[-2000:]


def test_every_module_the_docs_name_imports() -> None:
    res = probe()
    bad = {m: why for m, why in res["modules"].items() if why}
    assert not bad, f"modules named in the docs that do not import: {bad}"


# -- the front door: its two commands and its tour ----------------------------------------------------


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of the README's fenced blocks, in order."""
    out, lang, buf = [], None, []
    for line in (ROOT / "README.md").read_text().splitlines():
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, buf = fence.group(2), []
        elif fence:
            out.append((lang, "\n".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(line)
    return out


def up_defaults() -> dict:
    for r in probe()["commands"]:
        if r.get("path") == ["up"]:
            return r["defaults"]
    raise AssertionError("the docs quote no `switchyard up`")


def test_the_two_setup_commands_are_make_up_and_make_test() -> None:
    lang, first = readme_blocks()[0]
    assert lang == "bash"
    assert [" ".join(w) for w in map(words_of, first.splitlines()) if w] == ["make up", "make test"]
    targets = make_targets()
    assert re.search(r"(^|/)switchyard up\b", targets["up"], re.M), targets["up"]
    # `make test` runs the whole suite, the tour test included: nothing deselected.
    pytest_line = next(x for x in targets["test"].splitlines() if "pytest" in x)
    pytest_args = pytest_line.split("pytest", 1)[1]
    assert not re.search(r"\s(-m|-k|--ignore\S*|--deselect)\s", f" {pytest_args} "), pytest_line


def tour_test() -> tuple[Path, str]:
    """The test that runs the README's tour, and the source of its function that cuts the tour out."""
    hits = [p for p in (ROOT / "tests").rglob("test_*.py")
            if p.name != Path(__file__).name and "## A five-minute tour" in p.read_text()]
    assert len(hits) == 1, f"one test must run the README's tour; found {hits}"
    tree = ast.parse(hits[0].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and "## A five-minute tour" in ast.unparse(node):
            return hits[0], ast.unparse(node)
    raise AssertionError(f"{hits[0]}: no function reads the tour")


def test_the_tour_is_what_the_tour_test_runs() -> None:
    path, source = tour_test()
    scope: dict = {}
    exec(compile(source, str(path), "exec"), scope)
    fn = next(v for k, v in scope.items() if callable(v) and not k.startswith("__"))
    code = fn()
    # The README's tour: the first Python block after its heading.
    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("## A five-minute tour"):]
    assert re.search(r"^## ", tour[3:], re.M), "the tour has no section after it"
    blocks = [text for lang, text in readme_blocks() if lang == "python" and text in tour]
    assert blocks and blocks[0] == code, f"{path.name} runs something other than the README's tour"
    # ... against what `make up` starts: `switchyard up`'s own port and policy.
    d = up_defaults()
    assert f'base_url="http://127.0.0.1:{d["--port"]}/v1"' in code
    test_text = path.read_text()
    policy = Path(d["--policy"])
    assert " / ".join(f'"{part}"' for part in policy.parts) in test_text or str(policy) in test_text, (
        f"the tour test does not route through `switchyard up`'s policy {policy}")

"""Replay reports (`switchyard replay --out DIR`) found under the gateway's `--reports` folder.

A report is a folder holding report.html (with its PNGs and report.json). The folder given
may be one report itself or hold one report per sub-folder; the newest is listed first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT_ID = "_"
SERVED = {".html", ".png", ".svg", ".json", ".csv", ".txt"}
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


def _dirs(root: Path) -> list[tuple[str, Path]]:
    found = []
    if (root / "report.html").is_file():
        found.append((ROOT_ID, root))
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and _SAFE.match(d.name) and (d / "report.html").is_file():
                found.append((d.name, d))
    return found


def _summary(folder: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    runs = []
    for r in data.get("runs", []) if isinstance(data, dict) else []:
        t = r.get("totals") or {}
        runs.append({"name": r.get("name"), "mode": r.get("mode"), "cases": t.get("cases"),
                     "score": t.get("score"), "large_share": t.get("large_share"), "split": t.get("split"),
                     "cost_usd": t.get("cost_usd"), "saved_pct": t.get("saved_pct")})
    return runs


def list_reports(root: Path | None) -> list[dict[str, Any]]:
    if root is None:
        return []
    out = []
    for rid, folder in _dirs(root):
        html = folder / "report.html"
        out.append({"id": rid, "name": folder.name, "path": str(folder), "mtime": html.stat().st_mtime,
                    "runs": _summary(folder)})
    out.sort(key=lambda r: r["mtime"], reverse=True)
    return out


def report_file(root: Path | None, rid: str, name: str) -> Path | None:
    """The file to serve, or None: only plain names, only report files, only inside the folder."""
    if root is None or not _SAFE.match(name) or not (rid == ROOT_ID or _SAFE.match(rid)):
        return None
    folder = root if rid == ROOT_ID else root / rid
    p = (folder / name).resolve()
    if p.suffix.lower() not in SERVED or not p.is_file() or not p.is_relative_to(root.resolve()):
        return None
    return p

"""The browser UI at /ui: a live dashboard, a policy editor and the replay reports.

Static HTML/CSS/JS live in `static/` (served from the package; no CDN, works offline);
the HTTP routes are in switchyard/api/ui.py.
"""

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"

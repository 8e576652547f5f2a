"""The UI against a real gateway process in front of real upstream processes, seen by Debian's chromium.

Playwright (PyPI `playwright`) drives /usr/bin/chromium; no browser is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from procs import ROOT, Proc, http_post, start_gateway, start_upstream, stop_all

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
HEALTH_INTERVAL = 0.5  # seconds, the pools' health-check interval in POLICY

POLICY = """\
version: 1
name: ui
pools:
  small:
    model: small-model
    price: {{prompt: 0.1, completion: 0.4}}
    health: {{interval: {hi}s, timeout: 0.4s}}
    circuit: {{failures: 3, cooldown: 30s}}
    replicas:
      - {{url: {s0}/v1, name: s0}}
      - {{url: {s1}/v1, name: s1}}
  large:
    model: large-model
    price: {{prompt: 2.5, completion: 10}}
    health: {{interval: {hi}s, timeout: 0.4s}}
    replicas:
      - {{url: {l0}/v1, name: l0}}
classifier:
  kind: onnx
  path: {onnx}
routes:
  - name: hard
    when: {{text: "(?i)hard problem"}}
    pool: large
  - name: default
    pool: small
fallback:
  small: [large]
"""


@dataclass
class UiCluster:
    tmp: Path
    ups: dict[str, tuple[Proc, str]]
    gw: Proc
    url: str
    policy: Path
    reports: Path
    procs: list[Proc] = field(default_factory=list)

    def chat(self, text: str, n: int = 1) -> list[str]:
        """Send `n` chat requests; return the pool each went to."""
        pools = []
        for _ in range(n):
            body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]})
            import urllib.request

            req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
                pools.append(r.headers["x-switchyard-pool"])
        return pools

    def route(self, text: str) -> str:
        status, raw = http_post(self.url + "/v1/route", orjson.dumps(
            {"model": "auto", "messages": [{"role": "user", "content": text}]}))
        assert status == 200, raw
        return orjson.loads(raw)["pool"]


def write_policy(tmp: Path, ups: dict[str, tuple[Proc, str]]) -> Path:
    policy = tmp / "ui.yaml"
    policy.write_text(POLICY.format(hi=HEALTH_INTERVAL, s0=ups["s0"][1], s1=ups["s1"][1], l0=ups["l0"][1],
                                    onnx=ROOT / "classifiers" / "tool-complexity.onnx"))
    return policy


def make_ui_cluster(tmp: Path, *extra: str) -> UiCluster:
    ups = {n: start_upstream(tmp, n) for n in ("s0", "s1", "l0")}
    policy = write_policy(tmp, ups)
    reports = tmp / "reports"
    reports.mkdir(exist_ok=True)
    try:
        gw, url = start_gateway(tmp, [policy], "--reports", str(reports), "--drain-grace", "0", *extra)
    except Exception:
        for p, _ in ups.values():
            p.stop()
        raise
    return UiCluster(tmp, ups, gw, url, policy, reports)


def start_lone_gateway(tmp: Path, *extra: str) -> tuple[Proc, str, Path, Path]:
    """A gateway in front of ports nothing listens on, health checks off: for what needs no traffic."""
    from procs import free_port

    dead = {n: (None, f"http://127.0.0.1:{free_port()}") for n in ("s0", "s1", "l0")}
    policy = write_policy(tmp, dead)  # type: ignore[arg-type]
    reports = tmp / "reports"
    reports.mkdir(exist_ok=True)
    gw, url = start_gateway(tmp, [policy], "--no-health-checks", "--drain-grace", "0", "--reports", str(reports),
                            *extra)
    return gw, url, policy, reports


def stop(c: UiCluster) -> None:
    stop_all([c.gw, *(p for p, _ in c.ups.values())])


@pytest.fixture
def ui_cluster(tmp_path: Path) -> Iterator[UiCluster]:
    c = make_ui_cluster(tmp_path)
    yield c
    stop(c)


def replay_report(policy: Path, out: Path) -> None:
    """A real replay report: the shipped 92-case suite through the policy, routing only (a child process:
    the replay runs its own event loop, and Playwright's sync API holds this thread's)."""
    res = subprocess.run([sys.executable, "-m", "switchyard.cli", "replay", "tooluse-92", "--dry-run", "-p",
                          str(policy), "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (out / "report.html").is_file()


@pytest.fixture(scope="module")  # not session: a live sync Playwright loop breaks later asyncio tests
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, tmp_path: Path):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

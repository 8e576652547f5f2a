"""The dashboard in a real browser: live pools with counts, a dead replica marked, replay reports."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from playwright.sync_api import expect
from procs import http_get
from uikit import HEALTH_INTERVAL, UiCluster, replay_report, start_lone_gateway

POLL_S = 1.0  # the page polls /ui/api/live once a second


def _metrics_count(c: UiCluster, pool: str) -> int:
    """Requests the gateway's own Prometheus counter holds for a pool (what the page must agree with)."""
    _, raw = http_get(c.url + "/metrics")
    total = 0.0
    for line in raw.decode().splitlines():
        if line.startswith("switchyard_requests_total{") and f'pool="{pool}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_dashboard_shows_both_pools_live_then_a_dead_replica(ui_cluster: UiCluster, page, tmp_path: Path) -> None:
    c = ui_cluster
    assert set(c.chat("hello there", 12)) == {"small"}
    assert set(c.chat("a hard problem: prove it", 6)) == {"large"}
    page.goto(c.url + "/ui")

    small = page.locator('[data-pool="ui/small"]')
    large = page.locator('[data-pool="ui/large"]')
    expect(small).to_have_attribute("data-count", str(_metrics_count(c, "small")))
    expect(large).to_have_attribute("data-count", str(_metrics_count(c, "large")))
    assert int(small.get_attribute("data-count")) == 12 and int(large.get_attribute("data-count")) == 6
    # every replica that served shows its own non-zero count; the split bars agree
    counts = [int(x) for x in small.locator("tr[data-replica] .count").all_inner_texts()]
    assert sum(counts) == 12 and max(counts) > 0
    expect(large.locator('tr[data-replica="l0"] .count')).to_have_text("6")
    expect(page.locator('[data-split-pool="ui/large"]')).to_have_attribute("data-count", "6")
    expect(page.locator('[data-split-rule="ui/hard"]')).to_have_attribute("data-count", "6")
    expect(page.locator('#recent tbody tr[data-pool="large"]')).to_have_count(6)
    expect(page.locator("#classifier")).to_contain_text("onnx")
    page.screenshot(path=str(tmp_path / "1-dashboard-live.png"), full_page=True)

    # Traffic that arrives while the page is open shows up without a reload.
    c.chat("a hard problem again", 4)
    expect(large).to_have_attribute("data-count", "10")

    expect(small.locator('tr[data-replica="s1"]')).to_have_attribute("data-state", "healthy")
    c.ups["s1"][0].kill()
    t0 = time.monotonic()
    expect(small.locator('tr[data-replica="s1"]')).to_have_attribute("data-state", "unhealthy", timeout=10_000)
    seen_after = time.monotonic() - t0
    # the health check notices within its interval; the page shows it at its next poll
    assert seen_after <= HEALTH_INTERVAL + POLL_S + 1.0, seen_after
    expect(small.locator('tr[data-replica="s0"]')).to_have_attribute("data-state", "healthy")
    expect(small.locator(".healthy-count")).to_have_text("1/2")
    expect(small.locator("tr.err")).to_contain_text("GET http://127.0.0.1:")  # the health check's own error
    (tmp_path / "unhealthy-after-s.txt").write_text(f"{seen_after:.2f}\n")
    page.screenshot(path=str(tmp_path / "2-replica-unhealthy.png"), full_page=True)

    # The gateway routes around it: new small traffic all lands on s0 and the page counts it.
    before = int(small.locator('tr[data-replica="s0"] .count').inner_text())
    assert set(c.chat("hello again", 5)) == {"small"}
    expect(small.locator('tr[data-replica="s0"] .count')).to_have_text(str(before + 5))


def test_live_api_agrees_with_health_and_metrics(ui_cluster: UiCluster) -> None:
    c = ui_cluster
    c.chat("hello", 3)
    c.chat("a hard problem", 2)
    time.sleep(1.2)  # one background sample, so the series has a point with traffic
    status, raw = http_get(c.url + "/ui/api/live?window=60")
    assert status == 200
    live = orjson.loads(raw)
    _, hraw = http_get(c.url + "/health")
    health = orjson.loads(hraw)
    pools = {p["name"]: p for p in live["policies"][0]["pools"]}
    for name in ("small", "large"):
        assert pools[name]["count"] == _metrics_count(c, name)
        assert pools[name]["healthy"] == health["policies"]["ui"]["pools"][name]["healthy"]
        assert pools[name]["p50_ms"] is not None and pools[name]["p50_ms"] > 0
    assert live["split"]["window"]["pools"] == {"ui/small": 3.0, "ui/large": 2.0}
    assert live["split"]["window"]["rules"] == {"ui/default": 3.0, "ui/hard": 2.0}
    assert sum(live["series"]["pools"]["ui/small"]) > 0
    assert [d["pool"] for d in live["recent"]] == ["large", "large", "small", "small", "small"]
    assert live["recent"][0]["rule"] == "hard" and live["recent"][0]["label"] in ("simple", "complex")
    assert live["classifier"][0]["kind"] == "onnx" and live["classifier"][0]["count"] == 5


def test_replay_tab_shows_the_reports(tmp_path: Path, page) -> None:
    gw, url, policy, reports = start_lone_gateway(tmp_path)
    try:
        page.goto(url + "/ui#replay")
        expect(page.locator("#reports")).to_contain_text("No reports in")
        replay_report(policy, reports / "tooluse-dry")
        page.reload()
        card = page.locator('.report[data-report="tooluse-dry"]')
        expect(card).to_contain_text("92 cases")
        frame = page.frame_locator("#report-frame")
        expect(frame.locator("h1")).to_have_text("switchyard replay")
        expect(frame.locator("img").first).to_be_visible()
        loaded = frame.locator("img").evaluate_all("imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
        assert loaded and all(loaded)
        page.screenshot(path=str(tmp_path / "3-replay.png"), full_page=True)
        # report files are served from that folder only
        assert http_get(url + "/ui/reports/tooluse-dry/..%2F..%2Fui.yaml")[0] == 404
        assert http_get(url + "/ui/reports/tooluse-dry/report.json")[0] == 200
    finally:
        gw.stop()

"""The dashboard in a real browser: live pools with counts, a dead replica marked, replay reports."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
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
    # Tokens and cost per pool, and the savings line (the test upstreams answer 10 prompt and 5
    # completion tokens; small costs 0.1/0.4, large 2.5/10 USD per million).
    page.select_option("#window", "total")
    expect(small.locator("[data-tokens]")).to_have_attribute("data-tokens", "120/60/0")
    expect(large.locator("[data-tokens]")).to_have_attribute("data-tokens", "60/30/0")
    line = page.locator('[data-cost-policy="ui"]')
    expect(line).to_contain_text("large-only would have cost")
    spent, base = 12 * 3e-6 + 6 * 75e-6, 18 * 75e-6
    assert float(line.get_attribute("data-spent")) == pytest.approx(spent)
    assert float(line.get_attribute("data-baseline")) == pytest.approx(base)
    assert float(line.get_attribute("data-saved")) == pytest.approx(base - spent)
    expect(line).to_contain_text(f"({100 * (base - spent) / base:.1f}%)")
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
    assert pools["small"]["tokens"] == {"prompt": 30, "completion": 15, "cached": 0}
    assert pools["large"]["cost_usd"] == pytest.approx(2 * 75e-6)
    cost = live["policies"][0]["cost"]["window"]
    assert cost["baseline_pool"] == "large" and cost["spent_usd"] == pytest.approx(3 * 3e-6 + 2 * 75e-6)
    assert cost["baseline_usd"] == pytest.approx(5 * 75e-6)
    assert cost["saved_pct"] == pytest.approx(100 * (5 * 75e-6 - 159e-6) / (5 * 75e-6), abs=0.01)
    assert live["recent"][0]["tokens"] == {"prompt": 10, "completion": 5, "cached": 0}


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


def test_least_load_pools_show_each_engines_own_load(tmp_path: Path, page) -> None:
    from procs import http_post, start_gateway, start_upstream

    up, up_url = start_upstream(tmp_path, "e0")
    gw = None
    try:
        metrics = "sglang:num_running_reqs 6\nsglang:num_queue_reqs 2\nsglang:token_usage 0.7\n"
        assert http_post(up_url + "/_control", orjson.dumps({"metrics": metrics}))[0] == 200
        policy = tmp_path / "ll.yaml"
        policy.write_text("version: 1\nname: ll\npools:\n  p:\n    model: m\n    strategy: least_load\n"
                          "    load: {interval: 200ms}\n    health: {interval: 0}\n"
                          f"    replicas: [{{url: {up_url}/v1, name: e0}}]\nroutes: [{{name: d, pool: p}}]\n")
        gw, url = start_gateway(tmp_path, [policy])
        page.goto(url + "/ui")
        cell = page.locator('[data-pool="ll/p"] tr[data-replica="e0"] [data-engine-running]')
        expect(cell).to_have_text("6/2 · 70%")
        assert "this gateway" in (cell.get_attribute("title") or "")
    finally:
        if gw is not None:
            gw.stop()
        up.stop()

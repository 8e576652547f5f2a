"""Who gets the UI: the admin key holder when there is one (log in once, HttpOnly cookie), nobody when
API keys are on without an admin key, and nothing at all with --no-ui."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import orjson
from playwright.sync_api import expect
from procs import http_get, http_post
from uikit import UiCluster, make_ui_cluster, start_lone_gateway, stop

ADMIN_KEY = "ui-test-admin-key-0123456789"


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_admin_key_guards_the_ui_and_the_page_logs_in(tmp_path: Path, page) -> None:
    c: UiCluster = make_ui_cluster(tmp_path, "--admin-key", ADMIN_KEY)
    try:
        c.chat("hello", 3)
        # the page itself loads (it holds the login form); its data does not without the key
        assert http_get(c.url + "/ui")[0] == 200
        for path in ("/ui/api/live", "/ui/api/policies", "/ui/api/reports", "/ui/api/schema"):
            status, raw = http_get(c.url + path)
            assert status == 401, path
            assert orjson.loads(raw)["error"]["code"] == "invalid_admin_key"
        text = c.policy.read_text()
        status, _ = http_post(c.url + "/ui/api/policies/apply", orjson.dumps({"name": "ui", "text": text + "#\n"}))
        assert status == 401 and c.policy.read_text() == text
        assert _get(c.url + "/ui/api/live", {"Authorization": "Bearer wrong"})[0] == 401
        status, raw = _get(c.url + "/ui/api/live", {"Authorization": f"Bearer {ADMIN_KEY}"})
        assert status == 200 and orjson.loads(raw)["policies"][0]["name"] == "ui"

        page.goto(c.url + "/ui")
        expect(page.locator("#login")).to_be_visible()
        expect(page.locator("#app")).to_be_hidden()
        page.screenshot(path=str(tmp_path / "1-login.png"))
        page.fill("#admin-key", "not-the-key")
        page.click("#login-form button")
        expect(page.locator("#login-error")).to_have_text("wrong admin key")
        page.fill("#admin-key", ADMIN_KEY)
        page.click("#login-form button")
        expect(page.locator('[data-pool="ui/small"]')).to_have_attribute("data-count", "3")
        cookie = next(k for k in page.context.cookies() if k["name"] == "switchyard_ui")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ADMIN_KEY not in cookie["value"]
        assert page.evaluate("document.cookie") == ""  # scripts never see it
        page.screenshot(path=str(tmp_path / "2-logged-in.png"), full_page=True)

        page.click("#logout")
        expect(page.locator("#login")).to_be_visible()
        assert not [k for k in page.context.cookies() if k["name"] == "switchyard_ui"]
    finally:
        stop(c)


def test_api_keys_without_an_admin_key_lock_the_ui(tmp_path: Path) -> None:
    gw, url, _, _ = start_lone_gateway(tmp_path, "--auth", "--keys-file", str(tmp_path / "keys.json"))
    try:
        status, raw = http_get(url + "/ui/api/session")
        assert status == 200 and orjson.loads(raw) == {"auth": "locked", "ok": False}
        status, raw = http_get(url + "/ui/api/live")
        assert status == 403 and "--admin-key" in orjson.loads(raw)["error"]["message"]
    finally:
        gw.stop()


def test_no_ui_serves_no_ui(tmp_path: Path) -> None:
    gw, url, _, _ = start_lone_gateway(tmp_path, "--no-ui")
    try:
        for path in ("/ui", "/ui/api/live", "/ui/static/app.js"):
            assert http_get(url + path)[0] == 404, path
        assert http_get(url + "/v1/models")[0] == 200
        assert "/ui" not in gw.output()
    finally:
        gw.stop()

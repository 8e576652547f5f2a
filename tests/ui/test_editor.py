"""The policy editor in a real browser: errors with their lines as you type, preview, apply, the split moving."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from playwright.sync_api import expect
from procs import http_get, http_post
from typer.testing import CliRunner
from uikit import UiCluster, start_lone_gateway

from switchyard.cli import app as cli_app

ISSUE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<reason>.+)$")


def policy_check(tmp: Path, text: str) -> list[tuple[int, str]]:
    """What `switchyard policy check` says about `text`: (line, reason) for every problem."""
    f = tmp / "check.yaml"
    f.write_text(text)
    res = CliRunner().invoke(cli_app, ["policy", "check", str(f)])
    out = []
    for line in res.output.splitlines():
        m = ISSUE.match(line)
        if m and m["file"] == str(f):
            out.append((int(m["line"]), m["reason"]))
    assert (res.exit_code != 0) == bool(out), res.output
    return out


def caret_to_end_of_line(page, n: int) -> None:
    """Put the caret at the end of line `n` of the editor (then the test types with the keyboard)."""
    page.locator("#policy-text").evaluate(
        """(ta, n) => { const lines = ta.value.split("\\n"); let pos = 0;
           for (let i = 0; i < n; i++) pos += lines[i].length + 1;
           ta.focus(); ta.setSelectionRange(pos - 1, pos - 1); }""", n)


def split_share(page, pool: str) -> float:
    bar = page.locator(f'[data-split-pool="{pool}"]')
    expect(bar).to_be_visible()
    return float(bar.get_attribute("data-share"))


def test_type_an_error_see_its_line_then_apply_and_the_split_changes(ui_cluster: UiCluster, page,
                                                                     tmp_path: Path) -> None:
    c = ui_cluster
    assert set(c.chat("hello", 9)) == {"small"}
    assert set(c.chat("a hard problem", 3)) == {"large"}
    page.goto(c.url + "/ui")
    expect(page.locator('[data-split-pool="ui/large"]')).to_have_attribute("data-count", "3")
    before = split_share(page, "ui/large")
    assert before == 25.0

    page.click('a[data-tab="policies"]')
    original = c.policy.read_text()
    expect(page.locator("#policy-text")).to_have_value(original)
    expect(page.locator("#validity")).to_have_text(re.compile("valid: pools small, large"))
    lines = original.splitlines()
    n = lines.index("    pool: small") + 1  # the default rule's pool

    # Type an invalid policy: the default rule names a pool that does not exist.
    caret_to_end_of_line(page, n)
    for _ in range(len("small")):
        page.keyboard.press("Backspace")
    page.keyboard.type("medium")
    typed = page.locator("#policy-text").input_value()
    assert typed.splitlines()[n - 1] == "    pool: medium"
    expected = policy_check(tmp_path, typed)
    assert expected and expected[0][0] == n
    issues = page.locator("#issues li")
    expect(issues).to_have_count(len(expected))
    expect(issues.first).to_have_text(f"line {expected[0][0]}: {expected[0][1]}")
    expect(page.locator(f'#gutter .bad[data-line="{n}"]')).to_be_visible()
    expect(page.locator("#validity")).to_contain_text("1 problem")
    page.screenshot(path=str(tmp_path / "1-invalid-policy.png"), full_page=True)

    # Applying it is refused; the running policy and the file stay as they were.
    page.click("#apply")
    expect(page.locator("#apply-result")).to_have_text("not applied: the running policy stays")
    assert c.policy.read_text() == original
    assert c.route("hello") == "small"

    # Fix it to send the default rule to the large pool; preview, then apply.
    caret_to_end_of_line(page, n)
    for _ in range(len("medium")):
        page.keyboard.press("Backspace")
    page.keyboard.type("large")
    expect(page.locator("#validity")).to_have_text(re.compile("valid: pools small, large"))
    expect(issues).to_have_count(0)
    page.locator("#preview-request").fill(orjson.dumps(
        {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}).decode())
    page.click("#preview")
    expect(page.locator('[data-decision="edited"] .d-pool')).to_have_text("large")
    expect(page.locator('[data-decision="edited"] .d-rule')).to_have_text("default")
    expect(page.locator('[data-decision="running"] .d-pool')).to_have_text("small")
    page.screenshot(path=str(tmp_path / "2-preview.png"), full_page=True)

    page.click("#apply")
    expect(page.locator("#apply-result")).to_contain_text("applied: policy ui reloaded")
    assert c.policy.read_text().splitlines()[n - 1] == "    pool: large"
    assert c.route("hello") == "large"
    _, raw = http_get(c.url + "/health")
    assert orjson.loads(raw)["policies"]["ui"]["last_reload"]["ok"] is True
    page.screenshot(path=str(tmp_path / "3-applied.png"), full_page=True)

    # The same traffic now goes to the large pool, and the dashboard's split moves.
    assert set(c.chat("hello", 9)) == {"large"}
    page.click('a[data-tab="dashboard"]')
    expect(page.locator('[data-split-pool="ui/large"]')).to_have_attribute("data-count", "12")
    after = split_share(page, "ui/large")
    assert after == pytest.approx(100 * 12 / 21, abs=0.1) and after > before
    page.screenshot(path=str(tmp_path / "4-split-changed.png"), full_page=True)


def test_key_completion_from_the_schema(lone_gateway, page) -> None:
    url, policy = lone_gateway
    page.goto(url + "/ui#policies")
    expect(page.locator("#validity")).to_contain_text("valid")
    n = policy.read_text().splitlines().index("    model: small-model") + 1
    caret_to_end_of_line(page, n)
    page.keyboard.press("Enter")
    page.keyboard.type("    stra")
    page.keyboard.press("Control+Space")
    popup = page.locator("#complete")
    expect(popup).to_be_visible()
    expect(popup.locator("li")).to_have_count(1)
    expect(popup.locator("li.sel")).to_contain_text("strategy")
    expect(page.locator("#key-hint")).to_contain_text("least_inflight | power_of_two | round_robin")
    page.keyboard.press("Enter")
    page.keyboard.type("round_robin")
    assert page.locator("#policy-text").input_value().splitlines()[n] == "    strategy: round_robin"
    expect(page.locator("#validity")).to_contain_text("valid")
    # At the top level the schema's own keys are offered, less those already written.
    page.keyboard.press("Control+End")
    page.keyboard.press("Enter")
    page.keyboard.press("Control+Space")
    keys = set(popup.locator("li").evaluate_all("lis => lis.map(li => li.dataset.key)"))
    assert {"session", "description"} <= keys and not keys & {"version", "pools", "routes", "fallback"}
    page.keyboard.press("Escape")
    expect(popup).to_be_hidden()


BROKEN = {
    "yaml syntax": ("routes:\n  - name: a\n    pool: [small\n", None),
    "unknown key": ("    model: small-model\n", "    modle: small-model\n"),
    "bad regex": ('    when: {text: "(?i)hard problem"}\n', '    when: {text: "(unclosed"}\n'),
    "unknown pool": ("    pool: small\n", "    pool: medium\n"),
}


@pytest.fixture(scope="module")
def lone_gateway(tmp_path_factory):
    """A gateway in front of nothing: the editor's API and completion need no traffic."""
    gw, url, policy, _ = start_lone_gateway(tmp_path_factory.mktemp("lone"))
    yield url, policy
    gw.stop()


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_validate_says_what_policy_check_says(lone_gateway, tmp_path: Path, case: str) -> None:
    url, policy = lone_gateway
    text = policy.read_text()
    old, new = BROKEN[case]
    broken = text + old if new is None else text.replace(old, new, 1)
    assert broken != text
    status, raw = http_post(url + "/ui/api/policies/validate", orjson.dumps({"name": "ui", "text": broken}))
    assert status == 200
    got = orjson.loads(raw)
    assert got["ok"] is False
    assert [(i["line"], i["reason"]) for i in got["issues"]] == policy_check(tmp_path, broken)
    # and apply refuses it without touching the file
    status, raw = http_post(url + "/ui/api/policies/apply", orjson.dumps({"name": "ui", "text": broken}))
    assert status == 422 and policy.read_text() == text

"""The console in a real headless Chromium, and the Grafana dashboards and alert rules against the
metrics our servers really expose, both on one live stack (``console_stack``): emulated P/D
cluster, gateway in AMPD mode with token operations, some agent traffic and a breaker trip.

The browser is the Debian ``chromium`` with its ``chromium-driver`` (``make browser-deps``;
``.ci/run`` installs them). Without them the browser test is skipped on a laptop and fails in CI
(``CI=true``). Screenshots of every page land in the test's ``tmp_path``/screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from helpers.console_stack import ADMIN_KEY, Stack, agent_session, chat, live_stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with live_stack(tmp_path_factory.mktemp("stack")) as s:
        yield s


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        why = "Chromium and chromium-driver are not installed (make browser-deps)"
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": CI must run the browser test")
        pytest.skip(why)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must not look for drivers online
    opts = Options()
    opts.binary_location = chromium
    for flag in (*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    b = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    try:
        with capsys.disabled():
            print(f"\n[console browser test] launched {chromium} {b.capabilities.get('browserVersion')} headless")
        b.set_page_load_timeout(20)
        yield b
    finally:
        b.quit()


def _click(b: Any, element: Any) -> None:
    """Click a submit button or link and wait until the next page replaced this one."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    # Mark this page's window and wait for a loaded document without the mark. Waiting for the old
    # <html> element to go stale races the navigation: chromedriver can answer "Node with given id
    # does not belong to the document" (a WebDriverException, not a StaleElementReferenceException)
    # while the old document is being torn down, which failed a CI run.
    b.execute_script("window.__tokenomy_old_page = true")
    element.click()
    WebDriverWait(b, 15, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return window.__tokenomy_old_page === undefined && document.readyState === 'complete'"))


def _shot(b: Any, folder: Path, name: str) -> Path:
    """A full-page screenshot (the viewport grown to the page's height, at most 3000 px)."""
    b.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})  # measure the page, not the last override
    height = int(b.execute_script("return document.documentElement.scrollHeight"))
    b.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": min(max(height, 600), 3000),
                                                              "deviceScaleFactor": 1, "mobile": False})
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.png"
    assert b.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def test_console_in_a_real_browser(stack: Stack, browser: Any, tmp_path: Path) -> None:
    """Log in, create a key, use it, lower its budget until the gateway refuses it, revoke it;
    every page shows the stack's data."""
    from selenium.webdriver.common.by import By

    b, shots, css = browser, tmp_path / "screenshots", By.CSS_SELECTOR
    b.get(stack.url + "/console/")
    assert b.current_url.endswith("/console/login")
    b.find_element(By.ID, "admin_key").send_keys("not-the-key")
    _click(b, b.find_element(By.ID, "sign_in"))
    assert "not the admin key" in b.find_element(By.ID, "error").text
    _shot(b, shots, "0-login")
    b.find_element(By.ID, "admin_key").send_keys(ADMIN_KEY)
    _click(b, b.find_element(By.ID, "sign_in"))
    assert b.current_url.endswith("/console/tenants")
    cookie = b.get_cookie("tokenomy_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    names = [r.get_attribute("data-name") for r in b.find_elements(css, "#tree tbody tr")]
    assert names[:3] == ["acme", "agents", "ci-bot"] and "globex" in names
    team = next(o for o in b.find_elements(css, "#team_id option") if o.text == "acme / agents")
    team.click()
    b.find_element(By.ID, "key_name").send_keys("browser-key")
    _click(b, b.find_element(By.ID, "create"))
    raw = b.find_element(By.ID, "new_key_value").text
    assert raw.startswith("tk-")

    with httpx.Client(base_url=stack.url, timeout=60) as client:
        agent_session(client, raw, "browser-session", turns=2)  # the new key works through the gateway
        row = b.find_element(css, 'tr[data-name="browser-key"]')
        budget = row.find_element(css, "input.budget")
        budget.clear()
        budget.send_keys("0.0001")  # below the two turns it spent
        _click(b, row.find_element(css, "button.set_budget"))
        assert "budget of browser-key set" in b.find_element(By.ID, "message").text
        refused = chat(client, raw, "browser-session", [{"role": "user", "content": "one more"}])
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "budget_exceeded")
        row = b.find_element(css, 'tr[data-name="browser-key"]')
        assert "$0.0001 / month" in row.text and "100.0%" in row.text
        _shot(b, shots, "1-tenants")

        b.get(stack.url + "/console/spend")
        assert b.find_element(By.ID, "total_spent").text not in ("$0.0000", "")
        sessions = b.find_element(By.ID, "sessions").text
        assert "trip-planner-1" in sessions and "browser-session" in sessions
        assert len(b.find_elements(css, "svg.chart rect")) >= 4  # every chart has bars
        _shot(b, shots, "2-spend")

        _click(b, b.find_element(By.LINK_TEXT, "browser-session"))
        assert len(b.find_elements(css, "#turns tbody tr")) == 2
        _shot(b, shots, "3-session")

        b.get(stack.url + "/console/live")
        live = b.find_element(By.ID, "live").text
        assert "runaway-agent" in live and "open: breaker_repetition" in live and "decode-0" in live
        assert "breaker_trip" in b.find_element(By.ID, "events").text
        _shot(b, shots, "4-live")

        b.get(stack.url + "/console/cluster")
        backends = b.find_element(By.ID, "backends").text
        assert "prefill-0" in backends and "decode-0" in backends and "down" not in backends
        assert len(b.find_elements(css, "svg.chart rect")) >= 1  # AMPD placed the turns
        _shot(b, shots, "5-cluster")

        b.get(stack.url + "/console/tenants")
        _click(b, b.find_element(css, 'tr[data-name="browser-key"] button.revoke'))
        assert "key browser-key revoked" in b.find_element(By.ID, "message").text
        gone = chat(client, raw, "browser-session", [{"role": "user", "content": "after revoke"}])
        assert (gone.status_code, gone.json()["error"]["code"]) == (401, "invalid_api_key")
    assert sorted(p.name for p in shots.iterdir()) == [
        "0-login.png", "1-tenants.png", "2-spend.png", "3-session.png", "4-live.png", "5-cluster.png"]


# --- dashboards and alert rules --------------------------------------------------------------------


def exposed_names(text: str) -> set[str]:
    """Every series name a /metrics page can produce, empty labelled families included."""
    names: set[str] = set()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("_sum", "_count", "_created"), "gauge": ("",)}
    for fam in text_string_to_metric_families(text):
        names.update(fam.name + s for s in suffixes.get(fam.type, ("",)))
        names.update(s.name for s in fam.samples)
    return names


def used_selectors() -> list[tuple[str, str, dict[str, str]]]:
    """(where, metric name, label matchers) of every vector selector in every panel and rule."""
    promql = pytest.importorskip("promql_parser")
    exprs: list[tuple[str, str]] = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            assert panel["targets"], f"{path.name}: panel {panel['title']!r} has no query"
            exprs += [(f"{path.name}: {panel['title']}", t["expr"]) for t in panel["targets"]]
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        exprs += [(f"alerts.yml: {r['alert']}", r["expr"]) for r in group["rules"]]
    found: list[tuple[str, str, dict[str, str]]] = []
    for where, expr in exprs:
        ast = promql.parse(expr.replace("$__rate_interval", "5m"))  # raises on invalid PromQL

        def visit(node: Any, where: str = where) -> None:
            if isinstance(node, promql.VectorSelector):
                found.append((where, node.name, {m.name: m.value for m in node.matchers.matchers}))

        promql.walk(ast, visit)
    return found


def test_every_dashboard_and_alert_metric_is_exposed(stack: Stack) -> None:
    gateway = httpx.get(stack.url + "/metrics", timeout=10).text
    exposed = exposed_names(gateway)
    for url in stack.engines.values():
        exposed |= exposed_names(httpx.get(url + "/metrics", timeout=10).text)
    selectors = used_selectors()
    assert len(DASHBOARDS) == 3 and len({w for w, _, _ in selectors if w.startswith("alerts.yml")}) == 4
    missing = sorted({f"{where}: {name}" for where, name, _ in selectors if name not in exposed})
    assert not missing, "metrics used but not exposed:\n" + "\n".join(missing)
    # a histogram bucket named in a rule must be one the server has
    families = {f.name: f for f in text_string_to_metric_families(gateway)}
    for where, name, labels in selectors:
        if name.endswith("_bucket") and "le" in labels:
            fam = families[name.removesuffix("_bucket")]
            assert labels["le"] in {s.labels["le"] for s in fam.samples if s.name == name}, where

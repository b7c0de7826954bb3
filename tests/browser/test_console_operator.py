"""The console in a real browser: Playwright driving Debian's Chromium against a
real broker process, with paho-mqtt clients on the other side.  Screenshots of
every page go to ``test-artifacts/`` (gitignored) for a human to look at."""

from __future__ import annotations

import json
from typing import Any

from chromium import (
    NEEDS_CHROMIUM,
    WAIT_MS,
    Watch,
    expect,
    login,
    shot,
)
from console_support import Paho, initial_password

# Every browser test: skipped (with why) where Debian's chromium is missing.
pytestmark = NEEDS_CHROMIUM


def test_operator_session_in_chromium(browser: Any, broker: Any) -> None:
    """Log in, watch a client appear live, force its will, clear a session; screenshot all."""
    proc, data = broker
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    watch = Watch(page)
    clients: list[Paho] = []
    try:
        page.goto(base + "/login")
        shot(page, "01-login")
        login(page, base, initial_password(data))

        # Overview: live counters and the rate chart move while messages flow.
        publisher = Paho(proc.mqtt_port, "line-7-plc")
        clients.append(publisher)
        rate = page.locator('[data-stat="rates.in"]')
        for i in range(40):
            publisher.publish(f"plant/line7/temp/{i % 4}", json.dumps(
                {"celsius": 20 + i % 5, "seq": i}).encode(), 0, retain=i >= 36)
        expect(rate).not_to_have_text("0.0", timeout=WAIT_MS)
        # The rate chart is drawn by the vendored uPlot (a canvas inside the box).
        expect(page.locator('#rate-chart[data-drawn="1"] canvas')).to_have_count(1,
                                                                            timeout=WAIT_MS)
        expect(page.locator('[data-stat="clients.mqtt311"]')).to_have_text("1",
                                                                           timeout=WAIT_MS)
        shot(page, "02-overview")

        # Clients: a new paho client shows up without a reload.
        page.goto(base + "/clients")
        expect(page.get_by_role("link", name="browser-dev")).to_have_count(0)
        device = Paho(proc.mqtt_port, "browser-dev", will=("site/status/browser-dev",
                                                          b"browser-dev went offline", 1,
                                                          False))
        clients.append(device)
        watcher = Paho(proc.mqtt_port, "status-board")
        clients.append(watcher)
        watcher.subscribe("site/status/#", 1)
        device.subscribe("site/cmd/browser-dev/#", 1)
        link = page.get_by_role("link", name="browser-dev")
        expect(link).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#client-table tbody tr")).to_have_count(3, timeout=WAIT_MS)
        shot(page, "03-clients")

        # Detail, then force its will: the subscriber gets it.
        link.click()
        expect(page.get_by_role("heading", name="browser-dev")).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_text("site/cmd/browser-dev/#")).to_be_visible()
        shot(page, "04-client-detail")
        page.get_by_role("button", name="Force will").click()
        msg = watcher.expect(15)
        assert (msg.topic, msg.payload) == ("site/status/browser-dev",
                                            b"browser-dev went offline")
        assert device.disconnected.wait(15)
        expect(page.get_by_text("Published the will of browser-dev and disconnected it."))\
            .to_be_visible(timeout=WAIT_MS)
        assert watch.confirms == ["Publish the will of this client now?"]

        # Sessions: a persistent session of an offline client is cleared and disappears.
        sleeper = Paho(proc.mqtt_port, "browser-sleeper", clean=False)
        sleeper.subscribe("site/cmd/sleeper/#", 1)
        sleeper.stop()
        publisher.publish("site/cmd/sleeper/reboot", b"please", 1)
        page.goto(base + "/sessions")
        row = page.locator("#session-table tbody tr", has_text="browser-sleeper")
        expect(row).to_have_count(1, timeout=WAIT_MS)
        shot(page, "05-sessions")
        row.get_by_role("button", name="Clear").click()
        expect(page.locator("#session-table tbody tr", has_text="browser-sleeper"))\
            .to_have_count(0, timeout=WAIT_MS)
        expect(page.get_by_text("Cleared the session of browser-sleeper.")).to_be_visible()

        # Retained, one message, the delete-by-filter confirm step.
        page.goto(base + "/retained")
        expect(page.locator("#retained-table tbody tr")).to_have_count(4, timeout=WAIT_MS)
        shot(page, "06-retained")
        page.get_by_role("link", name="plant/line7/temp/0").click()
        expect(page.locator("#payload")).to_contain_text('"celsius"', timeout=WAIT_MS)
        shot(page, "07-retained-message")
        page.goto(base + "/retained")
        page.get_by_role("link", name="Delete all 4 matching…").click()
        expect(page.get_by_role("heading", name="Delete 4 retained messages?"))\
            .to_be_visible(timeout=WAIT_MS)
        shot(page, "08-retained-confirm")

        # Wills and Publish.
        keeper = Paho(proc.mqtt_port, "gateway-2", will=("site/status/gateway-2",
                                                        b'{"online": false}', 1, True))
        clients.append(keeper)
        page.goto(base + "/wills")
        expect(page.locator("#will-table tbody tr")).to_have_count(1, timeout=WAIT_MS)
        shot(page, "09-wills")
        page.goto(base + "/publish")
        page.get_by_label("Topic").fill("site/cmd/all")
        page.get_by_label("Payload", exact=True).fill("hello from the console")
        shot(page, "10-publish")
        page.get_by_role("button", name="Publish").click()
        expect(page.get_by_text("Published 22 byte(s) to site/cmd/all (QoS 0)."))\
            .to_be_visible(timeout=WAIT_MS)

        # The gateway's detail with its will (JSON payload) for the screenshots.
        page.goto(base + "/clients")
        page.get_by_role("link", name="gateway-2").click()
        expect(page.get_by_text("site/status/gateway-2")).to_be_visible(timeout=WAIT_MS)
        shot(page, "11-client-with-will")
        assert not watch.alerts and not watch.errors, (watch.alerts, watch.errors)
    finally:
        for c in clients:
            c.stop()
        page.close()


def test_hostile_client_data_does_not_run_in_the_browser(browser: Any, broker: Any) -> None:
    """Markup in a client id, topic and payload shows as text; no script runs."""
    proc, data = broker
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    evil_id = '<script>window.__xss="id"</script>'
    evil_topic = 'evil/"><img src=x onerror="window.__xss=\'topic\'">'
    evil_payload = b'<script>window.__xss="payload"</script>"><img src=x onerror=alert(1)>'
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    watch = Watch(page)
    device = Paho(proc.mqtt_port, evil_id, clean=False, will=(evil_topic, evil_payload, 1, True))
    try:
        device.publish(evil_topic, evil_payload, 1, True)
        login(page, base, initial_password(data))
        from urllib.parse import quote
        device.subscribe(evil_topic.replace("evil", "cmd"), 1)
        for path in ["/clients", "/client?key=" + quote("mqtt:" + evil_id), "/sessions",
                     "/retained?filter=evil/%23", "/wills",
                     "/retained/message?topic=" + quote(evil_topic), "/topics?prefix=evil",
                     "/subscriptions", "/bans?value=" + quote(evil_id)]:
            page.goto(base + path)
            expect(page.locator("main")).to_be_visible()
            assert page.evaluate("window.__xss === undefined"), path
            assert page.locator("main img").count() == 0, path
        page.goto(base + "/client?key=" + quote("mqtt:" + evil_id))
        expect(page.locator("h1")).to_have_text(evil_id)
        expect(page.locator("pre.payload")).to_contain_text("<script>window.__xss")
        shot(page, "12-hostile-client")
        assert not watch.alerts, watch.alerts
    finally:
        device.stop()
        page.close()

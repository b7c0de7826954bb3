"""The console pages and controls of issue 13 in Chromium (Playwright, Debian's
/usr/bin/chromium) against a real broker with MQTT, AMQP and the console, and
real paho and proton clients.  Screenshots go to ``test-artifacts/`` as in
``test_console_operator``; each step also asserts what the screenshot is meant to show."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, WAIT_MS, Watch, expect, login, shot
from console_support import Paho, initial_password, web_broker_process
from pahoclient import PahoClient
from proton.reactor import Container
from proton.utils import BlockingConnection

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[tuple[Any, str]]:
    data = str(tmp_path / "data")
    proc = web_broker_process(data, listeners=("--mqtt", "--amqp", "--web")).start()
    yield proc, data
    proc.stop()


@pytest.fixture
def page(browser: Any, broker: Any) -> Iterator[tuple[Any, Watch, str]]:
    proc, data = broker
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    watch = Watch(page)
    login(page, base, initial_password(data))
    yield page, watch, base
    page.close()


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for c in made:
        c.stop() if isinstance(c, Paho) else c.close()


def test_clients_filters_counters_pages_and_bulk(broker: Any, page: Any, clients: Any) -> None:
    """In Chromium the clients table sorts by counters, pages, filters and runs bulk
    actions on real paho clients."""
    proc, _ = broker
    page, watch, base = page
    for i in range(27):
        clients.append(Paho(proc.mqtt_port, f"sensor-{i:02d}", clean=i % 3 != 0))
    talker = clients[0]
    for i in range(20):
        talker.publish(f"plant/line1/temp/{i % 3}", json.dumps({"c": 20 + i}).encode(), 0)
    page.goto(base + "/clients?per_page=25&sort=messages_in&dir=desc")
    table = page.locator("#client-table tbody tr")
    expect(table).to_have_count(25, timeout=WAIT_MS)
    first = table.first
    expect(first).to_contain_text("sensor-00")
    expect(first.locator("td").nth(9)).to_have_text(re.compile(r"^20\b"), timeout=WAIT_MS)
    expect(page.get_by_role("link", name="Last page")).to_be_visible()
    expect(page.get_by_role("link", name="Page 2")).to_be_visible()
    shot(page, "13-01-clients-counters")

    # Filters: every third sensor (00, 03, ...) holds a persistent session.
    page.get_by_label("Session kind").select_option("clean")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#client-table tbody tr")).to_have_count(18, timeout=WAIT_MS)
    expect(page.get_by_text("(filtered)")).to_be_visible()
    page.get_by_label("Session kind").select_option("persistent")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#client-table tbody tr")
    expect(rows).to_have_count(9, timeout=WAIT_MS)
    shot(page, "13-02-clients-filtered")

    # Bulk: tick two, survive a live refresh, clear their sessions after the confirm.
    rows.nth(0).locator('input[name="keys"]').check()
    rows.nth(1).locator('input[name="keys"]').check()
    expect(page.locator("#bulk-count")).to_have_text("2")
    before = page.locator("#clients").get_attribute("data-last")
    talker.publish("plant/line1/temp/0", b"21", 0)         # changes the table
    page.wait_for_function(
        "old => document.getElementById('clients').getAttribute('data-last') !== old",
        arg=before, timeout=WAIT_MS)
    expect(page.locator('input[name="keys"]:checked')).to_have_count(2)
    shot(page, "13-03-clients-bulk-selected")
    page.get_by_role("button", name="Clear their sessions").click()
    expect(page.get_by_text("Cleared the sessions of 2 client(s).")).to_be_visible(
        timeout=WAIT_MS)
    assert watch.confirms[-1].startswith("Clear the persistent sessions of the 2 selected")
    expect(page.locator("#client-table tbody tr")).to_have_count(7, timeout=WAIT_MS)
    assert not watch.alerts and not watch.errors, (watch.alerts, watch.errors)


def test_amqp_detail_topics_subscriptions_and_banner(broker: Any, page: Any,
                                                     clients: Any) -> None:
    """In Chromium an AMQP client's detail, the topic tree, the subscriptions list and the
    live banner show real clients' state."""
    proc, _ = broker
    page, watch, base = page
    conn = BlockingConnection(f"127.0.0.1:{proc.ports['AMQP']}", timeout=10,
                              container=Container(container_id="analytics-7"))
    clients.append(conn)
    conn.create_receiver("plant/+/temp")
    sender = conn.create_sender("plant/line2/cmd")
    board = Paho(proc.mqtt_port, "status-board", clean=False)
    clients.append(board)
    board.subscribe("plant/#", 1)
    pub = Paho(proc.mqtt_port, "line-2-plc")
    clients.append(pub)
    for i in range(12):
        pub.publish(f"plant/line{1 + i % 2}/temp", b"21.5", 0, retain=True)
    from proton import Message
    sender.send(Message(body="stop"))

    page.goto(base + "/clients?protocol=amqp")
    page.get_by_role("link", name="analytics-7").click()
    expect(page.get_by_role("heading", name="analytics-7")).to_be_visible(timeout=WAIT_MS)
    links = page.locator("#links tbody")
    expect(links).to_contain_text("client's receiver")
    expect(links).to_contain_text("client's sender")
    expect(page.locator("#amqp-sessions tbody tr")).to_have_count(1)
    expect(page.locator("dl.facts")).to_contain_text("SASL mechanism")
    expect(page.get_by_role("button", name="Force will")).to_have_count(0)
    expect(page.get_by_role("button", name="Clear session")).to_have_count(0)
    shot(page, "13-04-amqp-client-detail")

    page.goto(base + "/topics")
    expect(page.locator("#topic-table")).to_contain_text("plant", timeout=WAIT_MS)
    page.get_by_role("link", name="plant/").click()
    rows = page.locator("#topic-table tbody tr")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    page.get_by_role("link", name="line1/").click()
    leaf = page.locator("#topic-table tbody tr", has_text="temp")
    expect(leaf.locator("td").nth(4)).to_have_text("2", timeout=WAIT_MS)  # board + AMQP
    expect(leaf).to_contain_text("yes")
    shot(page, "13-05-topics")

    page.goto(base + "/subscriptions")
    page.get_by_label("Search subscriptions").fill("plant")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#subscription-table tbody tr")).to_have_count(2, timeout=WAIT_MS)
    shot(page, "13-06-subscriptions")

    # The live feed goes down with the broker: the banner says so, with the time.
    page.goto(base + "/")
    expect(page.locator(".live-dot.on")).to_have_count(1, timeout=WAIT_MS)
    banner = page.locator("#feed-banner")
    expect(banner).to_be_hidden()
    for c in clients:
        c.stop() if isinstance(c, Paho) else c.close()
    clients.clear()
    proc.stop()
    expect(banner).to_be_visible(timeout=WAIT_MS)
    expect(banner).to_contain_text("Live updates lost — last update at")
    shot(page, "13-07-feed-lost-banner")
    assert not watch.alerts, watch.alerts


def test_tail_publish_form_and_bans(broker: Any, page: Any, clients: Any) -> None:
    """In Chromium the live tail shows matching messages escaped, the publish form
    publishes, and a ban closes its client."""
    proc, _ = broker
    page, watch, base = page
    page.goto(base + "/tail?filter=" + "lab%2F%23")
    expect(page.locator("#tail-state")).to_have_text("live", timeout=WAIT_MS)
    pub = Paho(proc.mqtt_port, "lab-bench")
    clients.append(pub)
    pub.publish("lab/json", b'{"volts": 3.3, "ok": true}', 0)
    pub.publish("lab/evil", b'<script>window.__xss="tail"</script><img src=x onerror=alert(1)>')
    pub.publish("lab/bin", bytes(range(0, 40)), 0)
    pub.publish("elsewhere/x", b"not shown", 0)
    rows = page.locator("#tail-table tbody tr")
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    expect(rows.nth(0)).to_contain_text("hex")
    expect(rows.nth(1)).to_contain_text('<script>window.__xss="tail"</script>')
    expect(rows.nth(2)).to_contain_text('"volts": 3.3')
    assert page.evaluate("window.__xss === undefined")
    assert page.locator("#tail-table img").count() == 0
    shot(page, "13-08-live-tail")
    page.get_by_role("button", name="Pause").click()
    pub.publish("lab/later", b"while paused", 0)
    expect(page.locator("#tail-skipped")).to_contain_text("1 held while paused",
                                                          timeout=WAIT_MS)
    expect(rows).to_have_count(3)
    page.get_by_role("button", name="Resume").click()
    expect(rows).to_have_count(4)
    expect(rows.nth(0)).to_contain_text("while paused")

    # Publish: a bad topic keeps what was typed, and so does a success.
    page.goto(base + "/publish")
    page.get_by_label("Topic").fill("lab/+/bad")
    page.get_by_label("Payload", exact=True).fill("keep me\nplease")
    page.get_by_label("QoS").select_option("1")
    page.get_by_role("button", name="Publish").click()
    expect(page.locator(".flash-error")).to_contain_text("invalid topic", timeout=WAIT_MS)
    expect(page.get_by_label("Topic")).to_have_value("lab/+/bad")
    expect(page.get_by_label("Payload", exact=True)).to_have_value("keep me\nplease")
    expect(page.get_by_label("QoS")).to_have_value("1")
    shot(page, "13-09-publish-kept")
    page.get_by_label("Topic").fill("lab/ok")
    page.get_by_role("button", name="Publish").click()
    # 15 bytes: a browser submits a textarea's line break as CRLF (HTML form rules).
    expect(page.locator(".flash-ok")).to_contain_text("Published 15 byte(s) to lab/ok",
                                                      timeout=WAIT_MS)
    expect(page.get_by_label("Topic")).to_have_value("lab/ok")

    # Bans: from the client's page, then refused at CONNECT; lifted again.
    page.goto(base + "/clients")
    page.get_by_role("link", name="lab-bench").click()
    page.get_by_role("link", name="Ban…").click()
    expect(page.get_by_label("Value")).to_have_value("lab-bench")
    page.get_by_label("Reason").fill("bench test <b>")
    page.get_by_role("button", name="Ban", exact=True).click()
    expect(page.get_by_text("Banned client id lab-bench for 10m 0s; closed 1 connection(s)."))\
        .to_be_visible(timeout=WAIT_MS)
    assert pub.disconnected.wait(10)
    expect(page.locator("#ban-table tbody tr")).to_have_count(1)
    expect(page.locator("#ban-table")).to_contain_text("bench test <b>")
    shot(page, "13-10-bans")
    PahoClient(proc.mqtt_port, "lab-bench", expect_rc=5).stop()   # CONNACK 5
    page.get_by_role("button", name="Lift").click()
    expect(page.locator("#ban-table tbody tr")).to_have_text("Nobody is banned.",
                                                             timeout=WAIT_MS)
    Paho(proc.mqtt_port, "lab-bench").stop()
    assert not watch.alerts and not watch.errors, (watch.alerts, watch.errors)

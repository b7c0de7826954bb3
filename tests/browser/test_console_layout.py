"""Issue 24, items 10 and 11 (the console), in Chromium (Playwright, Debian's
/usr/bin/chromium) against a real broker with MQTT, AMQP and the console, and
real paho and proton clients: what only a browser shows (the clients table at
1,400 px, the rate chart's axis, the menu, the heading's padding, the Traffic
page's legends) and one look at each of the other items.  Screenshots go to
``test-artifacts/`` as in ``test_console_operator``; each step asserts what its
screenshot is meant to show.

The charts are drawn on a canvas: an init script records the text uPlot draws
(``fillText``, with the box ``measureText`` gives it), so the test can check that
axis labels do not collide and read as 24-hour UTC times."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, WAIT_MS, Watch, expect, shot
from console_support import CHEAP, PASSWORD, web_broker_process
from paho.mqtt.client import MQTTv5, MQTTv311
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pahoclient import PahoClient
from proton.reactor import Container
from proton.utils import BlockingConnection

from mqttamqp.security.userstore import UserStore

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]

# Every text a canvas draws, as boxes in CSS pixels of the page, kept per drawing
# (one task): ``window.__drawn[canvas id]`` is the last drawing of that canvas.
RECORD_CANVAS_TEXT = """
(() => {
  const drawn = window.__drawn = {};
  const open = new Set();
  let ids = 0;
  const fillText = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    const canvas = this.canvas;
    if (!canvas.dataset.rec) { canvas.dataset.rec = "c" + (ids += 1); }
    const id = canvas.dataset.rec;
    if (!open.has(id)) {
      open.add(id);
      drawn[id] = [];
      queueMicrotask(() => open.delete(id));
    }
    const m = this.measureText(String(text));
    const t = this.getTransform();
    const r = canvas.getBoundingClientRect();
    const sx = r.width / canvas.width, sy = r.height / canvas.height;
    const px = t.a * x + t.c * y + t.e, py = t.b * x + t.d * y + t.f;
    drawn[id].push({text: String(text),
                    left: r.left + sx * (px - m.actualBoundingBoxLeft),
                    right: r.left + sx * (px + m.actualBoundingBoxRight),
                    top: r.top + sy * (py - m.actualBoundingBoxAscent),
                    bottom: r.top + sy * (py + m.actualBoundingBoxDescent),
                    rotated: t.b !== 0 || t.c !== 0});
    return fillText.call(this, text, x, y, ...rest);
  };
})();
"""

TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?$")     # 24-hour clock
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"])


def _x_axis_labels(page: Any, chart: str) -> list[dict[str, Any]]:
    """The last drawing's labels below the plot of the chart ``chart`` (a CSS selector)."""
    return page.evaluate("""sel => {
        const canvas = document.querySelector(sel + " canvas");
        const plot = document.querySelector(sel + " .u-over").getBoundingClientRect();
        return (window.__drawn[canvas.dataset.rec] || [])
            .filter(t => !t.rotated && t.top >= plot.bottom);
    }""", chart)


def _assert_labels_apart(labels: list[dict[str, Any]]) -> None:
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not _overlaps(a, b), (a, b)


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[Any]:
    """A broker whose user store has the console's admin and a client user."""
    data = tmp_path / "data"
    data.mkdir()
    users = UserStore(str(data))
    users.set_password("admin", PASSWORD, role="admin", **CHEAP)
    users.set_password("hvac-controller-eu", "secret-1", role="client", **CHEAP)
    proc = web_broker_process(str(data), "--allow-anonymous",
                              listeners=("--mqtt", "--amqp", "--web")).start()
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, broker: Any) -> Iterator[tuple[Any, Watch, str]]:
    """A logged-in page 1,400 px wide, in a time zone that is not UTC."""
    base = f"http://127.0.0.1:{broker.ports['WEB']}"
    context = browser.new_context(viewport={"width": 1400, "height": 900},
                                  timezone_id="America/New_York")
    context.add_init_script(RECORD_CANVAS_TEXT)
    page = context.new_page()
    watch = Watch(page)
    page.goto(base + "/login")
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=WAIT_MS)
    yield page, watch, base
    context.close()


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for c in made:
        c.stop() if isinstance(c, PahoClient) else c.close()


def _v5_props(expiry: int) -> Any:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = expiry
    return props


def test_clients_table_fits_1400px_with_the_will_column(broker: Any, page: Any,
                                                        clients: Any) -> None:
    """At 1,400 px the clients table, with long ids, a user, links and MiB counters,
    shows every column down to Will without scrolling."""
    page, watch, base = page
    for i in range(4):
        clients.append(PahoClient(
            broker.mqtt_port, f"building-7-floor-{i}-hvac-ctl", MQTTv5 if i % 2 else MQTTv311,
            clean=i % 2 == 0, will=("plant/status", b"gone", 1, True),
            username="hvac-controller-eu" if i == 0 else None,
            password="secret-1" if i == 0 else None))
        clients[-1].subscribe(("plant/#", 0))
    conn = BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=10,
                              container=Container(container_id="analytics-pipeline-eu-west-7"))
    clients.append(conn)
    conn.create_receiver("plant/+/temp")
    conn.create_receiver("plant/#")
    conn.create_sender("cmd/line-2")
    blob = bytes(700_000)
    for _ in range(3):
        clients[0].publish("plant/blob", blob, 0)
    page.goto(base + "/clients")
    rows = page.locator("#client-table tbody tr")
    expect(rows).to_have_count(5, timeout=WAIT_MS)
    expect(rows.filter(has_text="hvac-controller-eu")).to_have_count(1)
    expect(rows.filter(has_text="MiB").first).to_be_visible()
    expect(rows.filter(has_text="3 links")).to_have_count(1)
    # The live table adds rates from its second refresh on: wait for them.
    expect(rows.filter(has_text="floor-0").locator(".rate")).to_have_count(
        3, timeout=WAIT_MS)
    wrap = page.locator("#clients .table-wrap")
    will = page.locator("#client-table thead th").last
    expect(will).to_have_text("Will")
    box, visible = will.bounding_box(), wrap.bounding_box()
    assert box is not None and visible is not None
    assert visible["x"] <= box["x"] and box["x"] + box["width"] <= visible["x"] + visible[
        "width"], (box, visible)
    assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth"), wrap.evaluate(
        "w => [w.scrollWidth, w.clientWidth]")
    for cell in rows.locator("td:last-child").all():
        cell_box = cell.bounding_box()
        assert cell_box is not None
        assert cell_box["x"] + cell_box["width"] <= visible["x"] + visible["width"]
    shot(page, "24-01-clients-1400px")
    assert not watch.errors, watch.errors


def test_overview_counts_mqtt5_and_its_chart_reads_24h_utc(broker: Any, page: Any,
                                                           clients: Any) -> None:
    """The Clients tile counts MQTT 5 clients; the rate chart's time axis is 24-hour UTC
    (the browser is in New York) and its date label touches no time label, wide or narrow."""
    page, watch, base = page
    clients.append(PahoClient(broker.mqtt_port, "v311", MQTTv311))
    for i in range(2):
        clients.append(PahoClient(broker.mqtt_port, f"v5-{i}", MQTTv5))
    clients.append(BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=10,
                                      container=Container(container_id="app")))
    page.goto(base + "/")
    expect(page.locator('[data-stat="clients.connected"]')).to_have_text("4", timeout=WAIT_MS)
    expect(page.locator('[data-stat="clients.mqtt5"]')).to_have_text("2")
    expect(page.locator('[data-stat="clients.mqtt311"]')).to_have_text("1")
    expect(page.locator('[data-stat="clients.amqp"]')).to_have_text("1")
    tile = page.locator(".tile", has_text="Clients connected")
    expect(tile).to_contain_text("MQTT 3.1 0 · 3.1.1 1 · 5 2 · AMQP 1")
    expect(page.locator("#rate-chart[data-drawn] canvas")).to_have_count(1, timeout=WAIT_MS)
    for width in (1400, 1000, 720):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_function(
            """w => { const c = document.querySelector('#rate-chart canvas');
                      return c && Math.abs(c.getBoundingClientRect().width
                        - document.getElementById('rate-chart').clientWidth) < 2; }""",
            arg=width, timeout=WAIT_MS)
        # The chart is drawn again with each live update: wait for one at this width.
        page.evaluate("delete window.__drawn["
                      "document.querySelector('#rate-chart canvas').dataset.rec]")
        page.wait_for_function(
            """() => { const c = document.querySelector('#rate-chart canvas');
                       const d = window.__drawn[c.dataset.rec] || [];
                       return d.length > 0; }""", timeout=WAIT_MS)
        labels = _x_axis_labels(page, "#rate-chart")
        texts = [t["text"] for t in labels]
        times = [t for t in texts if TIME.match(t)]
        dates = [t for t in texts if DATE.match(t)]
        assert len(times) >= 2 and dates, texts
        assert len(times) + len(dates) == len(texts), texts      # nothing else, no am/pm
        # UTC: the hours shown are those of UTC now (or five minutes ago), not New York's.
        utc_hours = {time.strftime("%H", time.gmtime(time.time() - s)) for s in (0, 330)}
        assert {t[:2] for t in times} <= utc_hours, (times, utc_hours)
        assert set(dates) <= {time.strftime("%Y-%m-%d", time.gmtime(time.time() - s))
                              for s in (0, 330)}, dates
        _assert_labels_apart(labels)
        page.locator("#rate-chart").screenshot(
            path=str(Path(_artifacts()) / f"24-02-rate-chart-{width}px.png"))
    page.set_viewport_size({"width": 1400, "height": 900})
    shot(page, "24-03-overview")
    assert not watch.errors, watch.errors


# Counts the feed's events once their listeners have run: ``window.__feed[type]``.
COUNT_FEED_EVENTS = """
(() => {
  const feed = window.__feed = {};
  const add = EventSource.prototype.addEventListener;
  EventSource.prototype.addEventListener = function (type, listener, ...rest) {
    return add.call(this, type, function (ev) {
      try { return listener.call(this, ev); }
      finally { feed[type] = (feed[type] || 0) + 1; }
    }, ...rest);
  };
})();
"""


def test_the_rate_chart_waits_for_its_time_axis(broker: Any, page: Any) -> None:
    """The feed's events can run while timeaxis.js is still loading (deferred scripts
    let other tasks run between them): the rate chart is not built before it, with
    uPlot's own 12-hour labels in New York time, but once it is there.  CI saw it:
    '11/30/26 4:14am' on the axis."""
    page, watch, base = page
    page.add_init_script(COUNT_FEED_EVENTS)
    held: list[Any] = []
    page.route("**/static/timeaxis.js", lambda route: held.append(route))
    page.goto(base + "/", wait_until="commit")
    # The feed's history and a stats event have been handled while the axis is held.
    page.wait_for_function("() => window.__feed && window.__feed.stats >= 1",
                           timeout=WAIT_MS)
    assert [r.request.url for r in held] == [base + "/static/timeaxis.js"], held
    assert page.evaluate("typeof uPlot") == "function"
    held[0].continue_()
    expect(page.locator("#rate-chart[data-drawn] canvas")).to_have_count(1, timeout=WAIT_MS)
    page.wait_for_function(
        """() => { const c = document.querySelector('#rate-chart canvas');
                   return c && (window.__drawn[c.dataset.rec] || []).length > 0; }""",
        timeout=WAIT_MS)
    texts = [t["text"] for t in _x_axis_labels(page, "#rate-chart")]
    assert texts and all(TIME.match(t) or DATE.match(t) for t in texts), texts
    assert not watch.errors, watch.errors


def _artifacts() -> str:
    from chromium import ARTIFACTS
    ARTIFACTS.mkdir(exist_ok=True)
    return str(ARTIFACTS)


def test_subscriptions_menu_entry_and_shared_heading_padding(broker: Any, page: Any,
                                                             clients: Any) -> None:
    """/subscriptions has its own highlighted menu entry, and the shared subscriptions
    heading sits inside its card's padding, aligned with the rows below it."""
    page, watch, base = page
    for name in ("billing-1", "billing-2"):
        clients.append(PahoClient(broker.mqtt_port, name, MQTTv311))
        clients[-1].subscribe(("$share/billing/orders/#", 1))
    page.goto(base + "/topics")
    page.get_by_role("navigation", name="Console").get_by_role(
        "link", name="Subscriptions").click()
    expect(page.get_by_role("heading", name="Subscriptions", exact=True)).to_be_visible(
        timeout=WAIT_MS)
    nav = page.get_by_role("navigation", name="Console")
    expect(nav.locator('[aria-current="page"]')).to_have_text("Subscriptions")
    expect(nav.get_by_role("link", name="Topics")).not_to_have_attribute("aria-current", "page")
    card = page.locator("#shared-groups")
    heading = card.get_by_role("heading", name="Shared subscriptions")
    expect(card.locator("#shared-table tbody tr")).to_have_count(1)
    h, c = heading.bounding_box(), card.bounding_box()
    first_cell = card.locator("#shared-table tbody td").first.bounding_box()
    assert h is not None and c is not None and first_cell is not None
    assert h["x"] - c["x"] >= 8 and h["y"] - c["y"] >= 8, (h, c)
    text_left = heading.evaluate("e => { const r = document.createRange();"
                                 " r.selectNodeContents(e); return r.getBoundingClientRect().x; }")
    cell_left = card.locator("#shared-table tbody td").first.evaluate(
        "e => e.getBoundingClientRect().x + parseFloat(getComputedStyle(e).paddingLeft)")
    assert abs(text_left - cell_left) <= 1, (text_left, cell_left)
    shot(page, "24-04-subscriptions")
    assert not watch.errors, watch.errors


def test_retained_levels_session_expiry_and_an_empty_queue(broker: Any, page: Any,
                                                          clients: Any) -> None:
    """One look at each: a topic level with retained messages below says how many; an
    MQTT 5 client's page shows its session expiry; a queue emptied while its page is
    open says so, with the next offset."""
    page, watch, base = page
    pub = PahoClient(broker.mqtt_port, "line-plc", MQTTv311)
    clients.append(pub)
    for topic in ("plant/line1/temp", "plant/line2/temp", "plant/line2/mode"):
        pub.publish(topic, b"21.5", 1, retain=True)
    pub.publish("plant/line1/noise", b"x", 0)
    dash = PahoClient(broker.mqtt_port, "dashboard-5", MQTTv5, clean=False,
                      properties=_v5_props(7200))
    clients.append(dash)
    for i in range(12):
        pub.publish("$queue/orders/eu", f"order {i}".encode(), 1)

    page.goto(base + "/topics")
    plant = page.locator("#topic-table tbody tr", has_text="plant/")
    expect(plant.locator("td.retained")).to_have_text(re.compile(r"3 below"), timeout=WAIT_MS)
    plant.get_by_role("link", name="plant/").click()
    line2 = page.locator("#topic-table tbody tr", has_text="line2/")
    expect(line2.locator("td.retained")).to_have_text(re.compile(r"2 below"), timeout=WAIT_MS)
    shot(page, "24-05-topics-retained-levels")
    line2.locator("td.retained").get_by_role("link").click()
    expect(page.locator("#retained-table tbody tr")).to_have_count(2, timeout=WAIT_MS)

    page.goto(base + "/clients")
    page.get_by_role("link", name="dashboard-5").click()
    facts = page.locator("dl.facts", has_text="Kind")
    expect(facts).to_contain_text("Session expiry2h 0m after the client disconnects",
                                  timeout=WAIT_MS)
    shot(page, "24-06-mqtt5-session-expiry")

    page.goto(base + "/queues/queue?name=orders")
    messages = page.locator("#queue-messages")
    expect(messages.locator("#message-table tbody tr")).to_have_count(12, timeout=WAIT_MS)
    expect(messages).to_contain_text("offsets 0 to 11")
    worker = PahoClient(broker.mqtt_port, "worker-1", MQTTv311)
    clients.append(worker)
    worker.subscribe(("$queue/orders/#", 1))
    for _ in range(12):
        worker.get()
    expect(page.locator("#queue-facts")).to_contain_text("0 messages", timeout=WAIT_MS)
    expect(messages).to_contain_text("The queue is empty; the next message gets offset 12.",
                                     timeout=WAIT_MS)
    expect(messages.locator("#message-table tbody tr")).to_have_text("No messages.")
    expect(messages).not_to_contain_text("offset 11")
    shot(page, "24-07-empty-queue")
    assert not watch.errors, watch.errors


def test_traffic_bar_charts_have_no_empty_value_legends(browser: Any, served_page: str
                                                         ) -> None:
    """The Traffic page's bar charts name their series without a "Value: —" entry, and
    its per-minute chart reads 24-hour UTC times, labels apart."""
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  timezone_id="America/New_York")
    context.add_init_script(RECORD_CANVAS_TEXT)
    page = context.new_page()
    try:
        page.goto(served_page)
        for chart in ("traffic-per-minute", "traffic-durations", "traffic-wills"):
            expect(page.locator(f"#{chart}[data-drawn='1'] canvas")).to_have_count(
                1, timeout=WAIT_MS)
        for chart, series in (("traffic-durations", "sessions"), ("traffic-wills", "wills")):
            legend = page.locator(f"#{chart} .u-legend")
            expect(legend).to_have_text(series)
            assert "Value" not in legend.inner_text() and "—" not in legend.inner_text()
        legend = page.locator("#traffic-per-minute .u-legend").inner_text()
        assert "Value" not in legend and "plant/1/temp" in legend
        labels = _x_axis_labels(page, "#traffic-per-minute")
        texts = [t["text"] for t in labels]
        assert texts and all(TIME.match(t) or DATE.match(t) for t in texts), texts
        assert "08:00" in texts and "2026-11-24" in texts, texts     # the report's UTC
        _assert_labels_apart(labels)
        page.screenshot(path=os.path.join(_artifacts(), "24-08-traffic.png"), full_page=True)
    finally:
        context.close()


def test_live_tail_and_feed_banner_times_are_utc(broker: Any, page: Any, clients: Any) -> None:
    """The live tail stamps messages, and the lost-feed banner its last update, in UTC
    (the browser is in New York), as every other time in the console."""
    page, watch, base = page
    page.goto(base + "/tail?filter=lab%2F%23")
    expect(page.locator("#tail-state")).to_have_text("live", timeout=WAIT_MS)
    pub = PahoClient(broker.mqtt_port, "lab-bench", MQTTv311)
    clients.append(pub)
    pub.publish("lab/volts", b"3.3", 0)
    row = page.locator("#tail-table tbody tr")
    expect(row).to_have_count(1, timeout=WAIT_MS)
    stamp = row.locator("td").first.inner_text()
    utc = {time.strftime("%H:%M", time.gmtime(time.time() - s)) for s in (0, 60)}
    assert re.match(r"^\d{2}:\d{2}:\d{2}\.\d{3}$", stamp) and stamp[:5] in utc, (stamp, utc)
    expect(page.locator("#tail-table thead th").first).to_have_text("Time (UTC)")
    page.goto(base + "/")
    expect(page.locator(".live-dot.on")).to_have_count(1, timeout=WAIT_MS)
    for c in clients:
        c.stop()
    clients.clear()
    broker.stop()
    banner = page.locator("#feed-banner")
    expect(banner).to_be_visible(timeout=WAIT_MS)
    m = re.search(r"last update at (\d{2}:\d{2}):\d{2} UTC", banner.inner_text())
    assert m is not None and m.group(1) in utc | {
        time.strftime("%H:%M", time.gmtime())}, banner.inner_text()
    assert not watch.alerts, watch.alerts

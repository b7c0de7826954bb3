"""Issue 24, items 10 and 11 (the console), over StubTreq against a real ``Broker``
on a ``task.Clock``: MQTT 5 clients in the overview's counts and the clients
filter, the Subscriptions menu entry, the Topics page's Retained column on levels,
an MQTT 5 session's expiry on the client's page, and an empty queue's page.
What needs a browser (layout, the charts) is in ``test_browser_console24``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_console_queues import fill
from webui_support import FakeLink, connect, connect_amqp, logged_in

from mqttamqp.core.auth import Identity
from mqttamqp.core.message import Message


@pytest.fixture
def env(tmp_path: Any) -> Any:
    """A console on a fresh broker, its admin logged in."""
    return logged_in(tmp_path)


def _stat(html: str, name: str) -> str:
    m = re.search(rf'data-stat="{re.escape(name)}"[^>]*>([^<]*)<', html)
    assert m is not None, name
    return m.group(1)


# -- item 10: MQTT 5 clients are counted ------------------------------------------------------


def test_overview_counts_mqtt5_clients_with_the_others(env: Any) -> None:
    """The Clients tile and /api/overview count MQTT 5 clients: the parts add up."""
    _, broker, _, client = env
    for i in range(2):
        connect(broker, f"old-{i}", protocol="mqtt3.1.1")
    connect(broker, "older", protocol="mqtt3.1")
    for i in range(3):
        connect(broker, f"new-{i}", protocol="mqtt5")
    connect_amqp(broker, "app", 1, ())
    clients = client.get("/api/overview").json()["clients"]
    assert clients["connected"] == 7
    assert (clients["mqtt31"], clients["mqtt311"], clients["mqtt5"], clients["amqp"]) == (
        1, 2, 3, 1)
    html = client.get("/").text
    assert _stat(html, "clients.connected") == "7"
    assert _stat(html, "clients.mqtt5") == "3"
    tile = html.split("Clients connected", 1)[1].split("</div>", 1)[0]
    assert re.search(r"· 5 <b[^>]*>3</b>", tile), tile


def test_clients_filter_offers_mqtt5(env: Any) -> None:
    """The clients page filters MQTT 5 clients on their own; "MQTT (any)" includes them."""
    _, broker, _, client = env
    connect(broker, "old", protocol="mqtt3.1.1")
    connect(broker, "new", protocol="mqtt5")
    only5 = client.get("/api/clients", protocol="mqtt5").json()["items"]
    assert [c["client_id"] for c in only5] == ["new"]
    anymqtt = client.get("/api/clients", protocol="mqtt").json()["items"]
    assert sorted(c["client_id"] for c in anymqtt) == ["new", "old"]
    assert '<option value="mqtt5">MQTT 5</option>' in client.get("/clients").text


# -- item 11: the Subscriptions menu entry --------------------------------------------------


def test_subscriptions_has_its_own_menu_entry(env: Any) -> None:
    """/subscriptions highlights its own menu entry, not Topics."""
    _, _, _, client = env
    html = client.get("/subscriptions").text
    assert re.search(r'<a href="/subscriptions" class="active" aria-current="page">'
                     r"Subscriptions</a>", html), html[:3000]
    assert re.search(r'<a href="/topics">Topics</a>', html)
    topics = client.get("/topics").text
    assert re.search(r'<a href="/topics" class="active" aria-current="page">Topics</a>', topics)
    assert re.search(r'<a href="/subscriptions">Subscriptions</a>', topics)


# -- item 11: Topics' Retained column on levels -----------------------------------------------


def test_topic_levels_say_how_many_retained_messages_they_hold(env: Any) -> None:
    """A level with retained messages below it says how many, linked to the Retained page."""
    _, broker, clock, client = env
    for topic, retain in (("plant/l1/temp", True), ("plant/l2/temp", True),
                          ("plant/l2/hum", False), ("plant", True), ("office/door", False)):
        broker.publish(Message(topic, b"1", 0, retain, "p", clock.seconds()), Identity("p"))
    root = {n["name"]: n for n in client.get("/api/topics").json()["items"]}
    assert (root["plant"]["retained"], root["plant"]["retained_below"]) == (True, 2)
    assert (root["office"]["retained"], root["office"]["retained_below"]) == (False, 0)
    level = {n["name"]: n for n in client.get("/api/topics", prefix="plant").json()["items"]}
    assert level["l1"]["retained_below"] == 1 and level["l2"]["retained_below"] == 1
    leaf = client.get("/api/topics", prefix="plant/l2").json()["items"]
    assert [(n["name"], n["retained"], n["retained_below"]) for n in leaf] == [
        ("hum", False, 0), ("temp", True, 0)]
    html = client.get("/topics").text
    cells = dict(re.findall(r'title="(\w+)">\w+/</a></td>.*?<td class="retained">(.*?)</td>',
                            html, re.S))
    assert set(cells) == {"plant", "office"}
    assert "yes" in cells["plant"] and "2 below" in cells["plant"]
    assert 'href="/retained?filter=plant%2F%23"' in cells["plant"]
    assert "no" in cells["office"] and "—" not in cells["office"]


# -- item 11: an MQTT 5 session's expiry ---------------------------------------------------------


def _connect5(broker: Any, client_id: str, expiry: float) -> FakeLink:
    """An MQTT 5 client with a session expiry interval, as MQTTProtocol opens it."""
    link = FakeLink(broker, client_id, protocol="mqtt5", clean=False,
                    since=broker.clock.seconds())
    link.session = broker.open_session(link, client_id, False, None, None, expiry).session
    broker.activate(link.session, link, "mqtt5")
    broker.register_connection(link.key, link, "mqtt5")
    return link


def test_mqtt5_client_page_shows_the_session_expiry(env: Any) -> None:
    """The session's expiry interval shows on the page of an MQTT 5 client, online and
    offline (with when it expires); MQTT 3.1.1 has none to show."""
    _, broker, clock, client = env
    dash = _connect5(broker, "dash", 3600.0)
    _connect5(broker, "forever", float(0xFFFFFFFF))
    _connect5(broker, "brief", 0.0)
    connect(broker, "old", clean=False)
    detail = client.get("/api/client", key="mqtt:dash").json()["session"]
    assert (detail["expiry"], detail["expires_at"]) == (3600.0, None)
    html = client.get("/client", key="mqtt:dash").text
    assert re.search(r"<dt>Session expiry</dt><dd>1h 0m after the client disconnects</dd>",
                     html), html
    assert "<dd>never</dd>" in client.get("/client", key="mqtt:forever").text
    assert "ends with the connection" in client.get("/client", key="mqtt:brief").text
    assert client.get("/api/client", key="mqtt:old").json()["session"]["expiry"] is None
    assert "Session expiry" not in client.get("/client", key="mqtt:old").text
    broker.end_session(dash, dash.session, clean=True, reason="bye")
    broker.unregister_connection(dash.key, dash)
    clock.advance(600)
    offline = client.get("/api/client", session="dash").json()["session"]
    assert offline["expires_at"] == offline["last_seen"] + 3600.0
    html = client.get("/client", session="dash").text
    assert "expires at 2023-11-14 23:13:20 UTC (in 50m 0s)" in html, html


# -- item 11: an empty queue's page ---------------------------------------------------------------


def test_queue_messages_are_live_and_an_empty_queue_names_its_next_offset(env: Any) -> None:
    """The Messages card is a live region: once a consumer took every message it says
    the queue is empty and which offset comes next, not the offset it was loaded at."""
    _, broker, _, client = env
    fill(broker, 12)
    page = client.get("/queues/queue", name="jobs").text
    assert 'data-live-src="/queues/queue?name=jobs&amp;partial=messages"' in page
    assert "offsets 0 to 11" in page
    worker = connect(broker, "worker")
    broker.subscribe(worker.session, Identity("worker"), [("$queue/jobs/#", 0)])
    assert len(worker.sent) == 12                        # QoS 0: acknowledged as sent
    live = client.get("/queues/queue", name="jobs", partial="messages").text
    assert "<html" not in live and 'id="message-table"' in live
    assert "The queue is empty; the next message gets offset 12." in live
    assert "offset 0" not in live and "offset 11" not in live
    page = client.get("/queues/queue", name="jobs").text
    assert "The queue is empty; the next message gets offset 12." in page
    # A page further on is a look at the past: not refreshed, and says where it starts.
    broker.end_session(worker, worker.session, clean=True, reason="bye")
    broker.unregister_connection(worker.key, worker)
    fill(broker, 3)
    later = client.get("/queues/queue", name="jobs", start="13").text
    assert "partial=messages" not in later and "offsets 13 to 14" in later
    beyond = client.get("/queues/queue", name="jobs", start="99").text
    assert "No messages from offset 15 (the next one)." in beyond

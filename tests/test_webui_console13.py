"""The console features of issue 13 over StubTreq against a real ``Broker`` on a
``task.Clock``: the publish form's memory, AMQP detail, client filters, counters
and rates, page numbers, bulk actions, the live tail, the topics page and the
API index."""

from __future__ import annotations

import re
from typing import Any

import pytest
import treq
import webui_support
from test_webui_app import _audit_text, _frames
from webui_support import Client, connect, connect_amqp, logged_in

from mqttamqp.core.clients.connections import (
    AmqpDetails,
    AmqpSessionInfo,
    ConnectionInfo,
    LinkInfo,
)
from mqttamqp.core.message import Message, WillMessage


@pytest.fixture
def env(tmp_path: Any) -> Any:
    """A console on a fresh broker, its admin logged in."""
    return logged_in(tmp_path)



def _field(html: str, name: str) -> str:
    m = re.search(rf'<input name="{name}"[^>]* value="([^"]*)"', html)
    assert m is not None, name
    return m.group(1)


# -- publish --------------------------------------------------------------------------------


def test_publish_form_keeps_what_was_typed_after_an_error_and_a_success(env: Any) -> None:
    _, _, _, client = env
    client.get("/publish")
    bad = client.post("/publish", topic="a/+/bad", payload="<keep> me", encoding="utf-8",
                      qos="2", retain="1")
    assert bad.code == 303
    page = client.get("/publish").text
    assert "invalid topic" in page
    assert _field(page, "topic") == "a/+/bad"
    assert "&lt;keep&gt; me</textarea>" in page
    assert re.search(r'<option selected>2</option>', page)
    assert 'name="retain" value="1" checked' in page
    client.post("/publish", topic="ok/topic", payload="0a0b", encoding="hex", qos="1")
    page = client.get("/publish").text
    assert "Published 2 byte(s) to ok/topic (QoS 1)." in page
    assert _field(page, "topic") == "ok/topic" and "0a0b</textarea>" in page
    assert '<option value="hex" selected>' in page and "checked" not in page


# -- client detail ----------------------------------------------------------------------------


def _amqp_client(broker: Any) -> Any:
    links = (LinkInfo("rx", "sender", "plant/#", "unsettled", "first", 10, 0, 5, session=1),
             LinkInfo("tx", "receiver", "cmd/x", "unsettled", "first", 100, 0, 2, session=2))
    conn = connect_amqp(broker, "app-7", 3, links)
    details = AmqpDetails("app-7", "PLAIN", 65536, 4294967295, 60.0, 0.0,
                          (AmqpSessionInfo(1, 1, 2047, 0, 0), AmqpSessionInfo(2, 1, 2047, 0, 0)))

    def info() -> ConnectionInfo:
        return ConnectionInfo(key=conn.key, client_id="app-7", protocol="amqp",
                              remote=conn.remote, user="svc", connected_since=conn.since,
                              keepalive=60, clean_session=None, session_id=None,
                              links=links, amqp=details, messages_in=2, messages_out=5,
                              bytes_in=300, bytes_out=900, last_activity=conn.since)
    conn.info = info
    return conn


def test_amqp_client_detail_says_whose_role_and_what_was_negotiated(env: Any) -> None:
    _, broker, _, client = env
    _amqp_client(broker)
    html = client.get("/client", key="amqp:3").text
    for text in ("Container id", "SASL mechanism</dt><dd>PLAIN", "65,536 B (ours)",
                 "1m 0s (ours)", "(client's: none)", "AMQP sessions</dt><dd>2",
                 'id="amqp-sessions"', "client&#39;s receiver", "client&#39;s sender"):
        assert text in html, text
    # No will: nothing to force, no "publish its will" box, no session to clear.
    assert "Force will" not in html and "publish its will" not in html
    assert "Clear session" not in html
    assert "—" in html and "-</td>" not in html
    data = client.get("/api/client", key="amqp:3").json()
    assert data["amqp"]["sasl_mechanism"] == "PLAIN" and len(data["amqp"]["sessions"]) == 2
    assert [link["session"] for link in data["link_list"]] == [1, 2]


def test_clear_session_is_offered_only_for_a_persistent_session(env: Any) -> None:
    _, broker, _, client = env
    connect(broker, "clean-one", clean=True)
    connect(broker, "keeper", clean=False,
            will=WillMessage("keeper", "s/keeper", b"gone", 1, False, "mqtt"))
    clean = client.get("/client", key="mqtt:clean-one").text
    assert "Clear session" not in clean and "Force will" not in clean
    kept = client.get("/client", key="mqtt:keeper").text
    assert "Clear session" in kept and "Force will" in kept and "publish its will" in kept


# -- clients list -------------------------------------------------------------------------------


def _ids(reply: Any) -> list[str]:
    return [r["client_id"] for r in reply.json()["items"]]


def test_client_filters(env: Any) -> None:
    _, broker, _, client = env
    connect(broker, "m1", clean=True, user="alice", remote="10.0.0.1:1")
    connect(broker, "m2", clean=False, user="bob", remote="10.0.0.2:1",
            will=WillMessage("m2", "s/m2", b"x", 0, False, "mqtt"))
    connect(broker, "m3", clean=True, remote="192.168.1.5:1", protocol="mqtt3.1")
    connect_amqp(broker, "a1", 1, ())
    assert _ids(client.get("/api/clients", protocol="amqp")) == ["a1"]
    assert _ids(client.get("/api/clients", protocol="mqtt")) == ["m1", "m2", "m3"]
    assert _ids(client.get("/api/clients", protocol="mqtt3.1")) == ["m3"]
    assert _ids(client.get("/api/clients", user="ali")) == ["m1"]
    assert _ids(client.get("/api/clients", user="-", protocol="mqtt")) == ["m3"]
    assert _ids(client.get("/api/clients", remote="192.168.")) == ["m3"]
    assert _ids(client.get("/api/clients", kind="persistent")) == ["m2"]
    assert _ids(client.get("/api/clients", will="yes")) == ["m2"]
    assert _ids(client.get("/api/clients", will="no", kind="clean", protocol="mqtt")) == \
        ["m1", "m3"]
    assert client.get("/api/clients", kind="weird").code == 400
    page = client.get("/clients", protocol="mqtt", will="no").text
    assert "(filtered)" in page and "m1" in page and "m2" not in page
    # Sorting and paging keep the filters.
    assert "protocol=mqtt" in re.search(r'href="(/clients\?[^"]*sort=user[^"]*)"', page)[1]


def test_counters_and_rates_per_client(env: Any) -> None:
    _, broker, clock, client = env
    _amqp_client(broker)
    row = client.get("/api/clients").json()["items"][0]
    assert row["counters"] == {"messages_in": 2, "messages_out": 5, "bytes_in": 300,
                               "bytes_out": 900, "last_activity": row["connected_since"]}
    assert row["rates"] is None                 # the first look: no rate yet
    conn = broker.connections["amqp:3"]
    old = conn.info

    def busier() -> ConnectionInfo:
        from dataclasses import replace
        return replace(old(), messages_in=22, messages_out=45, bytes_in=2300)
    conn.info = busier
    clock.advance(2)
    row = client.get("/api/clients").json()["items"][0]
    assert row["rates"] == {"messages_in": 10.0, "messages_out": 20.0, "bytes_in": 1000.0,
                            "bytes_out": 0.0}
    html = client.get("/clients").text
    assert "10.0/s" in html and "20.0/s" in html
    broker.unregister_connection("amqp:3", conn)
    client.get("/api/clients")
    assert len(client.console.clients.rates) == 0    # forgotten with the client


def test_page_numbers_with_first_and_last(env: Any) -> None:
    _, broker, _, client = env
    for i in range(130):
        connect(broker, f"dev-{i:03d}")
    html = client.get("/clients", per_page="25", page="3").text
    pager = html[html.index('class="pager"'):]
    for label in ("« First", "‹ Previous", 'aria-label="Page 1"', 'aria-label="Page 5"',
                  "Next ›", "Last »", 'aria-current="page">3<'):
        assert label in pager, label
    assert re.search(r'href="/clients\?[^"]*page=6[^"]*"[^>]*aria-label="Last page"', pager)
    first = client.get("/clients", per_page="25").text
    assert "« First" not in first and "Last »" in first


def test_bulk_disconnect_and_clear_session(env: Any, audit: Any) -> None:
    _, broker, _, client = env
    a = connect(broker, "bulk-a", clean=False)
    b = connect(broker, "bulk-b", clean=True)
    c = connect(broker, "bulk-c", clean=False)
    client.get("/clients")
    reply = client.request("POST", "/clients/bulk", data=[
        ("csrf_token", client.csrf), ("action", "clear-session"), ("keys", "mqtt:bulk-a"),
        ("keys", "mqtt:bulk-b"), ("keys", "mqtt:gone")])
    assert reply.code == 303
    assert a.closed and not b.closed and "bulk-a" not in broker.sessions
    page = client.get("/clients").text
    assert "Cleared the sessions of 1 client(s); skipped 2" in page
    headers = {"X-CSRF-Token": client.csrf}
    done = client.post_json("/api/clients/bulk", {"action": "disconnect",
                                                  "keys": ["mqtt:bulk-b", "mqtt:bulk-c"]},
                            headers).json()
    assert done["done"] == ["mqtt:bulk-b", "mqtt:bulk-c"] and b.closed and c.closed
    text = _audit_text(audit)
    assert "action=bulk-clear-session" in text and "action=bulk-disconnect" in text
    assert text.count("action=disconnect") == 2 and "action=clear-session" in text
    assert client.post_json("/api/clients/bulk", {"action": "explode", "keys": ["x"]},
                            headers).code == 400
    assert client.post_json("/api/clients/bulk", {"action": "disconnect", "keys": []},
                            headers).code == 400
    # Without the CSRF token nothing happens.
    assert client.post("/clients/bulk", csrf=False, action="disconnect").code == 403


# -- the live tail --------------------------------------------------------------------------


def _open_tail(client: Client, **params: str) -> tuple[Any, list[bytes], Any]:
    from urllib.parse import urlencode
    d = client.treq.get(webui_support.BASE + "/api/tail?" + urlencode(params))
    client.treq.flush()
    response = webui_support._result(d)
    chunks: list[bytes] = []
    done = treq.collect(response, chunks.append) if response.code == 200 else None
    client.treq.flush()
    return response, chunks, done


def test_tail_streams_matching_messages_escaped_bounded_and_ends(env: Any) -> None:
    console, broker, clock, client = env
    evil = b'<script>window.__x=1</script>'
    broker.publish(Message("plant/old", b"retained", 0, True, "p", clock.seconds()))
    response, chunks, done = _open_tail(client, filter="plant/#", view="auto")
    assert response.code == 200
    broker.publish(Message("plant/a", evil, 0, False, "pub-1", clock.seconds()))
    broker.publish(Message("other/b", b"no", 0, False, "pub-1", clock.seconds()))
    broker.publish(Message("plant/j", b'{"t": 21}', 1, False, "pub-2", clock.seconds()))
    broker.publish(Message("plant/h", b"\x00\x01\xff", 0, False, None, clock.seconds()))
    client.treq.flush()
    frames = _frames(chunks)
    assert [e for e, _ in frames] == ["open", "message", "message", "message"]
    first = frames[1][1]
    assert (first["topic"], first["mode"], first["body"]) == ("plant/a", "text", evil.decode())
    raw = b"".join(chunks)
    assert b"<script>" not in raw           # JSON-escaped on the wire (\u003c)
    assert frames[2][1]["mode"] == "json" and frames[3][1]["mode"] == "hex"
    # Bounded: over the per-second rate, messages are skipped and reported.
    console.messages.tails.per_second = 2
    clock.advance(1)
    for _ in range(5):
        broker.publish(Message("plant/flood", b"x", 0, False, "p", clock.seconds()))
    clock.advance(1)
    client.treq.flush()
    frames = _frames(chunks)
    assert sum(1 for e, d in frames if e == "message" and d["topic"] == "plant/flood") == 2
    assert any(e == "tick" and d["skipped"] == 3 for e, d in frames)
    # Logging out ends the stream and the subscription.
    assert len(broker.link_subscribers) == 1
    client.post("/logout")
    clock.advance(1)
    client.treq.flush()
    assert _frames(chunks)[-1][0] == "logout" and done is not None and done.called
    assert not broker.link_subscribers and not console.messages.tails.tails


def test_tail_refuses_bad_filters_and_too_many(env: Any) -> None:
    console, broker, _, client = env
    assert _open_tail(client, filter="a/#/b")[0].code == 400
    assert _open_tail(client, filter="a", view="pdf")[0].code == 400
    # (review finding) a tail never joins a shared group nor reads a dynamic node
    assert _open_tail(client, filter="$share/workers/jobs/#")[0].code == 403
    assert _open_tail(client, filter="$dynamic/+")[0].code == 403
    assert not broker.link_subscribers
    console.messages.tails.max_tails = 1
    response, _, _ = _open_tail(client, filter="x/#")
    assert response.code == 200
    assert _open_tail(client, filter="y/#")[0].code == 503
    tail = next(iter(console.messages.tails.tails.values()))
    tail.done.cancel()                     # the browser went away
    assert not console.messages.tails.tails and not broker.link_subscribers


# -- topics and subscriptions ------------------------------------------------------------------


def test_topic_counts_are_capped_and_cheap() -> None:
    from mqttamqp.core.routing.topicstats import TopicStats
    stats = TopicStats(max_topics=2)
    for topic in ("a", "b", "a", "c", "d", "b"):
        stats.note(topic)
    assert stats.counts() == {"a": 2, "b": 2} and stats.untracked == 2


def test_topic_tree_with_rates_subscribers_and_retained(env: Any) -> None:
    from mqttamqp.core.auth import Identity
    _, broker, clock, client = env
    connect(broker, "watcher", subscriptions=("plant/+/temp",))
    for topic, retain in (("plant/l1/temp", True), ("plant/l1/temp", False),
                          ("plant/l2/temp", False), ("office/door", False)):
        broker.publish(Message(topic, b"1", 0, retain, "p", clock.seconds()), Identity("p"))
    root = client.get("/api/topics").json()
    assert [(n["name"], n["messages"], n["topics"], n["children"]) for n in root["items"]] == [
        ("office", 1, 1, True), ("plant", 3, 2, True)]
    assert (root["tracked"], root["max_tracked"], root["untracked"]) == (3, 10_000, 0)
    level = client.get("/api/topics", prefix="plant/l1").json()
    assert level["items"] == [{"name": "temp", "path": "plant/l1/temp", "messages": 2,
                               "rate": 0.0, "topics": 1, "retained": True,
                               "retained_below": 0, "leaf": True,
                               "children": False, "subscribers": 1}]
    clock.advance(2)
    for _ in range(6):
        broker.publish(Message("plant/l1/temp", b"2", 0, False, "p", clock.seconds()))
    level = client.get("/api/topics", prefix="plant/l1").json()
    assert level["items"][0]["rate"] == 3.0 and level["items"][0]["messages"] == 8
    html = client.get("/topics", prefix="plant").text
    assert "plant/l1" in html and "at most 10,000 topics" in html and 'id="topic-table"' in html
    assert client.get("/api/topics", prefix="a/+").code == 400


def test_subscriptions_across_sessions_are_searchable(env: Any) -> None:
    from mqttamqp.core.auth import Identity
    _, broker, _, client = env
    connect(broker, "dev-<1>", clean=False, subscriptions=("cmd/dev1/#", "all/#"))
    connect(broker, "dev-2", subscriptions=("cmd/dev2/#",))
    broker.add_topic_receiver("amqp:9:rx", "all/#", Identity("app"), 1)
    items = client.get("/api/subscriptions").json()["items"]
    assert [(s["filter"], s["client_id"], s["kind"]) for s in items] == [
        ("all/#", "amqp:9:rx", "amqp receiver"), ("all/#", "dev-<1>", "persistent"),
        ("cmd/dev1/#", "dev-<1>", "persistent"), ("cmd/dev2/#", "dev-2", "clean")]
    found = client.get("/api/subscriptions", q="DEV2").json()
    assert found["total"] == 1 and found["items"][0]["client_id"] == "dev-2"
    html = client.get("/subscriptions", q="dev1").text
    assert "dev-&lt;1&gt;" in html and "dev-<1>" not in html


# -- the API index ------------------------------------------------------------------------------


def test_api_index_lists_every_endpoint(env: Any) -> None:
    from mqttamqp.console.apidoc import ENDPOINTS
    console, _, _, client = env
    index = client.get("/api/").json()
    listed = {e["path"]: e for e in index["endpoints"]}
    routes = {r.rule for r in console.app.url_map.iter_rules() if r.rule.startswith("/api/")}
    assert set(listed) == routes
    assert set(ENDPOINTS) <= routes, set(ENDPOINTS) - routes        # nothing stale
    assert all(e["description"] for e in index["endpoints"]), [
        p for p, e in listed.items() if not e["description"]]
    assert listed["/api/bans/add"]["methods"] == ["POST"]
    assert listed["/api/bans/add"]["kind"] == "action"
    assert listed["/api/clients"]["methods"] == ["GET"] and "protocol=" in \
        listed["/api/clients"]["parameters"]
    assert "Bearer" in index["auth"]
    anonymous = Client(console).get("/api/")
    assert anonymous.code == 401

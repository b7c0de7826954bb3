"""The console's client pages over StubTreq against a real ``Broker`` on a ``task.Clock``:
an AMQP client's detail, the clients list (filters, MQTT 5 among them, counters and
rates, page numbers, bulk actions), MQTT 5 clients in the overview's counts, and an MQTT
5 session's expiry on the client's page."""

from __future__ import annotations

import re
from typing import Any

from console_support import FakeLink, audit_text, connect, connect_amqp

from mqttamqp.core.clients.connections import (
    AmqpDetails,
    AmqpSessionInfo,
    ConnectionInfo,
    LinkInfo,
)
from mqttamqp.core.message import WillMessage

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
    """An AMQP client's page shows what was negotiated (SASL, frame size, idle time-outs,
    sessions) and each link from the client's side."""
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
    """Clear session and Force will are offered only where there is a persistent session or
    a will."""
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
    """The clients list filters by protocol, user, remote address, session kind and will,
    combined."""
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
    """Each client's counters are listed, and rates once a second look can compare."""
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
    """The clients pager shows first, previous, numbered, next and last links, with the
    current page marked."""
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
    """Bulk clear-session and disconnect act on the clients they apply to, skip the others,
    say so, and are audited."""
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
    text = audit_text(audit)
    assert "action=bulk-clear-session" in text and "action=bulk-disconnect" in text
    assert text.count("action=disconnect") == 2 and "action=clear-session" in text
    assert client.post_json("/api/clients/bulk", {"action": "explode", "keys": ["x"]},
                            headers).code == 400
    assert client.post_json("/api/clients/bulk", {"action": "disconnect", "keys": []},
                            headers).code == 400
    # Without the CSRF token nothing happens.
    assert client.post("/clients/bulk", csrf=False, action="disconnect").code == 403


# -- MQTT 5 clients ---------------------------------------------------------------------------


def _stat(html: str, name: str) -> str:
    m = re.search(rf'data-stat="{re.escape(name)}"[^>]*>([^<]*)<', html)
    assert m is not None, name
    return m.group(1)


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

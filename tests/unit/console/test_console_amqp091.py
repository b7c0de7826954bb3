"""The console with a real AMQP 0.9.1 connection (a fake transport, a ``Clock``, an
in-memory broker): the client page shows its negotiated settings, channels and
consumers with prefetch and unacknowledged counts; the queue page lists its
consumer as AMQP 0.9.1; the console closes it (audited)."""

from __future__ import annotations

from typing import Any

import pytest
from console_support import Client, audit_text, make_console
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, method_frame

C = commands.Connection


def frames_of(transport: StringTransport) -> list[Any]:
    data = transport.value()
    transport.clear()
    return [f for _, f in FrameReader(1 << 20).feed(data)]


def open_091(factory: AMQP091Factory, name: str) -> tuple[Any, StringTransport]:
    """An open 0.9.1 connection named ``name`` (client property connection_name)."""
    conn = factory.buildProtocol(None)
    transport = StringTransport()
    conn.makeConnection(transport)
    conn.dataReceived(method_frame(0, C.StartOk(
        client_properties={"connection_name": name,
                           "capabilities": {"consumer_cancel_notify": True}},
        mechanism="PLAIN", response="\x00guest\x00guest")))
    conn.dataReceived(method_frame(0, C.TuneOk(2047, 131072, 30))
                      + method_frame(0, C.Open("/")))
    frames_of(transport)
    return conn, transport


def publish(conn: Any, queue: str, count: int) -> None:
    one = (method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
           + frame.marshal(ContentHeader(0, 1, commands.Basic.Properties(delivery_mode=2)), 1)
           + frame.marshal(ContentBody(b"x"), 1))
    conn.dataReceived(one * count)


@pytest.fixture
def env(tmp_path: Any) -> Any:
    """A console, a 0.9.1 publisher that declared ``jobs`` and published 5 messages,
    and a 0.9.1 consumer (prefetch 3 on channel 1, confirm mode on channel 2)."""
    console, service, clock = make_console(tmp_path)
    factory = AMQP091Factory(service.broker, clock)
    pub, _ = open_091(factory, "publisher")
    pub.dataReceived(method_frame(1, commands.Channel.Open())
                     + method_frame(1, commands.Queue.Declare(
                         queue="jobs", durable=True, arguments={"x-custom": "kept"})))
    cons, ct = open_091(factory, "worker")
    cons.dataReceived(method_frame(1, commands.Channel.Open())
                      + method_frame(1, commands.Basic.Qos(prefetch_count=3))
                      + method_frame(1, commands.Basic.Consume(queue="jobs",
                                                               consumer_tag="w:1"))
                      + method_frame(2, commands.Channel.Open())
                      + method_frame(2, commands.Confirm.Select()))
    publish(pub, "jobs", 5)
    clock.advance(0)
    assert len([f for f in frames_of(ct) if f.name == "Basic.Deliver"]) == 3
    client = Client(console)
    assert client.login().code == 303
    return console, service, clock, client, cons


def test_client_page_shows_channels_consumers_prefetch_and_unacked(env: Any) -> None:
    """/api/client and the client page show the 0.9.1 connection's settings, its two
    channels (prefetch, unacked, confirms) and its consumer."""
    _, _, _, client, cons = env
    detail = client.get("/api/client", key=cons.key).json()
    a = detail["amqp091"]
    assert (a["mechanism"], a["channel_max"], a["frame_max"], a["heartbeat"]) == (
        "PLAIN", 2047, 131072, 30)
    assert a["cancel_notify"] is True and a["blocked"] is False
    one, two = a["channels"]
    assert (one["number"], one["consumers"], one["prefetch"], one["unacked"]) == (1, 1, 3, 3)
    assert (two["number"], two["consumers"], two["confirming"]) == (2, 0, True)
    [link] = detail["link_list"]
    assert (link["name"], link["address"], link["credit"], link["unsettled"]) == (
        "w:1", "jobs", 3, 3)
    assert detail["client_id"] == "worker" and detail["protocol_label"] == "AMQP 0.9.1"
    html = client.get("/client", key=cons.key).text
    assert 'id="amqp091-channels"' in html and 'id="amqp091-consumers"' in html
    assert "Connection name" in html and "AMQP links" not in html


def test_queue_page_lists_the_091_consumer_and_declared_arguments(env: Any) -> None:
    """The queue a 0.9.1 client declared shows its arguments and its 0.9.1 consumer
    with channel, tag, prefetch and unacknowledged count."""
    _, _, _, client, cons = env
    detail = client.get("/api/queues/queue", name="jobs").json()
    assert detail["declared"]["arguments"] == {"x-custom": "kept"}
    [c] = detail["consumers"]
    assert (c["protocol"], c["connection"], c["client_id"], c["channel"], c["tag"],
            c["prefetch"], c["unacked"]) == ("amqp0-9-1", cons.key, "worker", 1, "w:1", 3, 3)
    assert "AMQP 0.9.1" in client.get("/queues/queue", name="jobs").text


def test_the_console_closes_a_091_connection_audited(env: Any, audit: Any) -> None:
    """Disconnect from the console closes the 0.9.1 connection with 320 and is
    audited; its unacknowledged messages go back to the queue."""
    _, service, clock, client, cons = env
    transport = cons.transport
    reply = client.post_json("/api/clients/disconnect", {"key": cons.key},
                             {"X-CSRF-Token": client.csrf})
    assert reply.code == 200, reply.text
    [close] = [f for f in frames_of(transport) if f.name == "Connection.Close"]
    assert close.reply_code == 320
    cons.connectionLost(None)
    clock.advance(0)
    assert cons.key not in service.broker.connections
    assert f"action=disconnect key='{cons.key}'" in audit_text(audit)
    row = client.get("/api/queues").json()["items"][0]
    assert row["depth"] == 5 and row["pending"] == 0


def test_overview_clients_filter_and_queue_list_count_091(env: Any) -> None:
    """The overview counts 0.9.1 connections apart, the clients filter offers AMQP 0.9.1,
    and the queue list marks a queue 0.9.1 declared."""
    _, _, _, client, _ = env
    assert client.get("/api/overview").json()["clients"]["amqp091"] == 2
    assert 'data-stat="clients.amqp091"' in client.get("/").text
    assert '<option value="amqp0-9-1"' in client.get("/clients").text
    assert len(client.get("/api/clients", protocol="amqp0-9-1").json()["items"]) == 2
    assert 'title="declared over AMQP 0.9.1 x-custom=kept">0.9.1</span>' in client.get(
        "/queues").text

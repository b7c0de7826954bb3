"""The queue metadata a 0.9.1 consumer gets (its link's ``reads_delivery_count_only``,
``core.queues.metadata.COUNT_ONLY_ATTRIBUTE``): none is built for a first delivery
of a 0.9.1 message without headers (its properties go as sent), and a redelivery,
a message with headers and an MQTT 5 member of the same queue still get it."""

from __future__ import annotations

from typing import Any

import pytest
from core_broker import make_broker
from pamqp import commands, header
from pamqp import frame as pframe
from pamqp.body import ContentBody
from queue_facade import client, join, meta
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, method_frame
from mqttamqp.amqp091.handshake import Settings
from mqttamqp.core.queues import dispatch
from mqttamqp.core.queues.addresses import Consumer

C, B, Q = commands.Connection, commands.Basic, commands.Queue


def frames_of(transport: StringTransport) -> list[Any]:
    data = transport.value()
    transport.clear()
    return [f for _, f in FrameReader(1 << 20).feed(data)]


def consuming() -> tuple[Any, StringTransport, Any]:
    broker, clock, _ = make_broker()
    conn = AMQP091Factory(broker, clock, Settings()).buildProtocol(None)
    t = StringTransport()
    conn.makeConnection(t)
    conn.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open())
        + method_frame(1, Q.Declare(queue="q", durable=True))
        + method_frame(1, B.Consume(queue="q", consumer_tag="c")))
    clock.advance(1)
    frames_of(t)
    return conn, t, clock


def publish(conn: Any, props: commands.Basic.Properties) -> None:
    conn.dataReceived(
        method_frame(1, B.Publish(exchange="", routing_key="q"))
        + pframe.marshal(header.ContentHeader(0, 2, props), 1)
        + pframe.marshal(ContentBody(b"hi"), 1))


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the deliveries ``with_metadata`` built a copy for."""
    calls: list[int] = []
    real = dispatch.with_metadata

    def counting(*args: Any) -> Any:
        calls.append(args[4])   # (the delivery count)
        return real(*args)

    monkeypatch.setattr(dispatch, "with_metadata", counting)
    return calls


def test_a_first_delivery_builds_no_metadata_and_a_redelivery_does(built: list[int]) -> None:
    """A 0.9.1 message without headers: its first delivery is sent with its own
    properties and no copy with metadata; after a nack with requeue the redelivery is
    built with its count and carries x-delivery-count 1 and the redelivered flag."""
    conn, t, clock = consuming()
    publish(conn, B.Properties(delivery_mode=2, content_type="text/plain"))
    clock.advance(1)
    got = frames_of(t)
    [deliver] = [f for f in got if f.name == "Basic.Deliver"]
    [head] = [f for f in got if f.name == "ContentHeader"]
    assert not deliver.redelivered
    assert head.properties.content_type == "text/plain" and not head.properties.headers
    assert built == []
    conn.dataReceived(method_frame(1, B.Nack(delivery_tag=deliver.delivery_tag,
                                             requeue=True)))
    clock.advance(1)
    got = frames_of(t)
    [deliver] = [f for f in got if f.name == "Basic.Deliver"]
    [head] = [f for f in got if f.name == "ContentHeader"]
    assert deliver.redelivered
    assert head.properties.headers == {"x-delivery-count": 1}
    assert built == [2]


def test_a_message_with_headers_still_gets_the_metadata(built: list[int]) -> None:
    """A 0.9.1 message whose headers the core holds as user properties keeps the usual
    path (its metadata is built) and reaches the consumer with its headers as sent."""
    conn, t, clock = consuming()
    publish(conn, B.Properties(delivery_mode=2, headers={"k": "v"}))
    clock.advance(1)
    [head] = [f for f in frames_of(t) if f.name == "ContentHeader"]
    assert head.properties.headers == {"k": "v"}
    assert built == [1]


def test_an_mqtt5_member_of_the_queue_still_gets_the_metadata(built: list[int]) -> None:
    """An MQTT 5 member of the 0.9.1 consumer's group receives a headerless 0.9.1
    publish with the queue's metadata (message-id, delivery-count 1), while the 0.9.1
    consumer's copy goes as sent: the choice is the receiving link's, not the
    message's."""
    conn, t, clock = consuming()
    broker = conn.broker
    session, link = client(broker, "q-m5", "mqtt5")
    assert join(broker, session, "$queue/q", consumer=Consumer(group="q")) == 1
    for _ in range(2):
        publish(conn, B.Properties(delivery_mode=2))
    clock.advance(1)
    [head] = [f for f in frames_of(t) if f.name == "ContentHeader"]
    assert not head.properties.headers
    [(sent, *_)] = link.published()
    assert sent.payload == b"hi" and sent.props is not None
    assert meta(sent)["delivery-count"] == "1" and meta(sent)["message-id"]
    assert built == [1]

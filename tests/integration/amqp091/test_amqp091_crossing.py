"""Messages crossing between AMQP 0.9.1 and the broker's other protocols.

* MQTT (paho) <-> 0.9.1 through ``amq.topic``: routing key ``a.b.c`` is MQTT topic
  ``a/b/c``, binding key ``*`` is ``+`` and ``#`` is ``#``, as RabbitMQ's MQTT plugin
  maps them (so these run against RabbitMQ with that plugin too).
* MQTT <-> 0.9.1 through a durable queue: 0.9.1 queue ``orders`` is ``$queue/orders/...``
  (mqttamqp only).
* AMQP 1.0 (python-qpid-proton) <-> 0.9.1 through a queue: ``$queue/<name>`` here,
  RabbitMQ's AMQP 1.0 plugin's ``/amq/queue/<name>`` there; and through ``amq.topic``:
  an AMQP 1.0 topic address here, ``/topic/<key>`` there.

0.9.1 is spoken by pika's BlockingConnection with publisher confirms; consumers read
with a bounded ``inactivity_timeout``.  Names carry no ``.`` (a topic level separator
on one side, a plain character on the other).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest
from amqp091_target import TIMEOUT, Target, target, uname
from pahoclient import PahoClient
from pika.adapters.blocking_connection import BlockingChannel
from proton import Message
from proton.utils import BlockingConnection as ProtonConnection

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


@pytest.fixture
def channel(amqp091: Target) -> Iterator[BlockingChannel]:
    """A pika channel in confirm mode."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp091.url))
    ch = conn.channel()
    ch.confirm_delivery()
    yield ch
    if conn.is_open:
        conn.close()


@pytest.fixture
def paho(amqp091: Target) -> Iterator[Any]:
    """``paho(client_id)``: connected MQTT 3.1.1 clients, stopped at the end."""
    amqp091.require("mqtt")
    made: list[PahoClient] = []

    def connect(client_id: str) -> PahoClient:
        assert amqp091.mqtt_port is not None
        c = PahoClient(amqp091.mqtt_port, client_id)
        made.append(c)
        return c

    yield connect
    for c in made:
        c.stop()


def next_delivery(ch: BlockingChannel, queue: str) -> tuple[Any, Any, bytes]:
    """The next (method, properties, body) on ``queue``, acknowledged, the consumer
    cancelled again; fails after TIMEOUT."""
    for method, props, body in ch.consume(queue, inactivity_timeout=TIMEOUT):
        assert method is not None, f"nothing on {queue} within {TIMEOUT}s"
        ch.basic_ack(method.delivery_tag)
        ch.cancel()
        return method, props, body
    raise AssertionError("consumer cancelled")


def test_amqp091_publish_to_amq_topic_reaches_mqtt_subscribers(
        channel: BlockingChannel, paho: Any) -> None:
    """A persistent publish to amq.topic with key a.b.c reaches MQTT subscribers of
    a/b/c and of a/+/c, at QoS 1."""
    level = uname("x091")
    sub = paho(uname("sub")[:23])
    assert sub.subscribe((f"{level}/+/temp", 1)) == [1]
    channel.basic_publish("amq.topic", f"{level}.line1.temp", b"21.5",
                          pika.BasicProperties(delivery_mode=2, content_type="text/plain"))
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == (f"{level}/line1/temp", b"21.5", 1)


def test_mqtt_publish_reaches_amqp091_queue_bound_to_amq_topic(
        channel: BlockingChannel, paho: Any) -> None:
    """An MQTT publish to a/b/c reaches a 0.9.1 queue bound to amq.topic with a.*.c
    (routing key a.b.c); one that does not match stays out (a marker follows it)."""
    level = uname("x091")
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, "amq.topic", f"{level}.*.temp")
    channel.queue_bind(q, "amq.topic", f"{level}.marker.#")
    pub = paho(uname("pub")[:23])
    pub.publish(f"{level}/line1/temp", b"22.0", qos=1)
    pub.publish(f"{level}/line1/humidity", b"40", qos=1)
    pub.publish(f"{level}/marker/end", b"m", qos=1)
    first, _props, body = next_delivery(channel, q)
    marker, _props, marker_body = next_delivery(channel, q)
    assert (body, marker_body) == (b"22.0", b"m")
    assert (first.exchange, first.routing_key) == ("amq.topic", f"{level}.line1.temp")
    assert marker.routing_key == f"{level}.marker.end"


def test_mqtt_and_amqp091_share_a_durable_queue(
        amqp091: Target, channel: BlockingChannel, paho: Any) -> None:
    """0.9.1 queue orders is $queue/orders: an MQTT publish to $queue/orders/eu reaches
    its 0.9.1 consumer, and a 0.9.1 publish to orders reaches an MQTT member."""
    amqp091.require("mqttamqp")
    orders = uname("orders")
    channel.queue_declare(orders, durable=True)
    pub = paho(uname("pub")[:23])
    pub.publish(f"$queue/{orders}/eu", b"order 1", qos=1)
    _method, _props, body = next_delivery(channel, orders)
    assert body == b"order 1"

    member = paho(f"wk{uname('g')[-8:]}-1")
    assert member.subscribe((f"$queue/{orders}/#", 1)) == [1]
    channel.basic_publish("", orders, b"order 2", pika.BasicProperties(delivery_mode=2))
    got = member.get()
    assert got.payload == b"order 2"
    assert got.topic.startswith(f"$queue/{orders}")


def test_amqp10_and_amqp091_share_a_queue(amqp091: Target, channel: BlockingChannel) -> None:
    """An AMQP 1.0 sender's message reaches a 0.9.1 consumer of the queue, and a 0.9.1
    publish reaches an AMQP 1.0 receiver of it, body and correlation id intact."""
    amqp091.require("amqp10")
    name = uname("x10")
    channel.queue_declare(name, durable=True)
    conn = ProtonConnection(f"127.0.0.1:{amqp091.amqp10_port}", timeout=TIMEOUT)
    try:
        snd = conn.create_sender(amqp091.amqp10_queue_address(name))
        snd.send(Message(body=b"from 1.0", inferred=True, correlation_id="c-10", durable=True,
                         content_type="application/octet-stream"))
        _method, props, body = next_delivery(channel, name)
        assert body == b"from 1.0"
        assert props.correlation_id == "c-10"

        rcv = conn.create_receiver(amqp091.amqp10_queue_address(name))
        channel.basic_publish("", name, b"from 0.9.1",
                              pika.BasicProperties(delivery_mode=2, correlation_id="c-091",
                                                   content_type="text/plain"))
        msg = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        assert bytes(msg.body) == b"from 0.9.1"
        assert msg.content_type == "text/plain"
        assert msg.correlation_id == "c-091"
    finally:
        conn.close()


def test_amqp10_and_amqp091_cross_through_amq_topic(
        amqp091: Target, channel: BlockingChannel) -> None:
    """An AMQP 1.0 send to topic a/b/c reaches a 0.9.1 queue bound to amq.topic with
    a.*.c, and a 0.9.1 publish to amq.topic with key a.x.c reaches an AMQP 1.0
    receiver of a/+/c."""
    amqp091.require("amqp10")
    level = uname("t10")
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, "amq.topic", f"{level}.*.temp")
    conn = ProtonConnection(f"127.0.0.1:{amqp091.amqp10_port}", timeout=TIMEOUT)
    try:
        rcv = conn.create_receiver(amqp091.amqp10_topic_address(f"{level}/+/temp"))
        snd = conn.create_sender(amqp091.amqp10_topic_address(f"{level}/line1/temp"))
        snd.send(Message(body=b"from 1.0", inferred=True, durable=True))
        _method, _props, body = next_delivery(channel, q)
        assert body == b"from 1.0"
        got = rcv.receive(timeout=TIMEOUT)       # the AMQP 1.0 receiver has it too
        rcv.accept()
        assert bytes(got.body) == b"from 1.0"

        channel.basic_publish("amq.topic", f"{level}.line2.temp", b"from 0.9.1",
                              pika.BasicProperties(delivery_mode=2))
        got = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        assert bytes(got.body) == b"from 0.9.1"
    finally:
        conn.close()


def test_priority_crosses_between_amqp10_and_amqp091(
        amqp091: Target, channel: BlockingChannel) -> None:
    """A message's priority crosses both ways through a queue and through amq.topic:
    a 0.9.1 publish's priority is an AMQP 1.0 receiver's header priority (with other
    properties or without), an AMQP 1.0 sender's header priority a 0.9.1 consumer's
    basic property; a message without one gets none (AMQP 1.0: the default 4)."""
    amqp091.require("amqp10")
    name, level = uname("p10"), uname("pt10")
    channel.queue_declare(name, durable=True)
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, "amq.topic", f"{level}.*")
    conn = ProtonConnection(f"127.0.0.1:{amqp091.amqp10_port}", timeout=TIMEOUT)
    try:
        snd = conn.create_sender(amqp091.amqp10_queue_address(name))
        snd.send(Message(body=b"p6", inferred=True, durable=True, priority=6))
        _method, props, body = next_delivery(channel, name)
        assert (body, props.priority) == (b"p6", 6)
        snd.send(Message(body=b"none", inferred=True, durable=True))
        _method, props, body = next_delivery(channel, name)
        assert (body, props.priority) == (b"none", None)
        tsnd = conn.create_sender(amqp091.amqp10_topic_address(f"{level}/x"))
        tsnd.send(Message(body=b"t2", inferred=True, durable=True, priority=2))
        _method, props, body = next_delivery(channel, q)
        assert (body, props.priority) == (b"t2", 2)

        rcv = conn.create_receiver(amqp091.amqp10_queue_address(name))
        channel.basic_publish("", name, b"q7", pika.BasicProperties(delivery_mode=2,
                                                                     priority=7))
        channel.basic_publish("", name, b"q8", pika.BasicProperties(
            delivery_mode=2, priority=8, content_type="text/plain"))
        channel.basic_publish("", name, b"q-", pika.BasicProperties(delivery_mode=2))
        got = []
        for _ in range(3):
            msg = rcv.receive(timeout=TIMEOUT)
            rcv.accept()
            got.append((bytes(msg.body), msg.priority))
        assert got == [(b"q7", 7), (b"q8", 8), (b"q-", 4)]

        trcv = conn.create_receiver(amqp091.amqp10_topic_address(f"{level}/+"))
        channel.basic_publish("amq.topic", f"{level}.y", b"t9",
                              pika.BasicProperties(delivery_mode=1, priority=9))
        msg = trcv.receive(timeout=TIMEOUT)      # (QoS 0: sent settled)
        assert (bytes(msg.body), msg.priority) == (b"t9", 9)
    finally:
        conn.close()

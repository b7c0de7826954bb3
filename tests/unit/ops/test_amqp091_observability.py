"""AMQP 0.9.1 in what the broker reports, with a real 0.9.1 connection in process
(a fake transport, a ``Clock``, an in-memory broker): the Prometheus families and
``$SYS`` carry the ``amqp0-9-1`` protocol (connections, messages received and sent),
the recorder the archive and webhooks hang off gets its connects, disconnects and
messages with that protocol, and webhooks post them."""

from __future__ import annotations

from typing import Any

from core_broker import connect, subscribe
from fakes import MemoryStore
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from prometheus_client.parser import text_string_to_metric_families
from test_webhooks import FakePost, hook
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, method_frame
from mqttamqp.archive.names import PROTOCOLS
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.recorder import CONNECT, DISCONNECT
from mqttamqp.ops.metrics import broker_registry, exposition
from mqttamqp.ops.recorders import fan_out
from mqttamqp.ops.webhooks import WebhookRecorder

C = commands.Connection


class Recording:
    """A recorder that keeps every call (the archive's and webhooks' interface)."""

    records_messages = True

    def __init__(self) -> None:
        self.messages: list[tuple[Any, ...]] = []
        self.events: list[tuple[str, str | None, dict[str, Any]]] = []

    def message(self, *args: Any) -> None:
        self.messages.append(args)

    def event(self, timestamp: float, kind: str, client_id: str | None, **fields: Any) -> None:
        self.events.append((kind, client_id, fields))

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        self.event(timestamp, kind, client_id, **dict(zip(names, values, strict=True)))

    def stats(self) -> dict[str, int]:
        return {}


def open_091(factory: AMQP091Factory, name: str) -> tuple[Any, StringTransport]:
    conn = factory.buildProtocol(None)
    transport = StringTransport()
    conn.makeConnection(transport)
    conn.dataReceived(method_frame(0, C.StartOk(
        client_properties={"connection_name": name}, mechanism="PLAIN",
        response="\x00guest\x00guest")))
    conn.dataReceived(method_frame(0, C.TuneOk(2047, 131072, 0))
                      + method_frame(0, C.Open("/"))
                      + method_frame(1, commands.Channel.Open()))
    transport.clear()
    return conn, transport


def publish(conn: Any, exchange: str, key: str, count: int = 1) -> None:
    one = (method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=key))
           + frame.marshal(ContentHeader(0, 2, commands.Basic.Properties()), 1)
           + frame.marshal(ContentBody(b"21"), 1))
    conn.dataReceived(one * count)


def scrape(broker: Broker) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(exposition(broker_registry(broker)).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def sys_value(broker: Broker, topic: str) -> str:
    broker.sys_topics.publish()
    message = broker.retained.get("$SYS/broker/" + topic)
    assert message is not None, topic
    return message.payload.decode()


def test_metrics_sys_archive_and_webhooks_carry_amqp091() -> None:
    """0.9.1 connections, publishes (to a queue and to amq.topic) and deliveries are
    counted under amqp0-9-1 in /metrics and $SYS, and recorded and posted with it."""
    clock = Clock()
    clock.advance(1000.0)
    recording = Recording()
    post = FakePost()
    webhooks = WebhookRecorder(clock, [hook(events=["connect", "disconnect", "message"],
                                            topics=["plant/#"], **{"max-delay": 0.0})],
                               post_factory=lambda s: post)
    broker = Broker(clock, MemoryStore(), Limits(sys_interval=0),
                    recorder=fan_out(recording, webhooks))
    broker.start()
    try:
        sub, link, _ = connect(broker, "device")
        subscribe(broker, sub, ("plant/#", 0))
        factory = AMQP091Factory(broker, clock)
        pub, _ = open_091(factory, "publisher")
        cons, ct = open_091(factory, "worker")
        pub.dataReceived(method_frame(1, commands.Queue.Declare(queue="jobs")))
        cons.dataReceived(method_frame(1, commands.Basic.Consume(queue="jobs",
                                                                 consumer_tag="w",
                                                                 no_ack=True)))
        publish(pub, "", "jobs", 3)                  # to a queue: not the topic space
        publish(pub, "amq.topic", "plant.line1.temp")  # an MQTT publish too
        clock.advance(0)
        delivered = [f for _, f in FrameReader(1 << 20).feed(ct.value())
                     if f.name == "Basic.Deliver"]
        assert len(delivered) == 3 and len(link.sent) == 1
        s = scrape(broker)
        received = s["mqttamqp_messages_received_total"]
        assert received[(("protocol", "amqp0-9-1"),)] == 4
        assert received[(("protocol", "mqtt"),)] == 0
        sent = s["mqttamqp_messages_sent_total"]
        assert sent[(("protocol", "amqp0-9-1"),)] == 3 and sent[(("protocol", "amqp"),)] == 0
        assert s["mqttamqp_connections"][(("protocol", "amqp0-9-1"),)] == 2
        assert int(sys_value(broker, "messages/received")) == 4
        assert sys_value(broker, "messages/received/protocol/amqp0-9-1") == "4"
        assert sys_value(broker, "messages/sent/protocol/amqp0-9-1") == "3"
        assert sys_value(broker, "messages/received/protocol/mqtt") == "0"
        assert sys_value(broker, "clients/protocol/amqp0-9-1") == "2"
        # The recorder (the archive's, the webhooks') has the 0.9.1 side.
        connects = [(c, f["protocol"]) for k, c, f in recording.events if k == CONNECT]
        assert ("publisher", "amqp0-9-1") in connects and ("worker", "amqp0-9-1") in connects
        [message] = [m for m in recording.messages if m[1] == "plant/line1/temp"]
        assert (message[4], message[7]) == (b"21", "amqp0-9-1")
        cons.connectionLost(None)
        clock.advance(0)
        assert ("worker", "amqp0-9-1") in [(c, f.get("protocol"))
                                           for k, c, f in recording.events if k == DISCONNECT]
        posted = [e for n in range(len(post.calls)) for e in post.events(n)]
        kinds = {(e["kind"], e.get("protocol")) for e in posted}
        assert {("connect", "amqp0-9-1"), ("disconnect", "amqp0-9-1"),
                ("message", "amqp0-9-1")} <= kinds
        assert "amqp0-9-1" in PROTOCOLS
        # A 0.9.1 publish the permissions refuse is a denied drop of amqp0-9-1.
        assert not broker.router.may_publish(pub.identity, "$SYS/broker/x", False)
        dropped = scrape(broker)["mqttamqp_messages_dropped_total"]
        assert dropped[(("protocol", "amqp0-9-1"), ("reason", "denied"))] == 1
        assert dropped[(("protocol", "mqtt"), ("reason", "denied"))] == 0
    finally:
        broker.stop()

"""The MQTT side of durable queues on one connection (StringTransport, Clock, no
reactor): SUBSCRIBE user properties choose the consumer group and mode, and the
core's refusals reach an MQTT 5 client as PUBACK/PUBREC reason codes with a reason
string (an MQTT 3.1.1 client, which cannot be told why, is acknowledged as usual
and stays connected)."""

from __future__ import annotations

from test_protocol5_unit import connected
from test_protocol_unit import Harness

from mqttamqp.mqtt.packets import (
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)


def users(message: Publish) -> dict[str, str]:
    assert message.properties is not None
    return dict(message.properties.user_properties)


def test_subscribe_user_properties_choose_the_group_and_mode() -> None:
    h = Harness()
    worker = connected(h, "w-1")
    worker.send(Subscribe(1, (("$queue/jobs/#", 1),), properties=Properties(
        user_properties=(("consumer-group", "billing"),))))
    assert worker.received() == [Suback(1, (1,))]
    reader = connected(h, "r-1")
    reader.send(Subscribe(1, (("$queue/jobs", 0),), properties=Properties(
        user_properties=(("consumer-mode", "stream"), ("stream-offset", "first")))))
    assert reader.received() == [Suback(1, (0,))]
    pub = connected(h, "pub")
    pub.send(Publish("$queue/jobs/a", b"x", 1, False, False, 3))
    assert pub.received() == [Puback(3)]
    [delivered] = worker.received()
    assert isinstance(delivered, Publish) and delivered.topic == "$queue/jobs/a"
    assert users(delivered)["group-id"] == "billing"
    [streamed] = reader.received()
    assert isinstance(streamed, Publish) and users(streamed)["group-id"] == "r"
    # a mode the core does not know: SUBACK 0x80 for that filter only
    worker.send(Subscribe(2, (("$queue/jobs/#", 1),), properties=Properties(
        user_properties=(("consumer-mode", "fast"),))))
    assert worker.received() == [Suback(2, (0x80,))]


def test_refused_queue_publishes_get_a_reason_code_and_string() -> None:
    h = Harness()
    pub = connected(h, "pub")
    for pid, topic in enumerate(("$queue/jobs/+", "$queue/", "$dlq/jobs/a"), 1):
        pub.send(Publish(topic, b"x", 1, False, False, pid))
        [ack] = pub.received()
        assert isinstance(ack, Puback) and ack.packet_id == pid
        assert ack.reason_code == 0x90, (topic, ack)
        assert ack.properties is not None and ack.properties.reason_string, ack
    assert pub.open


def test_a_malformed_ack_gets_0x80_with_why() -> None:
    h = Harness()
    worker = connected(h, "w-1")
    worker.send(Subscribe(1, (("$queue/jobs/#", 1),)))
    worker.received()
    worker.send(Publish("$queue/jobs/$ack", b"", 1, False, False, 5, Properties(
        user_properties=(("message-id", "jobs-7"), ("group-id", "w")))))
    [ack] = worker.received()
    assert isinstance(ack, Puback) and ack.reason_code == 0x80
    assert ack.properties is not None and "malformed" in (ack.properties.reason_string or "")


def test_a_refused_qos2_queue_publish_frees_its_packet_id() -> None:
    """PUBREC 0x90 ends the exchange: the same packet id then carries a new message,
    which is appended (not mistaken for a duplicate)."""
    h = Harness()
    worker = connected(h, "w-1")
    worker.send(Subscribe(1, (("$queue/jobs/#", 1),)))
    worker.received()
    pub = connected(h, "pub")
    pub.send(Publish("$queue/jobs/#", b"bad", 2, False, False, 9))
    [rec] = pub.received()
    assert isinstance(rec, Pubrec) and rec.reason_code == 0x90
    pub.send(Publish("$queue/jobs/a", b"good", 2, False, False, 9))
    assert pub.received() == [Pubrec(9)]
    [delivered] = worker.received()
    assert isinstance(delivered, Publish) and delivered.payload == b"good"


def test_mqtt311_refused_queue_publish_is_acknowledged_and_stays_connected() -> None:
    h = Harness()
    pub = h.client()
    pub.connect("pub")
    pub.send(Publish("$queue/jobs/+", b"x", 1, False, False, 4))
    assert pub.received() == [Puback(4)]
    assert pub.open


def test_unsubscribe_leaves_the_group() -> None:
    """After UNSUBSCRIBE the member gets no more of the queue: the other member does."""
    h = Harness()
    leaver, stayer = connected(h, "w-1"), connected(h, "w-2")
    for c in (leaver, stayer):
        c.send(Subscribe(1, (("$queue/jobs", 1),)))
        assert c.received() == [Suback(1, (1,))]
    leaver.send(Unsubscribe(2, ("$queue/jobs",)))
    assert leaver.received() == [Unsuback(2, (0,))]
    pub = connected(h, "pub")
    for pid in (1, 2):
        pub.send(Publish("$queue/jobs/a", b"%d" % pid, 1, False, False, pid))
    assert leaver.received() == []
    assert [p.payload for p in stayer.received() if isinstance(p, Publish)] == [b"1", b"2"]


def test_an_ack_at_qos2_completes_its_exchange() -> None:
    """``$ack`` published at QoS 2: PUBREC 0, then PUBCOMP 0 (the packet id is known
    to PUBREL), and the message is done."""
    h = Harness()
    worker = connected(h, "w-1")
    worker.send(Subscribe(1, (("$queue/jobs", 1),)))
    worker.received()
    pub = connected(h, "pub")
    pub.send(Publish("$queue/jobs/a", b"x", 1, False, False, 1))
    [delivered] = worker.received()
    assert isinstance(delivered, Publish)
    worker.send(Publish("$queue/jobs/$ack", b"", 2, False, False, 7, Properties(
        user_properties=(("message-id", users(delivered)["message-id"]),
                         ("group-id", users(delivered)["group-id"])))))
    assert worker.received() == [Pubrec(7)]
    worker.send(Pubrel(7))
    assert worker.received() == [Pubcomp(7)]
    assert h.broker.queue_views()[0].acknowledged == 1

"""The MQTT side of durable queues on one connection (StringTransport, Clock, no
reactor): SUBSCRIBE user properties choose the consumer group and mode, and the
core's refusals reach an MQTT 5 client as PUBACK/PUBREC reason codes with a reason
string (an MQTT 3.1.1 client, which cannot be told why, is acknowledged as usual
and stays connected)."""

from __future__ import annotations

from mqtt_memory import Harness, connected

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
    """SUBSCRIBE user properties choose a member's consumer group, mode and stream offset."""
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
    """A refused queue publish gets PUBACK 0x90 with a reason string, and the connection
    stays."""
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
    """A malformed $ack gets PUBACK 0x80 with a reason string saying why."""
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
    """An MQTT 3.1.1 client's refused queue publish is acknowledged and the client stays
    connected."""
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
    assert h.broker.queues.views()[0].acknowledged == 1


# -- publishers blocked by the durable queues' storage alarm -------------------------


def test_a_blocked_client_is_read_for_acks_and_its_queue_publishes_wait_in_order() -> None:
    """Blocked at --queue-max-total-bytes, a 3.1.1 client's PUBLISHes to $queue/ (and
    what follows them) wait, PINGREQ and PUBACKs are handled; past the held-bytes
    bound it is not read; once the queues drain, the held packets run in order."""
    from mqtt_memory import Client

    from mqttamqp.mqtt.packets import Connect, Pingreq, Pingresp
    from mqttamqp.mqtt.parking import PARKED_BYTES

    h = Harness(queue_max_total_bytes=20 * 1024)
    watched = h.watcher("plain/#")
    worker = Client(h.factory)
    worker.send(Connect("MQTT", 4, "worker", True, 0))
    worker.send(Subscribe(1, (("$queue/jobs/#", 1),)))
    assert len(worker.received()) == 2
    pub = Client(h.factory)
    pub.send(Connect("MQTT", 4, "pub", True, 0))
    pub.received()
    for pid in range(1, 21):
        pub.send(Publish("$queue/jobs/a", b"j" * 1024, 1, False, False, pid))
    assert h.broker.queues.blocked
    jobs = [p for p in worker.received() if isinstance(p, Publish)]
    assert jobs and pub.received() == [Puback(pid) for pid in range(1, 21)]
    # The worker: its queue publish is stored and blocks it; the next one waits,
    # and so does what follows it; PINGREQ does not.
    worker.send(Publish("$queue/results/r", b"r0", 1, False, False, 99))
    worker.send(Publish("$queue/results/r", b"r1", 1, False, False, 100))
    worker.send(Publish("plain/after", b"p", 1, False, False, 101))   # (held: order)
    worker.send(Pingreq())
    assert worker.received() == [Puback(99), Pingresp()]
    assert worker.transport.producerState == "producing"
    assert watched.sent == []
    # Another publisher past the bound of held bytes is not read any more.
    pub.send(Publish("$queue/jobs/a", b"x", 1, False, False, 30))
    big = b"b" * (64 * 1024)
    for _ in range(PARKED_BYTES // len(big) + 1):
        pub.send(Publish("$queue/jobs/a", big, 0, False, False, None))
    assert pub.transport.producerState == "paused"
    assert pub.received() == []
    # The worker acknowledges what it got: the queues drain, the alarm clears.
    got: list[object] = []
    for _ in range(100):   # (bounded: 20 jobs, then what the other one had held)
        if not jobs:
            break
        for job in jobs:
            assert job.packet_id is not None
            worker.send(Puback(job.packet_id))
        new = worker.received()
        got += new
        jobs = [p for p in new if isinstance(p, Publish)]
    assert not h.broker.queues.blocked
    assert [p for p in got if isinstance(p, Puback)] == [Puback(100), Puback(101)]
    assert watched.sent == [("plain/after", b"p", 1, False)]
    assert pub.transport.producerState == "producing"
    assert Puback(30) in pub.received()


def test_a_blocked_mqtt5_client_still_gets_0x97_for_qos1_queue_publishes() -> None:
    """An MQTT 5 client blocked by its QoS 0 queue publish is told 0x97 at once for
    a QoS 1 one (not held), and its $ack is handled."""
    h = Harness(queue_max_total_bytes=2048)
    c = connected(h, "p5")
    c.send(Publish("$queue/jobs/a", b"x" * 2048, 0, False, False, None))
    assert h.broker.queues.blocked and c.received() == []
    c.send(Publish("$queue/jobs/a", b"y", 1, False, False, 1))
    c.send(Publish("$queue/jobs/$ack", b"", 1, False, False, 2, Properties(
        user_properties=(("message-id", "jobs-0"), ("group-id", "p5")))))
    first, second = c.received()
    assert isinstance(first, Puback) and first.packet_id == 1
    assert first.reason_code == 0x97
    assert isinstance(second, Puback) and second.packet_id == 2 and c.open

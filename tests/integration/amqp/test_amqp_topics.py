"""Native AMQP clients on MQTT topics: python-qpid-proton (blocking API and the
event-driven Container) and paho-mqtt against one broker on loopback, port 0.

Covers issue 4's "Topics for native AMQP clients": wildcard receivers, annotations,
senders to a topic / to the null address, settlement (Released, Modified with
delivery-failed, Rejected, pre-settled receivers, rcv-settle-mode second), credit,
and AmqpValue/AmqpSequence bodies (kept between AMQP peers, their MQTT form).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import (
    ACCEPTED,
    REJECTED,
    TIMEOUT,
    Modes,
    body_bytes,
    conns,
    outcome,
    paho,
    receiver,
    run_container,
    send_expect,
    take,
    uid,
    wait_messages,
)
from amqp_messages import annotation, publish_message
from brokerproc import BrokerProcess
from proton import Delivery, Link, Message, symbol
from proton.handlers import MessagingHandler

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("amqp-topics")), "--sys-interval", "1",
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def test_mqtt_publisher_to_amqp_wildcard_receiver(broker, conns, paho) -> None:
    """An AMQP receiver on a wildcard filter gets MQTT messages with the contract's annotations."""
    base = uid("w")
    conn = conns(broker)
    plus = receiver(conn, f"{base}/+/temp")
    hash_ = receiver(conn, f"{base}/#")
    pub = paho(broker, uid("pub"))
    pub.publish(f"{base}/s1/temp", b"21.5", qos=1)
    pub.publish(f"{base}/s2/temp", b"19.0", qos=0)
    pub.publish(f"{base}/s1/hum", b"40", qos=1)
    got = [take(conn, plus) for _ in range(2)]
    plus.accept()
    m1, d1 = got[0]
    assert m1.address == f"{base}/s1/temp" and body_bytes(m1) == b"21.5"
    assert annotation(m1, "x-opt-mqtt-qos") == 1
    assert annotation(m1, "x-opt-retain-message") is False
    assert annotation(m1, "x-opt-mqtt-client-id") == pub.client_id
    assert m1.durable is True and m1.delivery_count == 0
    assert m1.inferred is True          # one Data section
    assert not d1.settled               # QoS 1: unsettled until we settle it
    m2, d2 = got[1]
    assert m2.address == f"{base}/s2/temp" and annotation(m2, "x-opt-mqtt-qos") == 0
    assert m2.durable is False and d2.settled   # QoS 0: pre-settled
    topics = [take(conn, hash_)[0].address for _ in range(3)]
    assert topics == [f"{base}/s1/temp", f"{base}/s2/temp", f"{base}/s1/hum"]


def test_amqp_sender_to_mqtt_subscriber_keeps_qos_and_retain(broker, conns, paho) -> None:
    """AMQP publishes reach MQTT subscribers at their QoS; retain survives the crossing."""
    topic = uid("q") + "/x"
    sub = paho(broker, uid("sub"))
    assert sub.subscribe((topic, 2)) == [2]
    conn = conns(broker)
    snd = conn.create_sender(topic)
    for qos in (0, 1, 2):
        d = snd.send(publish_message(None, b"q%d" % qos, qos=qos))
        assert d.remote_state == ACCEPTED
    got = [sub.get() for _ in range(3)]
    assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
        (topic, b"q0", 0, False), (topic, b"q1", 1, False), (topic, b"q2", 2, False)]
    snd.send(publish_message(None, b"kept", qos=1, retain=True))
    assert sub.get().payload == b"kept"
    late = paho(broker, uid("late"))
    late.subscribe((topic, 2))
    m = late.get()
    assert (m.payload, m.qos, m.retain) == (b"kept", 1, True)
    # retained delete by an empty body with the retain annotation
    snd.send(publish_message(None, b"", qos=1, retain=True))
    marker = uid("mk")
    snd2 = conn.create_sender(marker)
    snd2.send(publish_message(None, b"m", qos=1))
    later = paho(broker, uid("later"))
    later.subscribe((topic, 2), (marker, 1))
    snd2.send(publish_message(None, b"m2", qos=1))
    assert [m.topic for m in later.until(marker)] == [marker]


def test_anonymous_sender_uses_to_and_publisher_annotation(broker, conns) -> None:
    """The null address publishes to each message's ``to``; the container id is the publisher."""
    topic = uid("an") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic)
    snd = conn.create_sender(None)
    snd.send(publish_message(topic, b"via-to", qos=1))
    d = send_expect(snd, publish_message(None, b"nowhere", qos=1))
    assert outcome(d) == (REJECTED, "amqp:invalid-field")
    m, _ = take(conn, rcv)
    rcv.accept()
    assert body_bytes(m) == b"via-to"
    assert annotation(m, "x-opt-mqtt-client-id") == conn.conn.container


def test_released_redelivers_with_unchanged_delivery_count(broker, conns, paho) -> None:
    """Released puts the message back unchanged (delivery-count not incremented, §3.4.4)."""
    topic = uid("rel") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, credit=5)
    paho(broker, uid("p")).publish(topic, b"again", qos=1)
    m, _ = take(conn, rcv)
    assert (body_bytes(m), m.delivery_count) == (b"again", 0)
    rcv.release(delivered=False)                 # RELEASED
    m, _ = take(conn, rcv)
    assert (body_bytes(m), m.delivery_count) == (b"again", 0)
    rcv.release(delivered=True)                  # MODIFIED without delivery-failed
    m, _ = take(conn, rcv)
    assert (body_bytes(m), m.delivery_count) == (b"again", 0)
    rcv.accept()


def test_modified_delivery_failed_increments_delivery_count(broker, conns, paho) -> None:
    """Modified with delivery-failed redelivers with delivery-count + 1 (§3.4.5)."""
    topic = uid("mod") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, credit=5)
    paho(broker, uid("p")).publish(topic, b"retry", qos=1)
    counts = []
    for _ in range(3):
        m, _ = take(conn, rcv)
        counts.append(m.delivery_count)
        rcv.fetcher.unsettled[0].local.failed = True
        rcv.settle(Delivery.MODIFIED)
    m, _ = take(conn, rcv)
    counts.append(m.delivery_count)
    rcv.accept()
    assert counts == [0, 1, 2, 3]


def test_rejected_is_dropped_and_counted(broker, conns, paho) -> None:
    """A Rejected delivery is not redelivered, and $SYS counts it as dropped."""
    topic = uid("rej") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, credit=5)
    pub = paho(broker, uid("p"))
    pub.publish(topic, b"bad", qos=1)
    m, _ = take(conn, rcv)
    assert body_bytes(m) == b"bad"
    rcv.reject()
    pub.publish(topic, b"next", qos=1)
    m, _ = take(conn, rcv)
    rcv.accept()
    assert body_bytes(m) == b"next"
    watcher = paho(broker, uid("sys"))
    watcher.subscribe(("$SYS/broker/messages/dropped", 0))
    for _ in range(20):
        if int(watcher.get().payload) >= 1:
            break
    else:
        raise AssertionError("$SYS/broker/messages/dropped never counted the rejection")


def test_credit_exhaustion(broker, conns, paho) -> None:
    """A receiver with credit 3 gets 3 messages, then nothing until it grants more."""
    topic = uid("cr") + "/t"
    marker = uid("cm") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, credit=None)
    rcv.link.flow(3)
    other = receiver(conn, marker, credit=5)
    pub = paho(broker, uid("p"))
    for i in range(6):
        pub.publish(topic, b"%d" % i, qos=1)
    pub.publish(marker, b"after", qos=1)
    wait_messages(conn, rcv, 3)
    take(conn, other)            # the marker came after the six: nothing more was sent
    assert rcv.fetcher.has_message == 3
    rcv.link.flow(2)
    wait_messages(conn, rcv, 5)
    bodies = [body_bytes(rcv.fetcher.pop()) for _ in range(5)]
    assert bodies == [b"0", b"1", b"2", b"3", b"4"]
    pub.publish(marker, b"after2", qos=1)
    take(conn, other)
    assert rcv.fetcher.has_message == 0
    assert rcv.link.credit == 0


def test_presettled_receiver(broker, conns, paho) -> None:
    """A receiver asking snd-settle-mode settled gets everything pre-settled (QoS 0 semantics)."""
    topic = uid("ps") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, options=Modes(Link.SND_SETTLED))
    assert rcv.link.remote_snd_settle_mode == Link.SND_SETTLED
    paho(broker, uid("p")).publish(topic, b"one", qos=1)
    m, d = take(conn, rcv)
    assert d.settled and body_bytes(m) == b"one"
    assert annotation(m, "x-opt-mqtt-qos") == 0


def test_unsettled_receiver_gets_qos0_unsettled(broker, conns, paho) -> None:
    """A receiver asking snd-settle-mode unsettled gets even QoS 0 unsettled, as it asked."""
    topic = uid("us") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic, options=Modes(Link.SND_UNSETTLED))
    assert rcv.link.remote_snd_settle_mode == Link.SND_UNSETTLED
    paho(broker, uid("p")).publish(topic, b"zero", qos=0)
    m, d = take(conn, rcv)
    assert not d.settled and annotation(m, "x-opt-mqtt-qos") == 0
    rcv.accept()


class _ExactlyOnce(MessagingHandler):  # type: ignore[misc]
    """Sends one message with rcv-settle-mode second and records what it saw."""

    def __init__(self, url: str, topic: str) -> None:
        super().__init__(auto_settle=False)
        self.url, self.topic = url, topic
        self.states: list[int] = []
        self.remote_rcv_mode: int | None = None
        self.settled_by_broker_first = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, self.topic, options=Modes(
            Link.SND_UNSETTLED, Link.RCV_SECOND))

    def on_sendable(self, event: Any) -> None:
        if not self.states and event.sender.credit and not hasattr(self, "sent"):
            self.sent = True
            self.remote_rcv_mode = event.sender.remote_rcv_settle_mode
            event.sender.send(publish_message(None, b"once", qos=2))

    def on_accepted(self, event: Any) -> None:
        self.states.append(Delivery.ACCEPTED)
        self.settled_by_broker_first = event.delivery.settled
        event.delivery.settle()      # the sender settles: now the broker routes it
        event.connection.close()


def test_rcv_settle_mode_second_gives_exactly_once(broker, paho) -> None:
    """rcv-settle-mode second: Accepted unsettled, routed once when the sender settles."""
    topic = uid("eo") + "/t"
    marker = uid("em") + "/t"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2), (marker, 2))
    handler = _ExactlyOnce(f"127.0.0.1:{broker.ports['AMQP']}", topic)
    run_container(handler)
    assert handler.remote_rcv_mode == Link.RCV_SECOND
    assert handler.states == [Delivery.ACCEPTED]
    assert handler.settled_by_broker_first is False
    first = sub.get()
    assert (first.topic, first.payload, first.qos) == (topic, b"once", 2)
    paho(broker, uid("p")).publish(marker, b"end", qos=1)
    assert [m.topic for m in sub.until(marker)] == [marker]


class _WildcardReceiver(MessagingHandler):  # type: ignore[misc]
    """Event-driven receiver: takes ``n`` messages from a filter, then closes."""

    def __init__(self, url: str, address: str, n: int, ready: Any) -> None:
        super().__init__(prefetch=10)
        self.url, self.address, self.n, self.ready = url, address, n, ready
        self.got: list[tuple[str, bytes, Any]] = []

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.ready()

    def on_message(self, event: Any) -> None:
        m = event.message
        self.got.append((m.address, body_bytes(m), annotation(m, "x-opt-mqtt-qos")))
        if len(self.got) == self.n:
            event.connection.close()


def test_event_driven_container_receives_from_mqtt(broker, paho) -> None:
    """proton's event-driven Container receives MQTT messages on a wildcard receiver."""
    import threading

    base = uid("ev")
    attached = threading.Event()
    handler = _WildcardReceiver(f"127.0.0.1:{broker.ports['AMQP']}", f"{base}/#", 2,
                                attached.set)
    pub = paho(broker, uid("p"))

    def publish_when_attached() -> None:
        if attached.wait(TIMEOUT):
            pub.publish(f"{base}/a", b"1", qos=1)
            pub.publish(f"{base}/b/c", b"2", qos=0)

    threading.Thread(target=publish_when_attached, daemon=True).start()
    run_container(handler)
    assert handler.got == [(f"{base}/a", b"1", 1), (f"{base}/b/c", b"2", 0)]


def test_amqp_value_bodies_between_amqp_peers_and_toward_mqtt(broker, conns, paho) -> None:
    """AmqpValue string, binary, map and AmqpSequence bodies are accepted: an AMQP
    receiver gets each as sent, an MQTT subscriber its MQTT form (UTF-8, bytes, JSON)."""
    topic = uid("av") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic)
    sub = paho(broker, uid("avs"))
    sub.subscribe((topic, 1))
    snd = conn.create_sender(topic)
    seq = Message(body=[1, 2, 3])
    seq.inferred = True   # AmqpSequence
    sent = [Message(body="grüße", durable=True), Message(body=b"\x00\x01", durable=False),
            Message(body={"a": 1}), seq]
    for msg in sent:
        assert snd.send(msg).remote_state == ACCEPTED
    got = [take(conn, rcv)[0] for _ in sent]
    rcv.accept()
    assert [m.body for m in got] == ["grüße", b"\x00\x01", {"a": 1}, [1, 2, 3]]
    assert [m.inferred for m in got] == [False, False, False, True]
    # unsettled without the annotation: QoS 1 whatever `durable` says
    assert [annotation(m, "x-opt-mqtt-qos") for m in got] == [1, 1, 1, 1]
    assert [m.payload for m in (sub.get() for _ in sent)] == [
        "grüße".encode(), b"\x00\x01", b'{"a":1}', b"[1,2,3]"]


def test_raw_garbage_closes_only_that_connection(broker, conns) -> None:
    """Hostile bytes after the AMQP header close that connection; other clients carry on."""
    topic = uid("g") + "/t"
    conn = conns(broker)
    rcv = receiver(conn, topic)
    with socket.create_connection(("127.0.0.1", broker.ports["AMQP"]), timeout=TIMEOUT) as s:
        s.sendall(b"AMQP\x00\x01\x00\x00" + os.urandom(64) + b"\xff" * 64)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"AMQP\x00\x01\x00\x00")
    snd = conn.create_sender(topic)
    snd.send(publish_message(None, b"still here", qos=1))
    m, _ = take(conn, rcv)
    rcv.accept()
    assert body_bytes(m) == b"still here"


def test_refused_addresses(broker, conns) -> None:
    """Unknown control addresses and invalid filters are refused with a clear condition."""
    from proton.utils import LinkDetached

    conn = conns(broker)
    with pytest.raises(LinkDetached) as err:
        conn.create_receiver("$mqtt.nothing.here")
    assert err.value.condition == "amqp:not-found"
    with pytest.raises(LinkDetached) as err:
        conn.create_receiver("a/#/b")
    assert err.value.condition == "amqp:invalid-field"
    with pytest.raises(LinkDetached) as err:
        conn.create_sender("a/+")
    assert err.value.condition == "amqp:invalid-field"
    rcv = receiver(conn, uid("ok") + "/t")    # the connection is fine
    assert rcv.link.remote_source.address.endswith("/t")


_ = symbol

"""Unit tests for the MQTT connection state machine: StringTransport, Clock, no reactor.

The transport only records; where a real reactor would call ``connectionLost`` after
``loseConnection``, the tests do it themselves (``Client.lost``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from fakes import ManualStore, NullStore, timers_left
from mqtt_memory import ACCEPTED, Client, Harness, TcpLikeTransport
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqttamqp.mqtt.protocol import ConnectionState, MQTTFactory

EPSILON = 0.001


# --------------------------------------------------------------------------
# CONNECT


def test_connect_gets_connack_bytes() -> None:
    """A valid 3.1.1 CONNECT is answered with exactly 20 02 00 00."""
    h = Harness()
    c = h.client()
    c.send(Connect("MQTT", 4, "c", True, 0))
    assert c.transport.value() == b"\x20\x02\x00\x00"
    assert c.proto.state is ConnectionState.CONNECTED
    assert "mqtt:c" in h.broker.connections
    assert c.transport.producerState == "producing"


def test_connect_31_accepted() -> None:
    """A 3.1 (MQIsdp) CONNECT with a short id is accepted."""
    h = Harness()
    c = h.client()
    assert c.connect("x" * 23, level=3) == [ACCEPTED]
    assert c.proto.version == "3.1"


def test_session_present_on_persistent_reconnect() -> None:
    """Reconnecting to a persistent session answers CONNACK with session present (3.1.1)."""
    h = Harness()
    c1 = h.client()
    assert c1.connect("p", clean=False) == [Connack(False, 0)]
    c1.send(Disconnect())
    c1.lost()
    c2 = h.client()
    assert c2.connect("p", clean=False) == [Connack(True, 0)]


def test_session_present_never_set_for_31() -> None:
    """MQTT 3.1 has no session-present flag: the byte stays 0."""
    h = Harness()
    c1 = h.client()
    c1.connect("p", clean=False, level=3)
    c1.send(Disconnect())
    c1.lost()
    c2 = h.client()
    c2.send(Connect("MQIsdp", 3, "p", False, 0))
    assert c2.transport.value() == b"\x20\x02\x00\x00"


def test_connack_waits_for_session_commit() -> None:
    """CONNACK for a persistent session is sent only after its session record is durable."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0))
    assert c.transport.value() == b""
    assert c.proto.state is ConnectionState.CONNECTING
    assert c.transport.producerState == "paused"
    store.commit_all()
    assert c.received() == [ACCEPTED]
    assert c.transport.producerState == "producing"


def test_packets_pipelined_behind_connect_wait_for_connack() -> None:
    """A PINGREQ sent right behind CONNECT is answered after CONNACK, not before."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0), Pingreq())
    assert c.transport.value() == b""
    store.commit_all()
    assert c.received() == [ACCEPTED, Pingresp()]


def test_unsupported_protocol_level_gets_connack_1() -> None:
    """An unknown protocol level (6) is refused with CONNACK 1 and the socket closed."""
    h = Harness()
    c = h.client()
    c.send(Connect("MQTT", 6, "c", True, 0))
    assert c.received() == [Connack(False, 1)]
    assert not c.open
    c.lost()
    assert timers_left(h.clock) == []


def test_mismatched_protocol_name_and_level_gets_connack_1() -> None:
    """'MQTT' with level 3 is not a protocol we speak: CONNACK 1."""
    h = Harness()
    c = h.client()
    c.send(Connect("MQTT", 3, "c", True, 0))
    assert c.received() == [Connack(False, 1)]
    assert not c.open


def test_31_client_id_longer_than_23_gets_connack_2_when_strict() -> None:
    """With --strict-mqtt31, MQTT 3.1 client ids over 23 characters are refused with
    CONNACK 2 (issue 16, item 8: by default they are accepted)."""
    h = Harness(strict_mqtt31=True)
    c = h.client()
    assert c.connect("x" * 24, level=3) == [Connack(False, 2)]
    assert not c.open
    c.lost()
    assert "x" * 24 not in h.broker.sessions


def test_31_empty_client_id_gets_connack_2() -> None:
    """MQTT 3.1 requires a client id: empty is refused with CONNACK 2."""
    h = Harness()
    c = h.client()
    assert c.connect("", level=3) == [Connack(False, 2)]
    assert not c.open


def test_311_empty_client_id_with_clean_session_gets_generated_id() -> None:
    """3.1.1: an empty id with clean session is accepted and given a unique id."""
    h = Harness()
    c1, c2 = h.client(), h.client()
    assert c1.connect("", clean=True) == [ACCEPTED]
    assert c2.connect("", clean=True) == [ACCEPTED]
    assert c1.proto.client_id and c2.proto.client_id
    assert c1.proto.client_id != c2.proto.client_id
    assert c1.open and c2.open


def test_311_empty_client_id_without_clean_session_gets_connack_2() -> None:
    """3.1.1: an empty id with clean session 0 is refused with CONNACK 2."""
    h = Harness()
    c = h.client()
    assert c.connect("", clean=False) == [Connack(False, 2)]
    assert not c.open


def test_first_packet_not_connect_closes() -> None:
    """A connection whose first packet is not CONNECT is closed without an answer."""
    h = Harness()
    c = h.client()
    c.send(Pingreq())
    assert c.transport.value() == b""
    assert not c.open
    c.lost()
    assert timers_left(h.clock) == []


def test_second_connect_closes_and_fires_will() -> None:
    """A second CONNECT is a protocol violation: the connection closes and its will fires."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = h.client()
    c.connect("c", will=Will("will/c", b"gone", 0, False))
    c.send(Connect("MQTT", 4, "c", True, 0))
    assert c.received() == []
    assert not c.open
    c.lost()
    assert watcher.sent == [("will/c", b"gone", 0, False)]


def test_malformed_packet_closes() -> None:
    """Bytes that are not a valid packet close the connection."""
    h = Harness()
    c = h.client()
    c.connect("c")
    c.proto.dataReceived(b"\x00\x00")
    assert not c.open
    assert h.broker.stats.protocol_errors == 1


def test_max_connections_refuses_extra_socket() -> None:
    """Past max_connections a new socket is aborted at once."""
    h = Harness(max_connections=1)
    c1 = h.client()
    c2 = h.client()
    assert c1.open
    assert c2.transport.disconnecting
    assert h.broker.stats.connections_refused == 1


# --------------------------------------------------------------------------
# timers


def test_connect_timeout_closes_silent_socket() -> None:
    """A socket that sends no CONNECT within connect_timeout is closed; no timer is left."""
    h = Harness()
    c = h.client()
    h.clock.advance(10 - EPSILON)
    assert c.open
    h.clock.advance(2 * EPSILON)
    assert not c.open
    c.lost()   # (the socket closes: the close's grace timer goes with it)
    assert timers_left(h.clock) == []
    c.lost()
    assert timers_left(h.clock) == []
    assert c.proto not in h.factory.opened.all()


def test_connect_cancels_connect_timeout() -> None:
    """After CONNECT (keepalive 0) no timer remains and the connection outlives the timeout."""
    h = Harness()
    c = h.client()
    c.connect("c", keepalive=0)
    assert timers_left(h.clock) == []
    h.clock.advance(1000)
    assert c.open


def test_keepalive_expiry_closes_and_fires_will() -> None:
    """keepalive=10: open at 15 - ε, closed after 15, will published, no delayed call left."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = h.client()
    assert c.connect("c", keepalive=10, will=Will("will/c", b"dead", 1, False)) == [ACCEPTED]
    h.clock.advance(15 - EPSILON)
    assert c.open
    assert watcher.sent == []
    h.clock.advance(2 * EPSILON)
    assert not c.open
    c.lost()
    assert watcher.sent == [("will/c", b"dead", 1, False)]
    assert "c" not in h.broker.sessions
    assert timers_left(h.clock) == []


def test_keepalive_reset_by_activity() -> None:
    """Any packet resets the keepalive: a PINGREQ at t=10 keeps it open until 25."""
    h = Harness()
    c = h.client()
    c.connect("c", keepalive=10)
    h.clock.advance(10)
    c.send(Pingreq())
    assert c.received() == [Pingresp()]
    h.clock.advance(15 - EPSILON)
    assert c.open
    h.clock.advance(2 * EPSILON)
    assert not c.open
    c.lost()
    assert timers_left(h.clock) == []


def test_clean_disconnect_no_will_no_timers() -> None:
    """DISCONNECT closes without the will and leaves no delayed call."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = h.client()
    c.connect("c", keepalive=10, will=Will("will/c", b"dead", 0, False))
    c.send(Disconnect())
    assert not c.open
    c.lost()
    h.clock.advance(100)
    assert watcher.sent == []
    assert "c" not in h.broker.wills
    assert "mqtt:c" not in h.broker.connections
    assert timers_left(h.clock) == []


def test_connection_lost_fires_will_and_cancels_keepalive() -> None:
    """A socket that just drops publishes the will and leaves no keepalive timer."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = h.client()
    c.connect("c", keepalive=30, will=Will("will/c", b"dropped", 0, True))
    c.proto.connectionLost(Failure(ConnectionDone()))
    assert watcher.sent == [("will/c", b"dropped", 0, False)]
    assert timers_left(h.clock) == []


# --------------------------------------------------------------------------
# publish flows and acknowledgement order


def test_qos1_publish_routed_and_acked() -> None:
    """A QoS 1 PUBLISH with nothing to store is routed and PUBACKed at once."""
    h = Harness()
    watcher = h.watcher("t")
    c = h.client()
    c.connect("c")
    c.send(Publish("t", b"m", 1, False, False, 7))
    assert c.received() == [Puback(7)]
    assert watcher.sent == [("t", b"m", 1, False)]


def test_puback_only_after_durable_commit() -> None:
    """A QoS 1 retained PUBLISH is PUBACKed only once its commit has fired."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.connect("c")
    assert store.pending == []
    c.send(Publish("r", b"v", 1, True, False, 1))
    assert c.received() == []
    assert len(store.pending) == 1
    store.commit_all()
    assert c.received() == [Puback(1)]


def test_acks_leave_in_arrival_order() -> None:
    """A PUBACK that needs no commit waits behind an earlier one that does."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.connect("c")
    c.send(Publish("r", b"v", 1, True, False, 1),     # stores a retained message
           Publish("t", b"v", 1, False, False, 2),    # nothing to store
           Publish("t", b"v", 2, False, False, 3))    # nothing to store
    assert c.received() == []
    store.commit_all()
    assert c.received() == [Puback(1), Puback(2), Pubrec(3)]
    c.send(Publish("t", b"v", 1, False, False, 4))
    assert c.received() == [Puback(4)]


def test_suback_waits_for_commit_and_precedes_later_acks() -> None:
    """A persistent SUBSCRIBE's SUBACK waits for its commit; a later PUBACK stays behind it."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0))
    store.commit_all()
    assert c.received() == [ACCEPTED]
    c.send(Subscribe(1, (("a", 1),)), Publish("x", b"v", 1, False, False, 9))
    assert c.received() == []
    store.commit_all()
    assert c.received() == [Suback(1, (1,)), Puback(9)]


def test_qos2_duplicate_before_pubrel_routed_once() -> None:
    """A QoS 2 PUBLISH resent before PUBREL is answered with PUBREC again but routed once."""
    h = Harness()
    watcher = h.watcher("t")
    c = h.client()
    c.connect("c")
    c.send(Publish("t", b"once", 2, False, False, 5))
    c.send(Publish("t", b"once", 2, False, True, 5))
    assert c.received() == [Pubrec(5), Pubrec(5)]
    assert watcher.sent == [("t", b"once", 2, False)]
    c.send(Pubrel(5))
    assert c.received() == [Pubcomp(5)]
    # The id is free again: a new message with it is routed.
    c.send(Publish("t", b"again", 2, False, False, 5))
    assert c.received() == [Pubrec(5)]
    assert [p for _, p, _, _ in watcher.sent] == [b"once", b"again"]


def test_qos2_pubrec_and_pubcomp_wait_for_commit_for_persistent_publisher() -> None:
    """A persistent publisher's PUBREC waits for the inbound id commit, PUBCOMP for its delete."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0))
    store.commit_all()
    c.received()
    c.send(Publish("t", b"v", 2, False, False, 3))
    assert c.received() == []
    store.commit_all()
    assert c.received() == [Pubrec(3)]
    c.send(Pubrel(3))
    assert c.received() == []
    store.commit_all()
    assert c.received() == [Pubcomp(3)]


def test_subscriber_flow_over_mqtt() -> None:
    """A subscriber gets SUBACK, retained (retain=1), then live PUBLISHes; PUBACK frees."""
    h = Harness()
    pub = h.client()
    pub.connect("pub")
    pub.send(Publish("a/r", b"kept", 1, True, False, 1))
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("a/#", 1),)))
    assert sub.received() == [
        Suback(1, (1,)),
        Publish("a/r", b"kept", 1, True, False, 1),
    ]
    pub.send(Publish("a/b", b"live", 2, True, False, 2))
    assert sub.received() == [Publish("a/b", b"live", 1, False, False, 2)]
    session = h.broker.sessions["sub"]
    assert set(session.inflight) == {1, 2}
    sub.send(Puback(1), Puback(2))
    assert session.inflight == {}
    sub.send(Unsubscribe(2, ("a/#",)))
    assert sub.received() == [Unsuback(2)]
    pub.send(Publish("a/b", b"late", 0, False, False, None))
    assert sub.received() == []


def test_qos2_outbound_flow_over_mqtt() -> None:
    """Outbound QoS 2: PUBLISH, client PUBREC → PUBREL, client PUBCOMP frees the id."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 2),)))
    sub.received()
    h.broker.publish(Message("t", b"x", 2, False, "p", 0.0))
    assert sub.received() == [Publish("t", b"x", 2, False, False, 1)]
    sub.send(Pubrec(1))
    assert sub.received() == [Pubrel(1)]
    sub.send(Pubcomp(1))
    assert h.broker.sessions["sub"].inflight == {}


def test_takeover_closes_old_connection_once() -> None:
    """A second CONNECT with the same id closes the first connection and fires its will once."""
    h = Harness()
    watcher = h.watcher("will/#")
    old = h.client()
    old.connect("c", will=Will("will/c", b"old", 0, False))
    new = h.client()
    assert new.connect("c") == [ACCEPTED]
    assert not old.open
    old.lost()
    assert watcher.sent == [("will/c", b"old", 0, False)]
    assert new.open
    assert h.broker.sessions["c"].connection is new.proto
    assert h.broker.connections["mqtt:c"] is new.proto


def test_reconnect_right_after_disconnect_is_listed_and_counted() -> None:
    """DISCONNECT, then the same id connects again before the old socket is gone: the
    new connection is the one listed, and counted once (the old one's loss is a no-op)."""
    h = Harness()
    old = h.client()
    old.connect("c")
    old.send(Disconnect())
    new = h.client()
    assert new.connect("c") == [ACCEPTED]
    old.lost()
    assert h.broker.connections == {"mqtt:c": new.proto}
    assert (h.broker.stats.clients_connected, h.broker.stats.by_protocol["mqtt3.1.1"]) == (1, 1)
    new.send(Disconnect())
    new.lost()
    assert h.broker.connections == {}
    assert (h.broker.stats.clients_connected, h.broker.stats.by_protocol["mqtt3.1.1"]) == (0, 0)


def test_what_one_read_routes_to_a_subscriber_is_one_write_in_order() -> None:
    """Ten QoS 0 PUBLISH in one read reach the subscriber as one transport write, in
    order; its own PINGRESP written in the same read (it pings in a batch of its own)
    stays in order with its deliveries; a publish outside any read is written at once."""
    h = Harness()
    sub, pub = h.client(), h.client()
    sub.connect("sub")
    pub.connect("pub")
    sub.send(Subscribe(1, (("f/#", 0),)))
    assert sub.received() == [Suback(1, (0,))]
    writes: list[bytes] = []
    real_write = sub.transport.write

    def counting(data: bytes) -> None:
        writes.append(data)
        real_write(data)

    sub.transport.write = counting  # type: ignore[method-assign]
    pub.send(*(Publish(f"f/{i}", b"%d" % i, 0, False, False, None) for i in range(10)))
    assert len(writes) == 1
    assert [p.payload for p in sub.received()] == [b"%d" % i for i in range(10)]  # type: ignore[union-attr]
    sub.send(Pingreq(), Publish("f/self", b"s", 0, False, False, None))
    assert sub.received() == [Pingresp(), Publish("f/self", b"s", 0, False, False, None)]
    writes.clear()
    h.broker.publish(Message("f/x", b"x", 0, False))        # no read in progress
    assert len(writes) == 1 and sub.received()[0].payload == b"x"  # type: ignore[union-attr]


def test_batched_output_still_meets_transport_back_pressure() -> None:
    """A SUBSCRIBE matching 3,000 retained QoS 0 messages (about 330 KB) in one read:
    output is handed to the transport in bounded pieces, so its back-pressure marks the
    subscriber congested in time; the retained replay then waits for the transport to
    drain (issue #26: nothing dropped) instead of all of it piling up in one write."""
    h = Harness(congested_qos0_bytes=16 * 1024)
    for i in range(3000):
        h.broker.retained.put(Message(f"r/{i}", b"x" * 100, 0, True))
    proto = h.factory.buildProtocol(None)
    transport = TcpLikeTransport()
    proto.makeConnection(transport)  # type: ignore[no-untyped-call]
    proto.dataReceived(encode(Connect("MQTT", 4, "sub", True, 0)))
    proto.dataReceived(encode(Subscribe(1, (("r/#", 0),))))
    decoder = Decoder()
    decoder.feed(transport.value())
    got = list(decoder)
    assert got[:2] == [ACCEPTED, Suback(1, (0,))]
    assert h.broker.sessions["sub"].dropped == 0 and len(got) - 2 < 3000
    written = sum(len(encode(p)) for p in got[2:])
    assert written <= 64 * 1024 + 16 * 1024 + 2 * 110
    count = len(got) - 2
    for _ in range(100):       # (bounded) the socket drains, and fills again
        transport.clear()
        transport.producer_paused = False
        proto.resumeProducing()
        h.clock.advance(0)
        decoder.feed(transport.value())
        fresh = list(decoder)
        if not fresh:
            break
        count += len(fresh)
    assert count == 3000 and h.broker.sessions["sub"].dropped == 0


def _record_writes(client: Client, log: list[tuple[str, int]], name: str,
                   publisher: Client) -> None:
    """Record each write to ``client``'s transport with what ``publisher`` had been
    given to send by then (its ``bytes_out``: its PUBACK counts once handed out)."""
    real = client.transport.write

    def write(data: bytes) -> None:
        log.append((name, publisher.proto.bytes_out))
        real(data)

    client.transport.write = write  # type: ignore[method-assign]


def test_a_read_of_one_publish_reaches_the_subscriber_before_its_batch_ends() -> None:
    """A read of exactly one PUBLISH: each subscriber's frame is written while the
    PUBLISH is handled, before the publisher's PUBACK is even handed out; a read of two
    PUBLISHes: one write per subscriber at the batch's end, after both PUBACKs."""
    h = Harness()
    a, b, pub = h.client(), h.client(), h.client()
    for c, name in ((a, "a"), (b, "b"), (pub, "pub")):
        c.connect(name)
    for c in (a, b):
        c.send(Subscribe(1, (("t", 1),)))
        assert c.received() == [Suback(1, (1,))]
    log: list[tuple[str, int]] = []
    for c, name in ((a, "a"), (b, "b"), (pub, "pub")):
        _record_writes(c, log, name, pub)
    before = pub.proto.bytes_out
    pub.send(Publish("t", b"1", 1, False, False, 7))
    assert sorted(log) == [("a", before), ("b", before), ("pub", before + 4)]
    assert log[-1][0] == "pub" and pub.received() == [Puback(7)]
    assert [p.payload for p in a.received() + b.received()] == [b"1", b"1"]  # type: ignore[union-attr]
    log.clear()
    before = pub.proto.bytes_out
    pub.send(Publish("t", b"2", 1, False, False, 8), Publish("t", b"3", 1, False, False, 9))
    assert sorted(log) == [("a", before + 8), ("b", before + 8), ("pub", before + 8)]
    assert [p.payload for p in a.received()] == [b"2", b"3"]  # type: ignore[union-attr]


def test_a_publisher_subscribed_to_its_own_topic_gets_one_write() -> None:
    """A read of one PUBLISH that the publisher itself subscribes to: its copy and then
    its PUBACK still leave in one write, at the batch's end."""
    h = Harness()
    c = h.client()
    c.connect("self")
    c.send(Subscribe(1, (("t", 1),)))
    assert c.received() == [Suback(1, (1,))]
    log: list[tuple[str, int]] = []
    _record_writes(c, log, "self", c)
    c.send(Publish("t", b"x", 1, False, False, 5))
    assert len(log) == 1
    got = c.received()
    assert got[0].payload == b"x" and got[1:] == [Puback(5)]  # type: ignore[union-attr]


def _two_subscribers_one_failing(h: Harness, failures: int) -> tuple[Client, Client, Client]:
    """Subscribers ``a`` and ``b`` of ``t`` at QoS 0 and a publisher; ``a``'s first
    ``failures`` transport writes raise."""
    a, b, pub = h.client(), h.client(), h.client()
    for c, name in ((a, "a"), (b, "b"), (pub, "pub")):
        c.connect(name)
    for c in (a, b):
        c.send(Subscribe(1, (("t", 0),)))
        assert c.received() == [Suback(1, (0,))]
    real = a.transport.write
    calls: list[bytes] = []

    def fails(data: bytes) -> None:
        calls.append(data)
        if len(calls) <= failures:
            raise RuntimeError("write failed")
        real(data)

    a.transport.write = fails  # type: ignore[method-assign]
    return a, b, pub


def test_a_failing_output_flush_does_not_strand_other_connections() -> None:
    """If writing one connection's batched output (a read of two PUBLISHes, flushed at
    the batch's end) raises, the others' output of the same batch is still written,
    the failure is counted, and later output keeps flowing."""
    h = Harness()
    a, b, pub = _two_subscribers_one_failing(h, 1)
    pub.send(Publish("t", b"1", 0, False, False, None), Publish("t", b"2", 0, False, False, None))
    assert [p.payload for p in b.received()] == [b"1", b"2"]  # type: ignore[union-attr]
    assert a.received() == [] and h.broker.stats.write_failures == 1
    h.broker.publish(Message("t", b"3", 0, False))
    assert [p.payload for p in b.received()] == [b"3"]  # type: ignore[union-attr]
    assert [p.payload for p in a.received()] == [b"3"]  # type: ignore[union-attr]


def test_a_failing_immediate_send_is_counted_and_logged_once_a_minute(
        log_lines: list[str]) -> None:
    """A read of one PUBLISH whose immediate send to one subscriber raises: the other
    subscriber still gets it, each failure is counted, and one line a minute is logged
    (the next one says how many were held back), not one per delivery."""
    h = Harness()
    a, b, pub = _two_subscribers_one_failing(h, 4)
    # (the failures are the immediate send's, not a batch's flush: the batch's
    # ``output_failed`` asks its own limiter, whose clock says so)
    h.broker._commits._log_limit = LogLimiter(_not_a_batch_flush)

    def failed() -> list[str]:
        return [line for line in log_lines if "writing a connection's output failed" in line]

    for i in range(3):
        pub.send(Publish("t", b"%d" % i, 0, False, False, None))
        assert [p.payload for p in b.received()] == [b"%d" % i]  # type: ignore[union-attr]
    assert a.received() == [] and h.broker.stats.write_failures == 3
    assert len(failed()) == 1 and "(0 more since the last such line)" in failed()[0]
    h.clock.advance(61)
    pub.send(Publish("t", b"3", 0, False, False, None))
    assert len(failed()) == 2 and "(2 more since the last such line)" in failed()[1]
    assert h.broker.stats.write_failures == 4 and a.received() == []
    pub.send(Publish("t", b"4", 0, False, False, None))
    assert [p.payload for p in a.received()] == [b"4"]  # type: ignore[union-attr]


def _not_a_batch_flush() -> float:
    raise AssertionError("a batch's flush failed, not the frame sent at once")


def test_a_failing_flush_past_the_batch_bound_is_counted_and_others_served() -> None:
    """A read of two PUBLISHes whose copies to ``a`` pass ``OUTPUT_BATCH_BYTES`` in the
    batch: the flush at the bound raises; it is counted, nothing escapes into the
    read, and ``b`` still gets both."""
    h = Harness()
    _a, b, pub = _two_subscribers_one_failing(h, 1)
    big = b"z" * 40_000
    pub.send(Publish("t", big, 0, False, False, None), Publish("t", big, 0, False, False, None))
    assert [p.payload for p in b.received()] == [big, big]  # type: ignore[union-attr]
    assert h.broker.stats.write_failures == 1 and h.broker._commits._depth == 0


def test_refusal_connack_is_written_before_the_close() -> None:
    """A CONNACK refusal goes out before the connection closes (the batch's output is
    flushed before loseConnection)."""
    h = Harness()
    c = h.client()
    closing_at_write: list[bool] = []
    real_write = c.transport.write

    def write(data: bytes) -> None:
        closing_at_write.append(c.transport.disconnecting)
        real_write(data)

    c.transport.write = write  # type: ignore[method-assign]
    assert c.connect("", clean=False) == [Connack(False, ConnackCode.IDENTIFIER_REJECTED)]
    assert c.transport.disconnecting
    assert closing_at_write == [False]   # written while the connection was still open


# --------------------------------------------------------------------------
# back-pressure


def test_pause_and_resume_producing_mark_congestion() -> None:
    """pauseProducing makes the link congested (publishers see it); resumeProducing clears it."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.proto.pauseProducing()
    assert sub.proto.congested is True
    assert h.broker.router.congested_for("t") is True
    sub.proto.resumeProducing()
    assert sub.proto.congested is False
    assert h.broker.router.congested_for("t") is False


def test_congested_subscriber_pauses_publisher_until_drained() -> None:
    """A publisher to a congested subscriber stops being read until the subscriber drains."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    pub = h.client()
    pub.connect("pub")
    sub.proto.pauseProducing()
    pub.send(Publish("t", b"1", 1, False, False, 1))
    assert pub.received() == [Puback(1)]
    assert pub.transport.producerState == "paused"
    assert sub.received() == []  # nothing written while the subscriber's socket is full
    sub.proto.resumeProducing()
    assert pub.transport.producerState == "producing"
    assert sub.received() == [Publish("t", b"1", 1, False, False, 1)]


def test_qos0_backlog_counted_while_congested() -> None:
    """QoS 0 written while congested counts toward backlog_bytes; resume resets it."""
    h = Harness()
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 0),)))
    sub.received()
    sub.proto.pauseProducing()
    h.broker.publish(Message("t", b"12345", 0, False, "p", 0.0))
    assert sub.proto.backlog_bytes == len(encode(Publish("t", b"12345")))
    sub.proto.resumeProducing()
    assert sub.proto.backlog_bytes == 0


def test_publisher_paused_by_backpressure_not_dropped_by_keepalive() -> None:
    """A publisher the broker stopped reading (back-pressure) is not dropped by keepalive."""
    h = Harness(stall_timeout=120)
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    pub = h.client()
    pub.connect("pub", keepalive=10, will=Will("will/pub", b"x", 0, False))
    sub.proto.pauseProducing()
    pub.send(Publish("t", b"1", 1, False, False, 1))
    assert pub.transport.producerState == "paused"
    h.clock.advance(60)
    assert pub.open
    sub.proto.resumeProducing()
    assert pub.transport.producerState == "producing"
    h.clock.advance(15 - EPSILON)
    assert pub.open


def test_paused_publisher_resumes_when_its_subscriber_drains() -> None:
    """A paused publisher resumes when its subscriber drains, despite an unrelated backlog."""
    h = Harness(max_inflight=1, max_queued_messages=4)
    slow = h.client()
    slow.connect("slow")
    slow.send(Subscribe(1, (("y", 1),)))
    for _i in range(4):  # 1 in flight, 3 queued: over half the queue bound, never acked
        h.broker.publish(Message("y", b"v", 1, False, "p", 0.0))
    assert h.broker.sessions["slow"].over_high_water()
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 1),)))
    pub = h.client()
    pub.connect("pub")
    sub.proto.pauseProducing()
    pub.send(Publish("t", b"1", 1, False, False, 1))
    assert pub.transport.producerState == "paused"
    sub.proto.resumeProducing()
    assert pub.transport.producerState == "producing"


def test_authentication_failure_refused() -> None:
    """A rejected CONNECT gets CONNACK 5 without a username and 4 with one; no session is made."""
    class DenyAll:
        def authenticate(self, credentials: Any) -> bool:
            return False
    for username, code in ((None, 5), ("u", 4)):
        clock = Clock()
        broker = Broker(clock, NullStore(), Limits(sys_interval=0), authenticator=DenyAll())
        c = Client(MQTTFactory(broker, clock))
        c.send(Connect("MQTT", 4, "c", True, 0, None, username, None))
        assert c.received() == [Connack(False, code)]
        assert not c.open
        assert broker.sessions == {}
        c.lost()
        assert timers_left(clock) == []


def test_authenticator_error_gives_connack_3() -> None:
    """An authenticator that fails gets CONNACK 3 (server unavailable) and a close."""
    class Broken:
        def authenticate(self, credentials: Any) -> bool:
            raise RuntimeError("user database down")
    clock = Clock()
    broker = Broker(clock, NullStore(), Limits(sys_interval=0), authenticator=Broken())
    c = Client(MQTTFactory(broker, clock))
    c.send(Connect("MQTT", 4, "c", True, 0))
    assert c.received() == [Connack(False, 3)]
    assert not c.open
    assert broker.sessions == {}


def test_failed_session_commit_refuses_without_publishing_will() -> None:
    """A failed CONNECT commit gives CONNACK 3; the never-accepted will is not published."""
    store = ManualStore()
    h = Harness(store)
    watcher = h.watcher("will/#")
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0, Will("will/p", b"never", 0, False)))
    _, d = store.pending.pop(0)
    d.errback(Failure(RuntimeError("disk full")))
    assert c.received() == [Connack(False, 3)]
    assert not c.open
    c.lost()
    assert watcher.sent == []
    assert "p" not in h.broker.wills


def test_takeover_leaves_only_new_connection_timers() -> None:
    """After takeover the old connection's keepalive timer is gone."""
    h = Harness()
    old = h.client()
    old.connect("c", keepalive=10)
    new = h.client()
    new.connect("c", keepalive=0)
    old.lost()
    assert timers_left(h.clock) == []
    h.clock.advance(100)
    assert new.open


def test_persistent_inbound_qos2_dedup_survives_reconnect() -> None:
    """A QoS 2 PUBLISH resent after a persistent reconnect (before PUBREL) is routed once."""
    h = Harness()
    watcher = h.watcher("t")
    c1 = h.client()
    c1.connect("p", clean=False)
    c1.send(Publish("t", b"once", 2, False, False, 5))
    assert c1.received() == [Pubrec(5)]
    c1.proto.connectionLost(Failure(ConnectionDone()))
    c2 = h.client()
    assert c2.connect("p", clean=False) == [Connack(True, 0)]
    c2.send(Publish("t", b"once", 2, False, True, 5))
    assert c2.received() == [Pubrec(5)]
    c2.send(Pubrel(5))
    assert c2.received() == [Pubcomp(5)]
    assert watcher.sent == [("t", b"once", 2, False)]


def test_publisher_never_paused_for_its_own_session() -> None:
    """A client publishing to its own QoS 1 subscription keeps being read (its PUBACKs
    are what drains that queue): no self-deadlock."""
    h = Harness(max_inflight=1, max_queued_messages=4)
    c = h.client()
    c.connect("self")
    c.send(Subscribe(1, (("t", 1),)))
    for pid in range(1, 9):
        c.send(Publish("t", b"x", 1, False, False, pid))
    assert c.transport.producerState == "producing"
    delivered = [p for p in c.received() if isinstance(p, Publish)]
    assert len(delivered) == 1  # window 1: the rest wait for this client's PUBACKs
    c.send(Puback(delivered[0].packet_id or 0))
    assert [p for p in c.received() if isinstance(p, Publish)]  # and they flow again


def test_stalled_subscriber_stops_slowing_publishers() -> None:
    """A subscriber that acknowledges nothing pauses a publisher for stall_timeout at
    most; afterwards it no longer slows anyone until it makes progress."""
    h = Harness(max_inflight=1, max_queued_messages=4, stall_timeout=2.0)
    stuck = h.client()
    stuck.connect("stuck")
    stuck.send(Subscribe(1, (("t", 1),)))
    pub = h.client()
    pub.connect("pub")
    for pid in range(1, 5):  # 1 in flight + 3 queued: past half of the bound of 4
        pub.send(Publish("t", b"x", 1, False, False, pid))
    assert pub.transport.producerState == "paused"
    h.clock.advance(2.0 - EPSILON)
    assert pub.transport.producerState == "paused"
    h.clock.advance(2 * EPSILON)
    assert pub.transport.producerState == "producing"
    assert h.broker.sessions["stuck"].stalled
    for pid in range(4, 20):  # no longer paused; the stuck queue drops at its bound
        pub.send(Publish("t", b"x", 1, False, False, pid))
    assert pub.transport.producerState == "producing"
    assert h.broker.sessions["stuck"].dropped > 0
    first = next(p for p in stuck.received() if isinstance(p, Publish))
    stuck.send(Puback(first.packet_id or 0))  # progress: it counts again
    assert not h.broker.sessions["stuck"].stalled
    assert timers_left(h.clock) == []  # no pause timer left behind


def test_duplicate_qos2_pubrec_waits_for_pending_commit() -> None:
    """A DUP resend of a QoS 2 PUBLISH whose first copy is not yet stored gets its
    PUBREC only after that commit (and is not routed twice)."""
    store = ManualStore()
    h = Harness(store)
    watcher = h.watcher("t")
    c = h.client()
    c.connect("p", clean=False)
    store.commit_all()
    c.received()
    c.send(Publish("t", b"x", 2, False, False, 7))
    c.send(Publish("t", b"x", 2, False, True, 7))
    assert c.received() == []
    store.commit_all()
    assert c.received() == [Pubrec(7), Pubrec(7)]
    assert len(watcher.sent) == 1


def test_failed_qos2_commit_lets_the_retry_be_routed() -> None:
    """If the commit holding a QoS 2 packet id fails, the client's retry is routed again."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.connect("p", clean=False)
    store.commit_all()
    c.send(Publish("t", b"x", 2, False, False, 7))
    session = h.broker.sessions["p"]
    assert session.inbound_seen(7)
    store.pending[0][1].errback(Failure(RuntimeError("disk full")))
    assert not session.inbound_seen(7)


def test_pipelining_past_pending_ack_bound_pauses_reading() -> None:
    """More than MAX_PENDING_ACKS acknowledgements waiting on storage stop reading the
    client; they resume once commits catch up."""
    from mqttamqp.mqtt.protocol import MAX_PENDING_ACKS
    store = ManualStore()
    h = Harness(store, max_queued_messages=5000)
    sub = h.client()
    sub.connect("s", clean=False)
    store.commit_all()
    sub.send(Subscribe(1, (("t", 1),)))
    store.commit_all()
    pub = h.client()
    pub.connect("p")
    for pid in range(1, MAX_PENDING_ACKS + 2):
        pub.send(Publish("t", b"x", 1, False, False, pid))
    assert pub.transport.producerState == "paused"
    store.commit_all()
    assert pub.transport.producerState == "producing"
    assert len([p for p in pub.received() if isinstance(p, Puback)]) == MAX_PENDING_ACKS + 1


class _Recorded:
    """A recorder that keeps the events it is told about."""

    records_messages = True

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, dict[str, Any]]] = []

    def message(self, *args: Any) -> None:
        pass

    def event(self, timestamp: float, kind: str, client_id: str | None, **fields: Any) -> None:
        self.events.append((kind, client_id, fields))

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        self.event(timestamp, kind, client_id, **dict(zip(names, values, strict=True)))

    def stats(self) -> dict[str, int]:
        return {}


def test_keepalive_expiry_is_recorded_as_such_when_the_client_is_back_before_the_socket_closes(
        ) -> None:
    """A connection closed for keepalive is recorded with that cause at once, even when
    the client reconnects before its old socket has finished closing (half-open peer)."""
    recorded = _Recorded()
    h = Harness()
    h.broker = Broker(h.clock, h.store, Limits(sys_interval=0), recorder=recorded)
    h.factory = MQTTFactory(h.broker, h.clock)
    old = h.client()
    old.connect("c", keepalive=10)
    h.clock.advance(16)
    assert not old.open                      # closing, but connectionLost has not come
    new = h.client()
    assert new.connect("c") == [ACCEPTED]
    old.lost()
    disconnects = [f["reason"] for kind, cid, f in recorded.events
                   if kind == "disconnect" and cid == "c"]
    assert disconnects == ["keepalive"]


class FileDescriptorLikeTransport(StringTransport):
    """Calls the producer's pauseProducing on *every* write while more than ``buffer``
    bytes are held, as Twisted's FileDescriptor does (not once per congestion)."""

    buffer = 64 * 1024

    def write(self, data: bytes) -> None:
        super().write(data)
        if self.producer is not None and self.streaming and len(self.value()) > self.buffer:
            self.producer.pauseProducing()  # type: ignore[attr-defined]


def test_qos0_to_a_subscriber_that_stops_reading_is_bounded() -> None:
    """A QoS 0 subscriber that stops reading holds at most about congested_qos0_bytes past
    the transport's buffer; the rest is dropped and counted, even though the transport
    calls pauseProducing on every write (issue 10, item 1)."""
    h = Harness(congested_qos0_bytes=100 * 1024)
    proto = h.factory.buildProtocol(None)
    transport = FileDescriptorLikeTransport()
    proto.makeConnection(transport)  # type: ignore[no-untyped-call]
    proto.dataReceived(encode(Connect("MQTT", 4, "sub", True, 0)))
    proto.dataReceived(encode(Subscribe(1, (("t", 0),))))
    transport.clear()
    payload = b"x" * 1000
    for _ in range(2000):                       # about 2 MB offered
        h.broker.publish(Message("t", payload, 0, False, "p", 0.0))
    held = len(transport.value())
    assert held <= FileDescriptorLikeTransport.buffer + 100 * 1024 + 2 * 1024
    assert h.broker.sessions["sub"].dropped == 2000 - held // len(
        encode(Publish("t", payload)))


# --------------------------------------------------------------------------
# Issue 16, item 6: inbound QoS 2 is forwarded only after the publisher's PUBREC


def _persistent_publisher(h: Harness, store: ManualStore, client_id: str = "p") -> Client:
    c = h.client()
    c.send(Connect("MQTT", 4, client_id, False, 0))
    store.commit_all()
    assert c.received() == [ACCEPTED]
    return c


def test_qos2_forwarded_after_pubrec_and_stored_with_the_packet_id() -> None:
    """Nothing is forwarded before the commit; the commit holds the inbound packet id
    and the persistent subscriber's copy together; PUBREC goes out, then the copies."""
    from mqttamqp.core.persistence import PutInboundQos2, PutQueued
    store = ManualStore()
    h = Harness(store)
    watcher = h.watcher("t")
    sub = h.client()
    sub.send(Connect("MQTT", 4, "s", False, 0), Subscribe(1, (("t", 2),)))
    store.commit_all()
    assert sub.received() == [ACCEPTED, Suback(1, (2,))]
    pub = _persistent_publisher(h, store)
    pub.send(Publish("t", b"v", 2, False, False, 3))
    assert pub.received() == [] and sub.received() == [] and watcher.sent == []
    ops, d = store.pending.pop(0)
    assert any(isinstance(op, PutInboundQos2) and op.packet_id == 3 for op in ops)
    assert any(isinstance(op, PutQueued) and op.client_id == "s" for op in ops)
    order: list[str] = []
    pub.transport.write = lambda data: order.append("pubrec")  # type: ignore[method-assign]
    watcher.send_publish = lambda *a: order.append("forward")  # type: ignore[method-assign]
    d.callback(None)
    assert order == ["pubrec", "forward"]
    assert sub.received() == [Publish("t", b"v", 2, False, False, 1)]


def test_qos2_committed_message_is_forwarded_when_publisher_is_gone() -> None:
    """The publisher's socket closes before the commit: PUBREC can never go out, but
    the message is committed, so it is still forwarded (exactly once)."""
    store = ManualStore()
    h = Harness(store)
    watcher = h.watcher("t")
    pub = _persistent_publisher(h, store)
    pub.send(Publish("t", b"v", 2, False, False, 3))
    pub.proto.connectionLost(Failure(ConnectionDone()))
    assert watcher.sent == []
    store.commit_all()
    assert watcher.sent == [("t", b"v", 2, False)]


def test_qos2_failed_commit_forwards_nothing_and_frees_the_queue() -> None:
    """The commit fails: no PUBREC, the publisher is closed, no copy is ever forwarded,
    and the subscriber's queue is not blocked behind the withdrawn copy."""
    store = ManualStore()
    h = Harness(store)
    watcher = h.watcher("t")
    pub = _persistent_publisher(h, store)
    pub.send(Publish("t", b"lost", 2, False, False, 3))
    _, d = store.pending.pop(0)
    d.errback(Failure(RuntimeError("disk full")))
    assert pub.received() == [] and not pub.open
    other = h.client()
    other.connect("o")
    other.send(Publish("t", b"next", 1, False, False, 1))
    store.commit_all()
    assert watcher.sent == [("t", b"next", 1, False)]
    assert h.broker.sessions["watcher"].queue == deque()


def test_qos2_pubrec_waits_behind_earlier_acks_and_forward_waits_for_it() -> None:
    """A clean publisher's QoS 2 needs no commit of its own, but its PUBREC waits
    behind a PUBACK still committing: the forward waits for the PUBREC."""
    store = ManualStore()
    h = Harness(store)
    sub = h.client()
    sub.send(Connect("MQTT", 4, "s", False, 0), Subscribe(1, (("q1", 1),)))
    store.commit_all()
    sub.received()
    watcher = h.watcher("q2")
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("q1", b"a", 1, False, False, 1), Publish("q2", b"b", 2, False, False, 2))
    assert pub.received() == [] and watcher.sent == []
    store.commit_all()
    assert pub.received() == [Puback(1), Pubrec(2)]
    assert watcher.sent == [("q2", b"b", 2, False)]


def test_a_delivery_counts_exactly_as_the_delivery_meter_counts() -> None:
    """The MQTT delivery path (``DeliveryMeter.delivered`` inlined there for speed)
    counts messages, bytes and the 1-in-1,024 latency sample as the meter does; the
    bytes of a socket read and of a control packet (``received_bytes``,
    ``sent_bytes``, inlined too) count as well."""
    from mqttamqp.adapter.meter import DeliveryMeter
    from mqttamqp.core.stats import BrokerStats

    h = Harness()
    h.clock.advance(1000.0)
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", 0),)))
    sub.received()
    pub = h.client()
    pub.connect("pub")
    stats = h.broker.stats
    stats.seconds = lambda: 1001.0
    twin = BrokerStats(seconds=lambda: 1001.0, messages_sent=stats.messages_sent)
    sent, sent_bytes, samples = stats.messages_sent, stats.bytes_sent, stats.deliver_latency.count
    meter = DeliveryMeter(twin)
    for n in range(1100):
        pub.send(Publish("t", b"%d" % n))
    delivered = sub.received()
    assert len(delivered) == 1100
    for packet in delivered:
        meter.delivered(1000.0, len(encode(packet)))
    assert stats.messages_sent - sent == twin.messages_sent - sent == 1100
    assert stats.bytes_sent - sent_bytes == twin.bytes_sent
    assert stats.deliver_latency.count - samples == twin.deliver_latency.count >= 1
    assert stats.deliver_latency.total == twin.deliver_latency.total
    received = stats.bytes_received
    pub.send(Publish("t", b"q", 1, False, False, 9))
    assert pub.received() == [Puback(9)]
    sub.received()
    assert stats.bytes_received - received == len(encode(Publish("t", b"q", 1, False, False, 9)))
    assert stats.bytes_sent - sent_bytes - twin.bytes_sent == len(encode(Puback(9))) + len(
        encode(Publish("t", b"q")))


def test_mqtt311_publish_acknowledgements_are_plain_whatever_the_verdict() -> None:
    """3.1.1's acknowledgement rule (its one home, ``flows``): QoS 1 gets a plain
    2-byte PUBACK even when a subscriber's queue bound dropped the message, QoS 2 a
    PUBREC that opens the gate (the subscriber gets the message after it)."""
    h = Harness(max_inflight=1, max_queued_messages=1)
    full = h.client()
    full.connect("full")
    full.send(Subscribe(1, (("t", 1),)))
    for _ in range(2):   # one in flight, one queued: the bound of 1 is reached
        h.broker.publish(Message("t", b"v", 1, False, "p", 0.0))
    full.received()
    pub = h.client()
    pub.connect("pub")
    pub.transport.clear()
    pub.send(Publish("t", b"x", 1, False, False, 5))
    assert pub.transport.value() == b"\x40\x02\x00\x05"
    assert h.broker.sessions["full"].dropped == 1
    h = Harness()   # (the publisher above is paused for the full subscriber)
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("q", 2),)))
    sub.received()
    pub = h.client()
    pub.connect("pub")
    pub.transport.clear()
    pub.send(Publish("q", b"y", 2, False, False, 6))
    assert pub.transport.value() == b"\x50\x02\x00\x06"
    assert [(p.payload, p.qos) for p in sub.received() if isinstance(p, Publish)] == [
        (b"y", 2)]


def test_a_closed_connection_that_does_not_close_is_cut_after_the_close_grace() -> None:
    """--close-grace (here 3 s): a connection the broker closed whose client reads
    nothing is still there just before, cut then; counted
    ($SYS/broker/limits/close_grace) and said in one line."""
    from loglines import LogLines

    class Recording(StringTransport):
        aborted = 0

        def abortConnection(self) -> None:
            self.aborted += 1
            super().abortConnection()

    h = Harness(close_grace=3.0)
    c = h.client()
    c.transport = Recording()
    c.proto.makeConnection(c.transport)  # type: ignore[no-untyped-call]
    c.connect("c")
    with LogLines("--close-grace") as lines:
        c.send(Connect("MQTT", 4, "c", True, 0))   # (a protocol violation: closed)
        assert not c.open
        h.clock.advance(3.0 - 1e-6)
        assert c.transport.aborted == 0
        h.clock.advance(2e-6)
    assert c.transport.aborted == 1
    assert h.broker.stats.limits.get("close_grace") == 1
    assert len(lines) == 1 and "MQTT connection of c" in lines[0] and "3 s" in lines[0]

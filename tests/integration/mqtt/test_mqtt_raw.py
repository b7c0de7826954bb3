"""MQTT 3.1 / 3.1.1 at the byte level: a raw-socket client against the real broker.

Covers what a library client cannot send or would hide: malformed and forbidden
packets (each closes only the offender and fires its will), the exact CONNACK
codes and session-present flag, the exact QoS 1/2 flows and packet ids, inbound
QoS 2 de-duplication, the outbound in-flight window, redelivery with DUP in
original order, keepalive and connect timeouts, and the limits (connections,
packet size, queued messages, session expiry) with their counters.

``RawClient`` and ``uid`` live in ``support/rawclient.py``.  Every wait is
a read on the socket with a deadline; a wait that must *not* see anything
(``assert_silent``) is a bounded read that has to time out.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

import pytest
from rawclient import (
    TIMEOUT,
    RawClient,
    closed_at_once,
    frame,
    mstr,
    raw_connect,
    u16,
    uid,
)

from mqttamqp.mqtt.codec import encode, encode_remaining_length
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Will,
)

# Against a broker and through a gateway in front of one (the folder conftest).
pytestmark = [pytest.mark.timeout(60), pytest.mark.through_gateway]



# -- hand-built packets ------------------------------------------------------------


# ==================================================================================
# CONNECT and CONNACK


@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTX", 4),
                                        ("MQIsdp", 5)])
def test_unknown_protocol_gets_connack_1_then_close(sockets, name: str, level: int) -> None:
    """An unknown protocol name/level combination is answered with CONNACK 1 and closed."""
    c = sockets()
    c.send(raw_connect(name, level, uid("p")))
    got = c.wait_closed()
    assert len(got) == 1 and isinstance(got[0], Connack), got
    assert got[0].return_code == 1


def test_mqtt5_connect_is_accepted(sockets) -> None:
    """An MQTT 5 CONNECT (with a properties block) gets an MQTT 5 CONNACK 0 with the
    broker's properties (before issue 11 it was refused with CONNACK 1)."""
    c = sockets(level=5)
    # MQTT 5: after keepalive a properties length (0), then the client id.
    c.send(frame(0x10, mstr("MQTT") + bytes((5, 0x02)) + u16(60) + b"\x00" + mstr("v5client")))
    ack = c.recv()
    assert isinstance(ack, Connack) and ack.return_code == 0, ack
    assert ack.properties is not None and ack.properties.receive_maximum


@pytest.mark.parametrize("length,code", [(0, 2), (24, 0), (1, 0), (23, 0)])
def test_mqtt31_client_id_length(sockets, length: int, code: int) -> None:
    """MQTT 3.1 accepts client ids of 1 character or more and answers CONNACK 2 to an
    empty one (ids over 23 characters got CONNACK 2 before issue 16, item 8; with
    --strict-mqtt31 they still do: test_conformance_mqtt)."""
    c = sockets(level=3)
    client_id = (uid("i") + "x" * 30)[:length]
    ack = c.connect(client_id)
    assert ack.return_code == code
    assert ack.session_present is False
    if code:
        assert c.wait_closed() == []
    else:
        c.send(Pingreq())
        assert isinstance(c.recv(), Pingresp)


def test_mqtt311_long_client_id_accepted(sockets) -> None:
    """MQTT 3.1.1 servers may accept ids longer than 23 characters; this one does."""
    c = sockets()
    assert c.connect("long-" + uuid.uuid4().hex * 2).return_code == 0


def test_mqtt311_empty_client_id_with_clean_session_is_accepted(sockets) -> None:
    """3.1.1: an empty client id with clean session gets a generated id and works."""
    c = sockets()
    ack = c.connect("", clean=True)
    assert ack.return_code == 0 and ack.session_present is False
    topic = uid("e") + "/t"
    assert c.subscribe((topic, 1)) == (1,)
    c.publish(topic, b"self", 1)
    msg = c.receive_acked()
    assert (msg.topic, msg.payload) == (topic, b"self")


def test_two_empty_client_ids_get_distinct_sessions(sockets) -> None:
    """Two clients with empty ids do not take each other over."""
    a, b = sockets(), sockets()
    assert a.connect("").return_code == 0
    assert b.connect("").return_code == 0
    for c in (a, b):
        c.send(Pingreq())
        assert isinstance(c.recv(), Pingresp)


def test_mqtt311_empty_client_id_without_clean_session_gets_connack_2(sockets) -> None:
    """3.1.1: an empty client id without clean session is refused with CONNACK 2."""
    c = sockets()
    ack = c.connect("", clean=False)
    assert ack.return_code == 2
    assert c.wait_closed() == []


def test_session_present_flag_mqtt311(sockets) -> None:
    """3.1.1 CONNACK says whether a persistent session was resumed."""
    cid = uid("s")
    c = sockets()
    assert c.connect(cid, clean=False).session_present is False
    c.disconnect()
    c = sockets()
    ack = c.connect(cid, clean=False)
    assert (ack.return_code, ack.session_present) == (0, True)
    c.disconnect()
    c = sockets()
    assert c.connect(cid, clean=True).session_present is False  # discards the session
    c.disconnect()
    c = sockets()
    assert c.connect(cid, clean=False).session_present is False
    c.disconnect()


def test_mqtt31_connack_has_no_session_present_flag(sockets) -> None:
    """MQTT 3.1 has no session-present bit: the first CONNACK byte stays 0 on resume."""
    cid = uid("s")
    c = sockets(level=3)
    assert c.connect(cid, clean=False).return_code == 0
    c.disconnect()
    c = sockets(level=3)
    c.send(raw_connect("MQIsdp", 3, cid, flags=0))
    c.sock.settimeout(TIMEOUT)
    data = b""
    while len(data) < 4:
        chunk = c.sock.recv(4 - len(data))
        assert chunk, "closed before CONNACK"
        data += chunk
    assert data == b"\x20\x02\x00\x00"


@pytest.mark.parametrize("bad", [
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, flags=0x03), id="reserved-flag-bit-0"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, flags=0x1E,
                                         tail=mstr("w/t") + mstr(b"x")), id="will-qos-3"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, flags=0x0A), id="will-qos-without-flag"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, flags=0x42, tail=mstr(b"pw")),
                 id="password-without-username"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid.encode() + b"\xff"), id="id-bad-utf8"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid.encode() + b"\x00"), id="id-with-nul"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, tail=b"junk"), id="trailing-bytes"),
    pytest.param(lambda cid: raw_connect("MQTT", 4, cid, flags=0x06, tail=mstr("w/+")
                                         + mstr(b"x")), id="will-topic-wildcard"),
])
def test_malformed_connect_is_closed_without_connack(sockets, bad) -> None:
    """A malformed CONNECT closes the socket without any CONNACK."""
    c = sockets()
    c.send(bad(uid("m")))
    assert c.wait_closed() == []


@pytest.mark.parametrize("first", [
    pytest.param(b"\xc0\x00", id="PINGREQ"),
    pytest.param(frame(0x30, mstr("a/b") + b"x"), id="PUBLISH"),
    pytest.param(frame(0x82, u16(1) + mstr("a/b") + b"\x00"), id="SUBSCRIBE"),
    pytest.param(b"\xe0\x00", id="DISCONNECT"),
])
def test_first_packet_not_connect_is_closed(sockets, first: bytes) -> None:
    """A connection whose first packet is not CONNECT is closed with no answer."""
    c = sockets()
    c.send(first)
    assert c.wait_closed() == []


# ==================================================================================
# Protocol violations after CONNECT: the offender is closed, its will fires, others
# are undisturbed.


def _v(level: int, make: Callable[[str], bytes], name: str):  # type: ignore[no-untyped-def]
    return pytest.param(level, make, id=f"{'3.1' if level == 3 else '3.1.1'}-{name}")


VIOLATIONS = [
    _v(4, lambda t: frame(0x80, u16(1) + mstr(t) + b"\x00"), "subscribe-reserved-flags"),
    _v(4, lambda t: frame(0xA0, u16(1) + mstr(t)), "unsubscribe-reserved-flags"),
    _v(4, lambda t: frame(0x60, u16(1)), "pubrel-reserved-flags"),
    _v(4, lambda t: b"\xc1\x00", "pingreq-reserved-flags"),
    _v(4, lambda t: b"\xe2\x00", "disconnect-reserved-flags"),
    _v(4, lambda t: frame(0x42, u16(1)), "puback-reserved-flags"),
    _v(4, lambda t: frame(0x36, mstr(t) + u16(1) + b"x"), "publish-qos-3"),
    _v(3, lambda t: frame(0x36, mstr(t) + u16(1) + b"x"), "publish-qos-3"),
    _v(4, lambda t: frame(0x38, mstr(t) + b"x"), "publish-qos-0-with-dup"),
    _v(4, lambda t: frame(0x32, mstr(t) + u16(0) + b"x"), "publish-packet-id-0"),
    _v(4, lambda t: frame(0x34, mstr(t) + u16(0) + b"x"), "publish-qos2-packet-id-0"),
    _v(4, lambda t: frame(0x82, u16(0) + mstr(t) + b"\x00"), "subscribe-packet-id-0"),
    _v(4, lambda t: frame(0xA2, u16(0) + mstr(t)), "unsubscribe-packet-id-0"),
    _v(4, lambda t: frame(0x40, u16(0)), "puback-packet-id-0"),
    _v(4, lambda t: frame(0x30, mstr(t + "/+") + b"x"), "publish-topic-plus"),
    _v(4, lambda t: frame(0x30, mstr(t + "/#") + b"x"), "publish-topic-hash"),
    _v(3, lambda t: frame(0x30, mstr(t + "/+") + b"x"), "publish-topic-plus"),
    _v(4, lambda t: frame(0x30, mstr("") + b"x"), "publish-empty-topic"),
    _v(3, lambda t: frame(0x30, mstr("") + b"x"), "publish-empty-topic"),
    _v(4, lambda t: frame(0x30, mstr(t.encode() + b"/\xc3\x28") + b"x"), "publish-topic-bad-utf8"),
    _v(3, lambda t: frame(0x30, mstr(t.encode() + b"/\xff") + b"x"), "publish-topic-bad-utf8"),
    _v(4, lambda t: frame(0x30, mstr(t.encode() + b"/\xed\xa0\x80") + b"x"),
       "publish-topic-utf16-surrogate"),
    _v(4, lambda t: frame(0x30, mstr(t.encode() + b"/\x00") + b"x"), "publish-topic-nul"),
    _v(4, lambda t: frame(0x82, u16(1) + mstr(t.encode() + b"\xff") + b"\x00"),
       "subscribe-filter-bad-utf8"),
    _v(4, lambda t: frame(0x82, u16(1) + mstr(t.encode() + b"\x00") + b"\x00"),
       "subscribe-filter-nul"),
    _v(4, lambda t: frame(0x82, u16(1)), "subscribe-no-topics"),
    _v(3, lambda t: frame(0x82, u16(1)), "subscribe-no-topics"),
    _v(4, lambda t: frame(0xA2, u16(1)), "unsubscribe-no-topics"),
    _v(4, lambda t: frame(0x82, u16(1) + mstr(t) + b"\x03"), "subscribe-qos-3"),
    _v(4, lambda t: frame(0x82, u16(1) + mstr(t)), "subscribe-missing-qos"),
    _v(4, lambda t: raw_connect("MQTT", 4, "again"), "second-connect"),
    _v(3, lambda t: raw_connect("MQIsdp", 3, "again"), "second-connect"),
    _v(4, lambda t: b"\x20\x02\x00\x00", "connack-from-client"),
    _v(4, lambda t: frame(0x90, u16(1) + b"\x00"), "suback-from-client"),
    _v(4, lambda t: b"\xd0\x00", "pingresp-from-client"),
    _v(4, lambda t: b"\x00\x00", "reserved-type-0"),
    _v(4, lambda t: b"\xf0\x00", "reserved-type-15"),
    _v(4, lambda t: b"\x30\xff\xff\xff\xff\x01", "remaining-length-5-bytes"),
    _v(4, lambda t: frame(0x40, u16(1) + b"\x00"), "puback-wrong-length"),
    _v(4, lambda t: frame(0x30, b"\x00"), "publish-too-short"),
    _v(4, lambda t: frame(0x30, u16(40) + b"abc"), "publish-topic-past-end"),
]


@pytest.mark.parametrize("level,make", VIOLATIONS)
def test_violation_closes_only_the_offender_and_fires_its_will(broker, raw, level: int,
                                                              make) -> None:
    """A protocol violation closes that connection with no reply and a logged reason,
    publishes its will (QoS 1) and leaves other clients working."""
    base = uid("v")
    observer = raw(uid("o"))
    assert observer.subscribe((f"{base}/will", 1), (f"{base}/live", 0)) == (1, 0)
    bystander = raw(uid("b"))
    victim_id = uid("x")
    victim = raw(victim_id, level=level, will=Will(f"{base}/will", b"gone", 1, False))
    victim.send(make(f"{base}/topic"))
    assert victim.wait_closed() == []
    broker.wait_for_line(r"protocol error from " + re.escape(victim_id) + r" .*: \S.*closing",
                         timeout=TIMEOUT)
    will = observer.receive_acked()
    assert (will.topic, will.payload, will.qos, will.retain) == (f"{base}/will", b"gone", 1, False)
    bystander.publish(f"{base}/live", b"still here", 0)
    live = observer.receive()
    assert (live.topic, live.payload) == (f"{base}/live", b"still here")


# ==================================================================================
# Exact flows


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_exact_flow_both_directions(raw, level: int, qos: int) -> None:
    """PUBLISH at each QoS runs the full flow inbound (PUBACK / PUBREC-PUBREL-PUBCOMP with
    the same id) and outbound (the subscriber sees the QoS and completes the flow)."""
    topic = uid("f") + "/t"
    sub = raw(uid("s"), level=level)
    assert sub.subscribe((topic, 2)) == (2,)
    pub = raw(uid("p"), level=level)
    pid = 0x1234
    if qos:
        pub.send(Publish(topic, b"m1", qos, False, False, pid))
        first = pub.recv()
        assert first == (Puback(pid) if qos == 1 else Pubrec(pid))
        if qos == 2:
            pub.send(Pubrel(pid))
            assert pub.recv() == Pubcomp(pid)
    else:
        pub.send(Publish(topic, b"m1"))
    msg = sub.recv()
    assert isinstance(msg, Publish)
    assert (msg.topic, msg.payload, msg.qos, msg.retain, msg.dup) == (topic, b"m1", qos, False,
                                                                       False)
    if qos == 0:
        assert msg.packet_id is None
    elif qos == 1:
        sub.send(Puback(msg.packet_id))  # type: ignore[arg-type]
    else:
        sub.send(Pubrec(msg.packet_id))  # type: ignore[arg-type]
        assert sub.recv() == Pubrel(msg.packet_id)  # type: ignore[arg-type]
        sub.send(Pubcomp(msg.packet_id))  # type: ignore[arg-type]
    # The exchange is over: the next message is new, not a redelivery.
    pub.publish(topic, b"m2", qos)
    nxt = sub.recv()
    assert isinstance(nxt, Publish) and nxt.payload == b"m2" and nxt.dup is False
    pub.send(Pingreq())
    assert pub.recv() == Pingresp()


def test_qos2_inbound_duplicate_is_routed_once(raw) -> None:
    """A QoS 2 PUBLISH re-sent with DUP before PUBREL reaches subscribers only once."""
    topic = uid("q") + "/t"
    sub = raw(uid("s"))
    sub.subscribe((topic, 2))
    pub = raw(uid("p"))
    pub.send(Publish(topic, b"once", 2, False, False, 7))
    assert pub.recv() == Pubrec(7)
    pub.send(Publish(topic, b"once", 2, False, True, 7))
    assert pub.recv() == Pubrec(7)
    pub.send(Publish(topic, b"once", 2, False, True, 7))
    assert pub.recv() == Pubrec(7)
    pub.send(Pubrel(7))
    assert pub.recv() == Pubcomp(7)
    # The id is free again: a new message with it is a new message.
    pub.send(Publish(topic, b"again", 2, False, False, 7))
    assert pub.recv() == Pubrec(7)
    pub.send(Pubrel(7))
    assert pub.recv() == Pubcomp(7)
    pub.publish(topic, b"marker", 0)
    got = [sub.receive_acked().payload for _ in range(3)]
    assert got == [b"once", b"again", b"marker"]


def test_qos2_inbound_duplicate_after_reconnect_is_routed_once(raw) -> None:
    """A persistent publisher that lost its socket after PUBREC and re-sends with DUP on
    the new connection is still routed once."""
    topic = uid("q") + "/t"
    sub = raw(uid("s"))
    sub.subscribe((topic, 2))
    cid = uid("p")
    pub = raw(cid, clean=False)
    pub.send(Publish(topic, b"once", 2, False, False, 9))
    assert pub.recv() == Pubrec(9)
    first = sub.receive_acked()
    assert first.payload == b"once"
    pub.close()
    pub = raw(cid, clean=False)
    pub.send(Publish(topic, b"once", 2, False, True, 9))
    assert pub.recv() == Pubrec(9)
    pub.send(Pubrel(9))
    assert pub.recv() == Pubcomp(9)
    pub.publish(topic, b"marker", 0)
    assert sub.receive().payload == b"marker"


def test_pubrel_for_unknown_id_gets_pubcomp(raw) -> None:
    """A PUBREL for an id the broker does not hold is still answered by PUBCOMP."""
    c = raw(uid("u"))
    c.send(Pubrel(4242))
    assert c.recv() == Pubcomp(4242)


def test_subscribe_valid_filters_granted_in_request_order(raw) -> None:
    """3.1.1 SUBACK: valid filters get their QoS, in request order.  (Invalid filters
    used to get 0x80 here; since issue 16, item 5 they close the connection:
    test_conformance_mqtt.)"""
    base = uid("f")
    c = raw(uid("c"))
    codes = c.subscribe((f"{base}/a", 2), (f"{base}/+/c", 1), (f"{base}/#", 0))
    assert codes == (2, 1, 0)


def test_unsubscribe_stops_delivery(raw) -> None:
    """After UNSUBACK nothing more arrives for that filter; others still do."""
    base = uid("u")
    c = raw(uid("c"))
    c.subscribe((f"{base}/a", 0), (f"{base}/b", 0))
    c.unsubscribe(f"{base}/a")
    pub = raw(uid("p"))
    pub.publish(f"{base}/a", b"no", 0)
    pub.publish(f"{base}/b", b"yes", 0)
    assert c.receive().payload == b"yes"


def test_resubscribe_replaces_qos(raw) -> None:
    """Subscribing again to the same filter replaces its QoS (one copy, new QoS)."""
    topic = uid("r") + "/t"
    c = raw(uid("c"))
    c.subscribe((topic, 2))
    c.subscribe((topic, 0))
    pub = raw(uid("p"))
    pub.publish(topic, b"x", 2)
    pub.publish(topic, b"end", 0)
    msg = c.receive()
    assert (msg.payload, msg.qos) == (b"x", 0)
    assert c.receive().payload == b"end"


def test_pipelined_packets_in_one_write(sockets) -> None:
    """CONNECT, SUBSCRIBE, PUBLISH and PINGREQ sent in one write are all handled,
    although the broker is still committing the CONNECT when they arrive."""
    topic = uid("pl") + "/t"
    c = sockets()
    c.send(encode(Connect("MQTT", 4, uid("c"), False, 60)) + encode(Subscribe(1, ((topic, 1),)))
           + encode(Publish(topic, b"to self", 1, False, False, 2)) + encode(Pingreq()))
    assert c.recv() == Connack(False, 0)
    # The server may send matching PUBLISHes before the SUBACK (3.1.1, 3.8.4), and a
    # PINGRESP needs no commit: only the set is fixed.
    rest = [c.recv() for _ in range(4)]
    published = [p for p in rest if isinstance(p, Publish)]
    assert len(published) == 1
    assert (published[0].topic, published[0].payload, published[0].qos) == (topic, b"to self", 1)
    others = sorted(repr(p) for p in rest if not isinstance(p, Publish))
    assert others == sorted(repr(p) for p in (Suback(1, (1,)), Puback(2), Pingresp()))


def test_connect_and_disconnect_in_one_write_fires_no_will(raw, sockets) -> None:
    """A CONNECT with a will followed at once by DISCONNECT leaves no will behind."""
    base = uid("cd")
    observer = raw(uid("o"))
    observer.subscribe((f"{base}/will", 1), (f"{base}/marker", 0))
    c = sockets()
    c.send(encode(Connect("MQTT", 4, uid("c"), True, 60, Will(f"{base}/will", b"no", 1, False)))
           + encode(Disconnect()))
    assert [type(p) for p in c.wait_closed()] == [Connack]
    raw(uid("p")).publish(f"{base}/marker", b"m", 0)
    assert observer.recv() == Publish(f"{base}/marker", b"m")


def test_second_connect_in_the_same_write_is_a_violation(raw, sockets) -> None:
    """Two CONNECTs in one write: the first is accepted, the second closes the
    connection and fires the will the first one set."""
    topic = uid("cc") + "/will"
    observer = raw(uid("o"))
    observer.subscribe((topic, 1))
    c = sockets()
    connect = encode(Connect("MQTT", 4, uid("c"), True, 60, Will(topic, b"twice", 1, False)))
    c.send(connect + connect)
    assert c.wait_closed() == [Connack(False, 0)]
    assert observer.receive_acked().payload == b"twice"


def test_dollar_topics_from_clients_not_matched_by_leading_wildcards(raw) -> None:
    """A client's '$app/...' topic reaches '$app/#' but not '#' or '+/...' filters."""
    ident = uid("d")
    wild = raw(uid("w"))
    wild.subscribe(("#", 0), (f"+/{ident}/t", 0))
    exact = raw(uid("e"))
    exact.subscribe((f"$app/{ident}/#", 0))
    pub = raw(uid("p"))
    pub.publish(f"$app/{ident}/t", b"dollar", 0)
    pub.publish(f"{ident}-marker", b"m", 0)
    assert exact.receive().topic == f"$app/{ident}/t"
    while True:
        m = wild.receive()
        assert not m.topic.startswith("$"), m.topic
        if m.topic == f"{ident}-marker":
            break


def test_byte_at_a_time(sockets) -> None:
    """Packets trickling in one byte per TCP segment are assembled correctly."""
    topic = uid("b") + "/t"
    c = sockets()
    data = (encode(Connect("MQTT", 4, uid("c"), True, 60)) + encode(Subscribe(1, ((topic, 2),)))
            + encode(Publish(topic, b"x" * 300, 2, False, False, 5)))
    for i in range(len(data)):
        c.sock.sendall(data[i:i + 1])
    assert isinstance(c.recv(), Connack)
    got = {repr(c.recv()) for _ in range(3)}
    assert got == {repr(Suback(1, (2,))), repr(Pubrec(5)),
                   repr(Publish(topic, b"x" * 300, 2, False, False, 1))}


def test_username_and_password_accepted_anonymously(sockets) -> None:
    """Until authentication is configured, a CONNECT with username and password is
    accepted like an anonymous one."""
    c = sockets()
    c.send(Connect("MQTT", 4, uid("u"), True, 60, None, "user", b"secret"))
    assert c.recv() == Connack(False, 0)


def test_retained_resent_on_resubscribe(raw) -> None:
    """Subscribing again to an existing filter sends its retained messages again."""
    topic = uid("rr") + "/t"
    raw(uid("p")).publish(topic, b"kept", 1, retain=True)
    c = raw(uid("c"))
    for _ in range(2):
        c.subscribe((topic, 1))
        m = c.receive_acked()
        assert (m.payload, m.retain) == (b"kept", True)
    raw(uid("p")).publish(topic, b"", 1, retain=True)


def test_forwarded_message_has_dup_clear(raw) -> None:
    """A PUBLISH that arrives with DUP set is forwarded with DUP clear (the flag is
    per hop)."""
    topic = uid("dp") + "/t"
    sub = raw(uid("s"))
    sub.subscribe((topic, 1))
    pub = raw(uid("p"))
    pub.send(Publish(topic, b"resent", 1, False, True, 3))
    assert pub.recv() == Puback(3)
    m = sub.receive_acked()
    assert (m.payload, m.dup) == (b"resent", False)


def test_takeover_of_persistent_session_redelivers_inflight(raw) -> None:
    """On takeover the unacknowledged message of the old connection goes to the new
    one, DUP set, same packet id."""
    topic = uid("to") + "/t"
    cid = uid("t")
    old = raw(cid, clean=False)
    old.subscribe((topic, 1))
    raw(uid("p")).publish(topic, b"pending", 1)
    first = old.receive()  # not acknowledged
    new = raw(cid, clean=False)
    again = new.receive_acked()
    assert (again.payload, again.dup, again.packet_id) == (b"pending", True, first.packet_id)
    assert old.wait_closed() == []


# ==================================================================================
# Redelivery and sessions


@pytest.mark.parametrize("level", [3, 4])
def test_persistent_session_redelivers_with_dup_in_original_order(raw, level: int) -> None:
    """Unacknowledged QoS 1/2 messages (and a PUBREL) are sent again after reconnect of
    a persistent session, DUP set, same packet ids, in their original order."""
    base = uid("d")
    cid = uid("s")
    sub = raw(cid, level=level, clean=False)
    sub.subscribe((f"{base}/+", 2))
    pub = raw(uid("p"))
    for i, qos in enumerate((1, 2, 1, 2, 2)):
        pub.publish(f"{base}/t", b"m%d" % i, qos)
    first = [sub.receive() for _ in range(5)]
    assert [m.payload for m in first] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert all(not m.dup for m in first)
    # m1 gets PUBREC (so the broker owes a PUBREL); nothing else is acknowledged.
    sub.send(Pubrec(first[1].packet_id))  # type: ignore[arg-type]
    assert sub.expect(Pubrel) == Pubrel(first[1].packet_id)  # type: ignore[arg-type]
    sub.close()  # socket loss, no DISCONNECT
    sub = raw(cid, level=level, clean=False)
    again = [sub.recv() for _ in range(5)]
    expected: list[Packet] = [
        Publish(f"{base}/t", b"m0", 1, False, True, first[0].packet_id),
        Pubrel(first[1].packet_id),  # type: ignore[arg-type]
        Publish(f"{base}/t", b"m2", 1, False, True, first[2].packet_id),
        Publish(f"{base}/t", b"m3", 2, False, True, first[3].packet_id),
        Publish(f"{base}/t", b"m4", 2, False, True, first[4].packet_id),
    ]
    assert again == expected
    sub.send(Puback(first[0].packet_id))  # type: ignore[arg-type]
    sub.send(Pubcomp(first[1].packet_id))  # type: ignore[arg-type]
    sub.send(Puback(first[2].packet_id))  # type: ignore[arg-type]
    for m in again[3:]:
        sub.ack(m)  # type: ignore[arg-type]
    pub.publish(f"{base}/t", b"fresh", 1)
    fresh = sub.receive_acked()
    assert (fresh.payload, fresh.dup) == (b"fresh", False)


def test_persistent_session_keeps_subscriptions_and_queues_qos12_offline(raw) -> None:
    """Offline, a persistent session keeps its subscriptions and queues QoS 1/2 (not 0)."""
    base = uid("o")
    cid = uid("s")
    sub = raw(cid, clean=False)
    sub.subscribe((f"{base}/#", 2))
    sub.disconnect()
    pub = raw(uid("p"))
    pub.publish(f"{base}/a", b"q0", 0)
    pub.publish(f"{base}/a", b"q1", 1)
    pub.publish(f"{base}/b", b"q2", 2)
    sub = raw(cid, clean=False)
    got = [sub.receive_acked() for _ in range(2)]
    assert [(m.payload, m.qos) for m in got] == [(b"q1", 1), (b"q2", 2)]
    pub.publish(f"{base}/c", b"live", 0)
    assert sub.receive().payload == b"live"


def test_clean_session_discards_state_at_connect(raw) -> None:
    """Connecting with clean session drops the old persistent session's queue and
    subscriptions."""
    base = uid("c")
    cid = uid("s")
    sub = raw(cid, clean=False)
    sub.subscribe((f"{base}/t", 1))
    sub.disconnect()
    pub = raw(uid("p"))
    pub.publish(f"{base}/t", b"queued", 1)
    sub = raw(cid, clean=True)
    sub.subscribe((f"{base}/marker", 0))
    pub.publish(f"{base}/t", b"after", 1)
    pub.publish(f"{base}/marker", b"m", 0)
    assert sub.recv() == Publish(f"{base}/marker", b"m")


def test_clean_session_discards_state_at_disconnect(raw, sockets) -> None:
    """A clean session's subscriptions are gone after it disconnects."""
    base = uid("c")
    cid = uid("s")
    sub = raw(cid, clean=True)
    sub.subscribe((f"{base}/t", 1))
    sub.disconnect()
    c = sockets()
    assert c.connect(cid, clean=False).session_present is False
    c.subscribe((f"{base}/marker", 0))
    pub = raw(uid("p"))
    pub.publish(f"{base}/t", b"gone", 1)
    pub.publish(f"{base}/marker", b"m", 0)
    assert c.recv() == Publish(f"{base}/marker", b"m")


# ==================================================================================
# Wills


@pytest.mark.parametrize("will_qos,granted,expected", [(0, 2, 0), (1, 2, 1), (2, 2, 2),
                                                         (2, 1, 1)])
def test_will_on_socket_loss_honours_qos(raw, will_qos: int, granted: int,
                                         expected: int) -> None:
    """A client that loses its socket has its will published at min(will QoS, granted)."""
    topic = uid("w") + "/will"
    observer = raw(uid("o"))
    observer.subscribe((topic, granted))
    victim = raw(uid("x"), will=Will(topic, b"lost", will_qos, False))
    victim.close()
    will = observer.receive_acked()
    assert (will.topic, will.payload, will.qos, will.retain) == (topic, b"lost", expected, False)


def test_retained_will_is_retained(raw) -> None:
    """A will with the retain flag is stored as the topic's retained message."""
    topic = uid("w") + "/will"
    observer = raw(uid("o"))
    observer.subscribe((topic, 1))
    victim = raw(uid("x"), will=Will(topic, b"offline", 1, True))
    victim.close()
    live = observer.receive_acked()
    assert (live.payload, live.retain) == (b"offline", False)
    late = raw(uid("l"))
    late.subscribe((topic, 1))
    kept = late.receive_acked()
    assert (kept.topic, kept.payload, kept.qos, kept.retain) == (topic, b"offline", 1, True)
    late.publish(topic, b"", 1, retain=True)  # clean up


def test_no_will_after_disconnect(raw) -> None:
    """A client that sends DISCONNECT never has its will published."""
    base = uid("w")
    observer = raw(uid("o"))
    observer.subscribe((f"{base}/will", 1), (f"{base}/marker", 0))
    victim = raw(uid("x"), will=Will(f"{base}/will", b"no", 1, True))
    victim.disconnect()
    raw(uid("p")).publish(f"{base}/marker", b"m", 0)
    assert observer.recv() == Publish(f"{base}/marker", b"m")
    late = raw(uid("l"))
    late.subscribe((f"{base}/will", 1), (f"{base}/marker", 0))
    raw(uid("p")).publish(f"{base}/marker", b"m", 0)
    assert late.recv() == Publish(f"{base}/marker", b"m")  # nothing retained either


@pytest.mark.parametrize("clean", [True, False])
def test_takeover_closes_old_connection_and_fires_its_will(raw, clean: bool) -> None:
    """A second CONNECT with a connected id closes the first connection and the new
    connection works (and resumes a persistent session).  The old will is published
    when the newcomer starts clean, not when it resumes the persistent session
    (issue 16, item 7: this test asserted a will for both before)."""
    base = uid("k")
    cid = uid("t")
    observer = raw(uid("o"))
    observer.subscribe((f"{base}/will", 1), (f"{base}/marker", 0))
    old = raw(cid, clean=clean, will=Will(f"{base}/will", b"old gone", 1, False))
    old.subscribe((f"{base}/data", 1))
    new = RawClient(old.sock.getpeername()[1])
    try:
        ack = new.connect(cid, clean=clean)
        assert ack.return_code == 0
        assert ack.session_present is (not clean)
        assert old.wait_closed() == []
        if clean:
            will = observer.receive_acked()
            assert (will.topic, will.payload) == (f"{base}/will", b"old gone")
        else:
            raw(uid("p")).publish(f"{base}/marker", b"m", 0)
            assert observer.recv() == Publish(f"{base}/marker", b"m")
        if not clean:
            raw(uid("p")).publish(f"{base}/data", b"to new", 1)
            assert new.receive_acked().payload == b"to new"
        new.send(Pingreq())
        assert new.recv() == Pingresp()
        new.disconnect()
    finally:
        new.close()


def test_keepalive_expiry_closes_and_fires_will(raw) -> None:
    """With keepalive 1 s and no traffic the broker waits 1.5 s, then closes and
    publishes the will (the exact 1.5 x keepalive rule is on a Clock in
    unit/mqtt/test_mqtt_protocol.py)."""
    topic = uid("k") + "/will"
    observer = raw(uid("o"))
    observer.subscribe((topic, 1))
    victim = raw(uid("x"), keepalive=1, will=Will(topic, b"timed out", 1, False))
    victim.assert_silent(1.0)  # still open at 1 s (before 1.5 x keepalive)
    assert victim.wait_closed(timeout=4.0) == []
    will = observer.receive_acked()
    assert (will.topic, will.payload) == (topic, b"timed out")


def test_pings_keep_the_connection_alive(raw) -> None:
    """A client that sends PINGREQ within its keepalive stays connected past 1.5 x."""
    c = raw(uid("k"), keepalive=1)
    for _ in range(4):  # 2 s in all, past 1.5 x keepalive
        c.assert_silent(0.5)  # pacing between pings; nothing may arrive meanwhile
        c.send(Pingreq())
        assert c.recv() == Pingresp()


# ==================================================================================
# Limits (each on a broker of its own)


def test_connect_timeout_closes_silent_socket(start_broker) -> None:
    """A socket that sends no CONNECT is closed after --connect-timeout."""
    proc = start_broker("--connect-timeout", "1")
    c = RawClient(proc.mqtt_port)
    partial = RawClient(proc.mqtt_port)
    try:
        partial.send(encode(Connect("MQTT", 4, uid("c"), True, 60))[:6])  # half a CONNECT
        c.assert_silent(0.5)
        assert c.wait_closed(timeout=5.0) == []
        assert partial.wait_closed(timeout=2.0) == []
        # A client that does CONNECT in time is not affected.
        ok = RawClient(proc.mqtt_port)
        assert ok.connect(uid("c")).return_code == 0
        ok.assert_silent(1.2)  # past the connect timeout: CONNECT cancelled it
        ok.send(Pingreq())
        assert ok.recv() == Pingresp()
        ok.close()
    finally:
        c.close()
        partial.close()


def test_connect_timeout_default_is_not_immediate(sockets) -> None:
    """With the default connect timeout (10 s) a silent socket is still open after 1 s."""
    c = sockets()
    c.assert_silent(1.0)


def test_max_connections_refuses_extra_sockets(start_broker) -> None:
    """With --max-connections 2 a third socket is closed; a slot freed is usable again."""
    proc = start_broker("--max-connections", "2")
    port = proc.mqtt_port
    a, b = RawClient(port), RawClient(port)
    extra: list[RawClient] = []
    try:
        assert a.connect(uid("a")).return_code == 0
        assert b.connect(uid("b")).return_code == 0
        # (closed at its accept: under load the reset may reach the client before
        # its connect() returns, which ``closed_at_once`` takes as the refusal too)
        assert closed_at_once(port)
        a.disconnect()
        fourth = RawClient(port)
        extra.append(fourth)
        assert fourth.connect(uid("d")).return_code == 0
        b.send(Pingreq())
        assert b.recv() == Pingresp()
    finally:
        for c in (a, b, *extra):
            c.close()


def test_max_packet_size(start_broker) -> None:
    """With --max-packet-size 1024 a 1024-byte PUBLISH is routed and a 1025-byte one
    closes the sender (will fired) without disturbing the subscriber."""
    proc = start_broker("--max-packet-size", "1024")
    port = proc.mqtt_port
    topic = "big/t"
    sub = RawClient(port)
    pub = RawClient(port)
    try:
        sub.connect(uid("s"))
        sub.subscribe((topic, 0), ("big/will", 1))
        pub.connect(uid("p"), will=Will("big/will", b"too big", 1, False))
        # 1 byte type + 2 bytes remaining length + 2 + len(topic) + payload.
        fits = encode(Publish(topic, b"x" * (1024 - 3 - 2 - len(topic))))
        assert len(fits) == 1024
        pub.send(fits)
        got = sub.receive()
        assert len(got.payload) == 1024 - 3 - 2 - len(topic)
        too_big = encode(Publish(topic, b"y" * (1025 - 3 - 2 - len(topic))))
        assert len(too_big) == 1025
        pub.send(too_big)
        assert pub.wait_closed() == []
        will = sub.receive_acked()
        assert will.payload == b"too big"
        sub.send(Pingreq())
        assert sub.recv() == Pingresp()
    finally:
        sub.close()
        pub.close()


def test_max_packet_size_applies_before_the_body_arrives(start_broker) -> None:
    """A header announcing an oversize packet closes the connection without waiting
    for (or buffering) its body."""
    proc = start_broker("--max-packet-size", "1024")
    c = RawClient(proc.mqtt_port)
    try:
        c.connect(uid("h"))
        c.send(b"\x30" + encode_remaining_length(10_000_000))
        assert c.wait_closed() == []
    finally:
        c.close()


def test_inflight_window(start_broker) -> None:
    """With --max-inflight 2 an unacknowledging subscriber gets exactly 2 PUBLISHes; each
    ack releases the next, all in order."""
    proc = start_broker("--max-inflight", "2")
    port = proc.mqtt_port
    sub, pub = RawClient(port), RawClient(port)
    try:
        sub.connect(uid("s"))
        sub.subscribe(("win/t", 2))
        pub.connect(uid("p"))
        for i in range(6):
            pub.publish("win/t", b"m%d" % i, 1 if i % 2 == 0 else 2)
        window = [sub.receive(), sub.receive()]
        assert [m.payload for m in window] == [b"m0", b"m1"]
        sub.assert_silent(0.5)
        received = list(window)
        sub.send(Puback(window[0].packet_id))  # type: ignore[arg-type]
        nxt = sub.receive()
        assert nxt.payload == b"m2"
        received.append(nxt)
        sub.assert_silent(0.3)
        # QoS 2: PUBREC alone does not free the slot; PUBCOMP does.
        sub.send(Pubrec(window[1].packet_id))  # type: ignore[arg-type]
        assert sub.recv() == Pubrel(window[1].packet_id)  # type: ignore[arg-type]
        sub.assert_silent(0.3)
        sub.send(Pubcomp(window[1].packet_id))  # type: ignore[arg-type]
        while len(received) < 6:
            m = sub.receive()
            received.append(m)
            sub.ack(received[len(received) - 2])  # the window is full again: free one slot
        assert [m.payload for m in received] == [b"m%d" % i for i in range(6)]
        assert not any(m.dup for m in received)
    finally:
        sub.close()
        pub.close()


def test_default_inflight_window_is_32(raw) -> None:
    """By default 32 QoS 1 messages are in flight to a client that does not ack; the
    33rd waits for a PUBACK."""
    topic = uid("w") + "/t"
    sub = raw(uid("s"))
    sub.subscribe((topic, 1))
    pub = raw(uid("p"))
    for i in range(40):
        pub.publish(topic, b"m%d" % i, 1)
    got = [sub.receive() for _ in range(32)]
    assert [m.payload for m in got] == [b"m%d" % i for i in range(32)]
    sub.assert_silent(0.5)
    sub.ack(got[0])
    assert sub.receive().payload == b"m32"


def test_max_queued_bytes_drops_and_counts(start_broker) -> None:
    """With --max-queued-bytes 10 an offline session keeps messages up to 10 payload
    bytes; the rest are dropped and counted in $SYS/broker/messages/dropped."""
    proc = start_broker("--max-queued-bytes", "10", "--sys-interval", "1")
    port = proc.mqtt_port
    sub, pub, watcher = RawClient(port), RawClient(port), RawClient(port)
    try:
        sub.connect("qb", clean=False)
        sub.subscribe(("qb/t", 1))
        sub.disconnect()
        pub.connect(uid("p"))
        for payload in (b"aaaa", b"bbbb", b"cccc", b"dd"):  # 4 + 4 fit, 4 does not, 2 fits
            pub.publish("qb/t", payload, 1)
        watcher.connect(uid("w"))
        watcher.subscribe(("$SYS/broker/messages/dropped", 0))
        deadline = time.monotonic() + 5
        while watcher.receive(timeout=max(0.1, deadline - time.monotonic())).payload != b"1":
            pass
        sub = RawClient(port)
        sub.connect("qb", clean=False)
        got = [sub.receive_acked().payload for _ in range(3)]
        assert got == [b"aaaa", b"bbbb", b"dd"]
    finally:
        for c in (sub, pub, watcher):
            c.close()


def test_max_queued_messages_drops_and_counts(start_broker) -> None:
    """With --max-queued-messages 5 an offline session keeps the first 5 messages and
    $SYS/broker/messages/dropped counts the rest."""
    proc = start_broker("--max-queued-messages", "5", "--sys-interval", "1")
    port = proc.mqtt_port
    clients: list[RawClient] = []

    def client(cid: str, clean: bool = True) -> RawClient:
        c = RawClient(port)
        clients.append(c)
        assert c.connect(cid, clean).return_code == 0
        return c

    try:
        sub = client("queued", clean=False)
        sub.subscribe(("q/t", 1))
        sub.disconnect()
        pub = client(uid("p"))
        for i in range(8):
            pub.publish("q/t", b"m%d" % i, 1)
        watcher = client(uid("w"))
        watcher.subscribe(("$SYS/broker/messages/dropped", 0))
        deadline = time.monotonic() + 5
        while True:
            value = watcher.receive(timeout=max(0.1, deadline - time.monotonic())).payload
            if value == b"3":
                break
            assert value == b"0", f"dropped count {value!r}"
        sub = client("queued", clean=False)
        got = [sub.receive_acked().payload for _ in range(5)]
        assert got == [b"m%d" % i for i in range(5)]
        pub.publish("q/t", b"after", 1)
        assert sub.receive_acked().payload == b"after"
    finally:
        for c in clients:
            c.close()


def test_session_expiry_removes_abandoned_persistent_session(start_broker) -> None:
    """With --session-expiry 1 an offline persistent session is deleted: reconnecting
    finds no session and no subscription."""
    proc = start_broker("--session-expiry", "1", "--sys-interval", "1")
    port = proc.mqtt_port
    clients: list[RawClient] = []

    def client(cid: str, clean: bool = True) -> RawClient:
        c = RawClient(port)
        clients.append(c)
        return c

    try:
        sub = client("expiring")
        sub.connect("expiring", clean=False)
        sub.subscribe(("exp/t", 1))
        sub.disconnect()
        watcher = client("watcher")
        watcher.connect("watcher")
        watcher.subscribe(("$SYS/broker/sessions/count", 0))
        deadline = time.monotonic() + 8
        while True:  # 2 sessions (watcher + the offline one) until it expires
            m = watcher.receive(timeout=max(0.1, deadline - time.monotonic()))
            if not m.retain and m.payload == b"1":  # live, so counted with the watcher
                break
        watcher.subscribe(("exp/marker", 0))
        back = client("expiring")
        ack = back.connect("expiring", clean=False)
        assert (ack.return_code, ack.session_present) == (0, False)
        back.subscribe(("exp/marker", 0))
        pub = client("pub")
        pub.connect("pub")
        pub.publish("exp/t", b"nobody", 1)
        pub.publish("exp/marker", b"m", 0)
        assert back.recv() == Publish("exp/marker", b"m")
    finally:
        for c in clients:
            c.close()


# ==================================================================================
# $SYS counters, exactly (on a broker of its own)


class SysWatcher:
    """Follows $SYS/broker/...: the retained values on subscribe, then each burst,
    which publishes the uptime first and then only the values that changed."""

    def __init__(self, port: int) -> None:
        self.client = RawClient(port)
        assert self.client.connect(uid("sys")).return_code == 0
        self.client.subscribe(("$SYS/broker/#", 0))
        self.values: dict[str, bytes] = {}   # the current value of every topic seen
        self._in_burst = False  # the last next_refresh() stopped at an 'uptime'

    def _receive(self, deadline: float, wanted: object) -> tuple[str, bytes, bool]:
        try:
            m = self.client.receive(timeout=max(0.05, deadline - time.monotonic()))
        except AssertionError:
            raise AssertionError(f"wanted {wanted}, last seen {self.values}") from None
        return m.topic[len("$SYS/broker/"):], m.payload, m.retain

    def wait(self, expected: dict[str, bytes], timeout: float = 6.0) -> dict[str, bytes]:
        """Wait until every name has the expected value."""
        deadline = time.monotonic() + timeout
        while not all(self.values.get(k) == v for k, v in expected.items()):
            name, payload, _ = self._receive(deadline, expected)
            self.values[name] = payload
        return dict(self.values)

    def next_refresh(self, timeout: float = 4.0) -> dict[str, bytes]:
        """Every value as the next complete live burst left it (a burst runs from one
        live 'uptime' to the next)."""
        deadline = time.monotonic() + timeout
        started, self._in_burst = self._in_burst, False
        while True:
            name, payload, retain = self._receive(deadline, "a whole burst")
            if name == "uptime" and not retain:
                if started:
                    self._in_burst = True
                    now = dict(self.values)
                    self.values[name] = payload
                    return now
                started = True
            self.values[name] = payload


@pytest.mark.core_only("the core's $SYS counters (behind a gateway, clients are AMQP links)")
def test_sys_client_and_subscription_counters(start_broker) -> None:
    """$SYS clients/connected, total, maximum and subscriptions/count follow the
    connections and subscriptions exactly."""
    proc = start_broker("--sys-interval", "1")
    port = proc.mqtt_port
    watcher = SysWatcher(port)  # 1 client, 1 subscription
    others = [RawClient(port) for _ in range(3)]
    try:
        for c in others:
            assert c.connect(uid("c")).return_code == 0
        others[0].subscribe(("a/+", 0), ("b/#", 1))
        others[2].disconnect()
        watcher.wait({"clients/connected": b"3", "clients/total": b"4",
                      "clients/maximum": b"4", "subscriptions/count": b"3"})
        others[1].close()
        watcher.wait({"clients/connected": b"2", "clients/total": b"4",
                      "clients/maximum": b"4"})
    finally:
        watcher.client.close()
        for c in others:
            c.close()


@pytest.mark.core_only("the core's $SYS counters (behind a gateway, clients are AMQP links)")
def test_sys_message_counters_count_client_traffic(start_broker) -> None:
    """messages/received and messages/sent count the messages clients publish and
    the copies sent of them, not the broker's own $SYS updates (the bytes are
    counted); retained messages/count goes up by the retained messages stored."""
    proc = start_broker("--sys-interval", "1")
    watcher = SysWatcher(proc.mqtt_port)
    pub = RawClient(proc.mqtt_port)
    try:
        first = watcher.next_refresh()
        second = watcher.next_refresh()
        assert second["messages/received"] == first["messages/received"], (first, second)
        assert second["bytes/received"] == first["bytes/received"]
        assert second["messages/sent"] == first["messages/sent"]  # ($SYS to us: not)
        assert int(second["bytes/sent"]) > int(first["bytes/sent"])
        pub.connect(uid("p"))
        for i in range(3):
            pub.publish(f"cnt/{i}", b"x", 1, retain=i < 2)
        later = watcher.wait({"retained messages/count":
                              b"%d" % (int(second["retained messages/count"]) + 2)})
        assert int(later["messages/received"]) == int(second["messages/received"]) + 3
    finally:
        watcher.client.close()
        pub.close()

"""Issue 16, "MQTT 3.1 / 3.1.1": the last packet-level strictness gaps, at the byte
level against the real broker (raw sockets on 127.0.0.1, the broker on port 0).

One section per item of the issue:

1. an acknowledgement of the wrong kind for a message in flight closes the connection;
2. MQTT 3.1 CONNECT is judged by 3.1's rules (its fixed-header flags are not reserved);
3. 3.1 topics, filters and will topics are UTF-8 strings without U+0000 too;
4. control characters in client ids, user names, will topics, topics and filters
   close the connection (``--allow-control-chars`` accepts them);
5. an invalid topic filter in SUBSCRIBE or UNSUBSCRIBE closes the connection;
6. inbound QoS 2: PUBREC goes out before the message is forwarded;
7. a will is not published when a new connection resumes the persistent session;
8. MQTT 3.1 client ids longer than 23 characters are accepted (``--strict-mqtt31``);
9. ``--max-topic-levels`` and ``--max-topic-length``.

Every close is checked for its one logged reason (and for no traceback).  Every wait
is a read on the socket or the broker's log with a deadline.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from brokerproc import BrokerProcess
from rawclient import (
    TIMEOUT,
    OpenClient,
    RawClient,
    frame,
    mstr,
    raw_connect,
    u16,
    uid,
)

from mqttamqp.mqtt.packets import (
    Connack,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
)

# Every test against a broker and through a gateway (the folder conftest).
pytestmark = [pytest.mark.timeout(90), pytest.mark.through_gateway]


def closed_with_reason(broker: BrokerProcess, client: RawClient, reason: str,
                       before: list[type] | None = None) -> None:
    """The broker closes ``client`` (sending nothing, or only packets of the kinds in
    ``before``) and logs exactly one protocol error for it, matching ``reason``, with
    no traceback."""
    port = client.sock.getsockname()[1]
    got = client.wait_closed()
    assert [type(p) for p in got] == (before or []), got
    peer = re.escape(f"(127.0.0.1:{port})")
    pattern = rf"protocol error from .* {peer}: .*{reason}.*; closing"
    broker.wait_for_line(pattern, timeout=TIMEOUT)
    mine = [entry for entry in broker.log if re.search(pattern, entry)]
    assert len(mine) == 1, mine
    assert not [entry for entry in broker.log if "Traceback" in entry], broker.output()


def still_routes(raw: OpenClient, topic: str) -> None:
    """The broker still works for others: a QoS 0 message goes round."""
    c = raw(uid("ok"))
    c.subscribe((topic, 0))
    c.publish(topic, b"alive", 0)
    assert c.receive().payload == b"alive"


# ==================================================================================
# 1. Wrong acknowledgement for a message in flight


def _inflight(raw: OpenClient, qos: int) -> tuple[RawClient, int]:
    """A subscriber with one QoS ``qos`` message in flight; returns it and the id."""
    topic = uid("a") + "/t"
    sub = raw(uid("s"))
    assert sub.subscribe((topic, qos)) == (qos,)
    raw(uid("p")).publish(topic, b"m", qos)
    msg = sub.receive()
    assert msg.qos == qos and msg.packet_id is not None
    return sub, msg.packet_id


@pytest.mark.parametrize("ack", [Pubrec, Pubcomp], ids=["PUBREC", "PUBCOMP"])
def test_qos2_ack_for_inflight_qos1_closes(broker, raw, ack: type) -> None:
    """A PUBREC (answered with PUBREL before) or a PUBCOMP (ignored before) for an
    in-flight QoS 1 message closes the connection, logged."""
    sub, pid = _inflight(raw, 1)
    sub.send(ack(pid))
    closed_with_reason(broker, sub, f"{ack.__name__.upper()} for packet id {pid}, a QoS 1")


@pytest.mark.parametrize("ack", [Puback, Pubcomp], ids=["PUBACK", "PUBCOMP"])
def test_ack_for_qos2_before_pubrec_closes(broker, raw, ack: type) -> None:
    """A PUBACK or PUBCOMP for a QoS 2 message the client has not PUBREC'd closes."""
    sub, pid = _inflight(raw, 2)
    sub.send(ack(pid))
    closed_with_reason(broker, sub, f"{ack.__name__.upper()} for packet id {pid}")


def test_puback_after_pubrel_closes(broker, raw) -> None:
    """A PUBACK instead of PUBCOMP after PUBREL (QoS 2) closes the connection."""
    sub, pid = _inflight(raw, 2)
    sub.send(Pubrec(pid))
    assert sub.expect(Pubrel, pid) == Pubrel(pid)
    sub.send(Puback(pid))
    closed_with_reason(broker, sub, f"PUBACK for packet id {pid}, a QoS 2 message in "
                                    r"flight \(after PUBREL\)")


# ==================================================================================
# 2. MQTT 3.1 CONNECT fixed-header flags


@pytest.mark.parametrize("flags", [0b0100, 0b1010])
def test_mqtt31_connect_with_header_flags_is_accepted(sockets, flags: int) -> None:
    """3.1 did not reserve CONNECT's fixed-header flags: a 3.1 CONNECT with them set is
    accepted (it was refused as malformed); a 3.1.1 one is still closed."""
    c = sockets(level=3)
    connect = raw_connect("MQIsdp", 3, uid("h"))
    c.send(bytes((0x10 | flags,)) + connect[1:])
    assert c.recv() == Connack(False, 0)
    c.send(Pingreq())
    assert c.recv() == Pingresp()
    strict = sockets()
    strict.send(bytes((0x10 | flags,)) + raw_connect("MQTT", 4, uid("h"))[1:])
    assert strict.wait_closed() == []


# ==================================================================================
# 3. Strings under 3.1


@pytest.mark.parametrize("make,reason", [
    (lambda t: frame(0x30, mstr(t + "/\x00") + b"x"), "PUBLISH topic contains U\\+0000"),
    (lambda t: frame(0x82, u16(1) + mstr(t + "/\x00") + b"\x00"),
     "SUBSCRIBE topic filter contains U\\+0000"),
    (lambda t: frame(0xA2, u16(1) + mstr(t + "/\x00")),
     "UNSUBSCRIBE topic filter contains U\\+0000"),
], ids=["publish", "subscribe", "unsubscribe"])
def test_mqtt31_nul_in_topic_or_filter_closes(broker, raw, make, reason: str) -> None:
    """U+0000 is not allowed in a 3.1 topic or filter either (it was routed before)."""
    c = raw(uid("n"), level=3)
    c.send(make(uid("t")))
    closed_with_reason(broker, c, reason)


def test_mqtt31_nul_in_will_topic_closes(broker, sockets) -> None:
    """A 3.1 will topic with U+0000 is malformed: closed without CONNACK (the will was
    silently ignored and the client accepted before)."""
    c = sockets(level=3)
    c.send(raw_connect("MQIsdp", 3, uid("w"), flags=0x06,
                       tail=mstr("will/\x00") + mstr(b"x")))
    closed_with_reason(broker, c, "CONNECT will topic contains U\\+0000")


# ==================================================================================
# 4. Control characters


def _connect_with(client_id: str, username: str | None = None,
                  will_topic: str | None = None, level: int = 4) -> bytes:
    name = "MQIsdp" if level == 3 else "MQTT"
    flags = 0x02
    tail = b""
    if will_topic is not None:
        flags |= 0x04
        tail += mstr(will_topic) + mstr(b"x")
    if username is not None:
        flags |= 0x80
        tail += mstr(username)
    return raw_connect(name, level, client_id, flags=flags, tail=tail)


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("make,reason", [
    (lambda u, lv: _connect_with(u + "\x01", level=lv), "client identifier .*U\\+0001"),
    (lambda u, lv: _connect_with(u, username="user\x1f", level=lv), "user name .*U\\+001F"),
    (lambda u, lv: _connect_with(u, will_topic="w/\x7f", level=lv), "will topic .*U\\+007F"),
], ids=["client-id", "username", "will-topic"])
def test_control_characters_in_connect_close(broker, sockets, level: int, make,
                                             reason: str) -> None:
    """Control characters in the client id, user name or will topic close the
    connection without CONNACK (they were accepted before)."""
    c = sockets(level=level)
    c.send(make(uid("c"), level))
    closed_with_reason(broker, c, reason)


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("make,reason", [
    (lambda t: frame(0x30, mstr(t + "/\u0085") + b"x"), "PUBLISH topic .*U\\+0085"),
    (lambda t: frame(0x32, mstr(t + "/\x09") + u16(1) + b"x"), "PUBLISH topic .*U\\+0009"),
    (lambda t: frame(0x82, u16(1) + mstr(t + "/\u009f") + b"\x00"),
     "SUBSCRIBE topic filter .*U\\+009F"),
    (lambda t: frame(0xA2, u16(1) + mstr(t + "/\x1b")), "UNSUBSCRIBE topic filter .*U\\+001B"),
], ids=["publish-c1", "publish-tab-qos1", "subscribe", "unsubscribe"])
def test_control_characters_in_topics_and_filters_close(broker, raw, level: int, make,
                                                        reason: str) -> None:
    """Control characters (C0 and C1) in topic names and filters close the connection,
    with nothing answered."""
    c = raw(uid("c"), level=level)
    c.send(make(uid("t")))
    closed_with_reason(broker, c, reason)


def test_allow_control_chars_accepts_them(start_broker) -> None:
    """With --allow-control-chars, ids, user names, will topics, topics and filters
    with control characters are accepted and routed."""
    proc = start_broker("--allow-control-chars")
    topic = uid("cc") + "/\x01\u0085"
    sub = RawClient(proc.mqtt_port)
    pub = RawClient(proc.mqtt_port)
    try:
        sub.send(_connect_with(uid("s") + "\x02", username="u\x1f", will_topic="w/\x7f"))
        assert sub.recv() == Connack(False, 0)
        assert sub.subscribe((topic, 1)) == (1,)
        assert pub.connect(uid("p")).return_code == 0
        pub.publish(topic, b"ctl", 1)
        msg = sub.receive_acked()
        assert (msg.topic, msg.payload) == (topic, b"ctl")
        sub.unsubscribe(topic)
    finally:
        sub.close()
        pub.close()


# ==================================================================================
# 5. Invalid topic filters


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("bad", ["ab/+e", "a/#/b", "x#", "+a"])
def test_subscribe_invalid_filter_closes(broker, raw, level: int, bad: str) -> None:
    """An invalid filter in SUBSCRIBE closes the connection: no SUBACK (0x80 before),
    and the valid filters of the same packet are not subscribed either."""
    base = uid("f")
    c = raw(uid("c"), level=level)
    c.send(Subscribe(7, ((f"{base}/ok", 1), (f"{base}/{bad}", 1))))
    closed_with_reason(broker, c, "SUBSCRIBE topic filter .* is invalid")
    still_routes(raw, f"{base}/ok")


@pytest.mark.parametrize("level", [3, 4])
def test_unsubscribe_invalid_filter_closes(broker, raw, level: int) -> None:
    """An invalid filter in UNSUBSCRIBE closes the connection: no UNSUBACK."""
    c = raw(uid("c"), level=level)
    c.send(Unsubscribe(3, ("ab/+e",)))
    closed_with_reason(broker, c, "UNSUBSCRIBE topic filter 'ab/\\+e' is invalid")


# ==================================================================================
# 6. QoS 2: PUBREC before the forwarded message


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "persistent"])
@pytest.mark.parametrize("granted", [0, 1, 2])
def test_qos2_pubrec_before_forward_to_self(raw, clean: bool, granted: int) -> None:
    """A client subscribed to its own topic sees its PUBREC before the forwarded
    PUBLISH (it saw the PUBLISH first before), and the exchange completes once."""
    topic = uid("o") + "/t"
    c = raw(uid("c"), clean=clean)
    assert c.subscribe((topic, granted)) == (granted,)
    c.send(Publish(topic, b"q2", 2, False, False, 11))
    first = c.recv()
    assert first == Pubrec(11), f"expected PUBREC first, got {first!r}"
    forwarded = c.recv()
    assert isinstance(forwarded, Publish)
    assert (forwarded.topic, forwarded.payload, forwarded.qos) == (topic, b"q2", granted)
    c.send(Pubrel(11))
    c.expect(Pubcomp, 11)
    c.ack(forwarded)
    c.publish(topic, b"marker", 0)
    assert c.receive().payload == b"marker"  # exactly once: no second copy before it


def test_qos2_pubrec_before_forward_with_persistent_subscriber(raw) -> None:
    """With a persistent subscriber on the same socket (its copy is stored in the
    commit PUBREC waits for), PUBREC still comes first; other subscribers get it."""
    topic = uid("o") + "/t"
    other = raw(uid("x"), clean=False)
    other.subscribe((topic, 2))
    c = raw(uid("c"), clean=False)
    c.subscribe((topic, 2))
    for pid in (21, 22, 23):
        c.send(Publish(topic, b"m%d" % pid, 2, False, False, pid))
    got = [c.recv() for _ in range(6)]
    pubrecs = [i for i, p in enumerate(got) if isinstance(p, Pubrec)]
    publishes = [i for i, p in enumerate(got) if isinstance(p, Publish)]
    assert [got[i] for i in pubrecs] == [Pubrec(21), Pubrec(22), Pubrec(23)]
    for n, i in enumerate(publishes):
        assert pubrecs[n] < i, f"PUBLISH before its PUBREC: {got!r}"
    assert [got[i].payload for i in publishes] == [b"m21", b"m22", b"m23"]  # type: ignore[union-attr]
    assert [other.receive_acked().payload for _ in range(3)] == [b"m21", b"m22", b"m23"]


# ==================================================================================
# 7. Will on takeover


def test_takeover_resuming_persistent_session_publishes_no_will(raw) -> None:
    """A newcomer that resumes the persistent session (clean session 0) closes the
    old connection without publishing its will (it was published before); one that
    starts clean, or that takes over a clean session, gets the will published."""
    base = uid("k")
    observer = raw(uid("o"))
    observer.subscribe((f"{base}/will", 1), (f"{base}/marker", 0))

    def takeover(old_clean: bool, new_clean: bool, payload: bytes) -> RawClient:
        cid = uid("t")
        old = raw(cid, clean=old_clean, will=Will(f"{base}/will", payload, 1, False))
        new = raw(cid, clean=new_clean)
        assert old.wait_closed() == []
        return new

    takeover(False, False, b"resumed")
    raw(uid("p")).publish(f"{base}/marker", b"m1", 0)
    assert observer.recv() == Publish(f"{base}/marker", b"m1")  # no will before it

    takeover(False, True, b"clean newcomer")
    will = observer.receive_acked()
    assert will.payload == b"clean newcomer"

    takeover(True, False, b"clean old session")
    will = observer.receive_acked()
    assert will.payload == b"clean old session"


# ==================================================================================
# 8. Long MQTT 3.1 client ids


@pytest.mark.parametrize("length", [24, 100, 5000])
def test_mqtt31_long_client_id_accepted(sockets, length: int) -> None:
    """3.1 client ids over 23 characters are accepted (CONNACK 2 before) and work."""
    cid = (uid("L") + "x" * length)[:length]
    c = sockets(level=3)
    assert c.connect(cid, clean=False).return_code == 0
    topic = uid("l") + "/t"
    assert c.subscribe((topic, 1)) == (1,)
    c.publish(topic, b"long id", 1)
    assert c.receive_acked().payload == b"long id"


def test_strict_mqtt31_refuses_long_client_ids(start_broker) -> None:
    """--strict-mqtt31 enforces 3.1's 1-23 characters (CONNACK 2); 3.1.1 is unaffected."""
    proc = start_broker("--strict-mqtt31")
    long_id = (uid("s") + "x" * 30)[:24]
    c = RawClient(proc.mqtt_port, level=3)
    ok = RawClient(proc.mqtt_port, level=3)
    v4 = RawClient(proc.mqtt_port)
    try:
        assert c.connect(long_id).return_code == 2
        assert c.wait_closed() == []
        proc.wait_for_line("client id must be 1-23 characters", timeout=TIMEOUT)
        assert ok.connect(long_id[:23]).return_code == 0
        assert v4.connect(long_id).return_code == 0
    finally:
        for client in (c, ok, v4):
            client.close()


# ==================================================================================
# 9. Topic levels and length


def test_topic_with_more_than_200_levels_closes(broker, raw) -> None:
    """By default (--max-topic-levels 200) a topic of 201 levels closes the connection;
    200 levels are fine."""
    base = uid("lv")
    c = raw(uid("c"))
    ok = base + "/x" * 199
    assert ok.count("/") + 1 == 200
    c.publish(ok, b"200", 1)
    c.send(Publish(ok + "/y", b"201"))
    closed_with_reason(broker, c, "PUBLISH topic has 201 levels, more than "
                                  "--max-topic-levels 200")


def test_filter_with_more_than_200_levels_closes(broker, raw) -> None:
    """A filter of 201 levels closes the connection, without SUBACK."""
    c = raw(uid("c"))
    c.send(Subscribe(1, (("+/" * 200 + "#", 0),)))
    closed_with_reason(broker, c, "SUBSCRIBE topic filter has 201 levels")


def test_max_topic_levels_and_length_options(start_broker) -> None:
    """--max-topic-levels and --max-topic-length apply to topic names, filters and
    will topics; each breach closes the connection with its logged reason."""
    proc = start_broker("--max-topic-levels", "4", "--max-topic-length", "24")
    made: list[RawClient] = []

    def client(level: int = 4) -> RawClient:
        c = RawClient(proc.mqtt_port, level)
        made.append(c)
        return c

    try:
        c = client()
        assert c.connect(uid("a")).return_code == 0
        assert c.subscribe(("a/b/c/d", 1), ("a/+/c/#", 0)) == (1, 0)
        c.publish("a/b/c/d", b"fits", 1)
        assert c.receive_acked().payload == b"fits"
        cases: list[tuple[Callable[[RawClient], None], str]] = [
            (lambda c: c.send(Publish("a/b/c/d/e", b"x")), "PUBLISH topic has 5 levels"),
            (lambda c: c.send(Publish("t" * 25, b"x")),
             "PUBLISH topic is 25 bytes, longer than --max-topic-length 24"),
            (lambda c: c.send(Publish("\u00e9" * 13, b"x")), "PUBLISH topic is 26 bytes"),
            (lambda c: c.send(Subscribe(1, (("a/b/c/d/#", 0),))),
             "SUBSCRIBE topic filter has 5 levels"),
            (lambda c: c.send(Unsubscribe(1, ("u" * 30,))),
             "UNSUBSCRIBE topic filter is 30 bytes"),
        ]
        for act, reason in cases:
            for level in (3, 4):
                c = client(level)
                assert c.connect(uid("b")).return_code == 0
                act(c)
                closed_with_reason(proc, c, reason)
        w = client()
        w.send(_connect_with(uid("w"), will_topic="w/1/2/3/4"))
        closed_with_reason(proc, w, "CONNECT will topic has 5 levels")
    finally:
        for c in made:
            c.close()


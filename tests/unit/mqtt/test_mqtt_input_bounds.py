"""What one MQTT client's input may cost the broker (issue 26, section 4).

* MQTT 5 user properties are bounded per property block, in count
  (``--max-user-properties``) and in bytes of names and values
  (``--max-user-property-bytes``): the codec refuses a block beyond either with
  0x97 at the first property too many, so a 100,000-property packet is not
  decoded; the connection is closed with DISCONNECT 0x97 (CONNACK 0x97 for a
  CONNECT), counted in ``$SYS/broker/limits/<name>`` and logged once a minute.
* One connection's input is handled for at most ``--mqtt-turn-ms`` in one reactor
  turn; the rest waits, unread, for a later turn, in order.

Codec and protocol tests run in memory (``StringTransport``, ``task.Clock``: the
protocol tests make time pass inside a handler, as an expensive packet would);
the last ones talk raw MQTT 5 to a real broker.
"""

from __future__ import annotations

import select
import socket
from typing import Any

import pytest
from fakes import NullStore, timers_left
from hypothesis import given
from hypothesis import strategies as st
from mqtt_memory import FakeLink, Harness, closed_with, connected
from mqtt_strategies import STRATEGIES, pairs, raw_pair, raw_publish, users
from twisted.internet.task import Clock

from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.codec import Decoder, MalformedPacket, PropertyLimits, encode
from mqttamqp.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqttamqp.mqtt.properties import encode_varint
from mqttamqp.mqtt.protocol import MQTTFactory
from mqttamqp.net.tcp import others_waiting

# --------------------------------------------------------------------------
# helpers


def decoder(count: int = 128, size: int = 1 << 16, sub_ids: int = 1) -> Decoder:
    return Decoder(protocol_level=5, property_limits=PropertyLimits(count, size, sub_ids))


def decode_all(data: bytes, d: Decoder) -> list[Packet]:
    d.feed(data)
    return list(d)


def refusal(data: bytes, d: Decoder) -> MalformedPacket:
    d.feed(data)
    with pytest.raises(MalformedPacket) as info:
        d.next_packet()
    return info.value


# --------------------------------------------------------------------------
# the codec


def test_user_properties_beyond_the_count_raise_0x97() -> None:
    """A block with one user property more than the limit raises 0x97 naming the
    limit; a block at the limit decodes whole."""
    at = Publish("t", b"x", properties=users(3))
    assert decode_all(encode(at, 5), decoder(count=3)) == [at]
    exc = refusal(encode(Publish("t", b"x", properties=users(4)), 5), decoder(count=3))
    assert (exc.code, exc.limit) == (0x97, "user_properties")
    assert "more than 3 user properties" in exc.reason


def test_user_property_bytes_count_names_and_values_in_utf8() -> None:
    """The bytes limit counts the UTF-8 bytes of names and values (not the length
    prefixes); one byte over raises 0x97 naming that limit."""
    fits = Publish("t", b"x", properties=Properties(user_properties=(("ab", "cde"),
                                                                      ("fg", "hé"))))
    assert decode_all(encode(fits, 5), decoder(size=10)) == [fits]     # 5 + 5 bytes
    over = Publish("t", b"x", properties=Properties(user_properties=(("ab", "cde"),
                                                                      ("fg", "hé!"))))
    exc = refusal(encode(over, 5), decoder(size=10))
    assert (exc.code, exc.limit) == (0x97, "user_property_bytes")


def test_a_huge_block_is_refused_before_the_properties_beyond_the_limit_are_read() -> None:
    """The refusal comes at the first property too many: property 200 (invalid
    UTF-8, which would be 0x81) is never decoded under a limit of 128."""
    body = raw_pair(b"k", b"v") * 199 + raw_pair(b"\xff", b"v")
    exc = refusal(raw_publish(body), decoder(count=128))
    assert (exc.code, exc.limit) == (0x97, "user_properties")
    assert refusal(raw_publish(body), decoder(count=1000)).code == 0x81


def test_the_issue_packet_of_100k_user_properties_is_refused() -> None:
    """The issue's packet (100,000 user properties, 700 KB) raises 0x97 under the
    default limit of 128, fed whole or a byte at a time (None until it is all
    there)."""
    data = raw_publish(raw_pair(b"k", b"v") * 100_000)
    assert refusal(data, decoder()).code == 0x97
    d = decoder()
    for i in range(len(data) - 1):
        d.feed(data[i:i + 1])
        assert d.next_packet() is None
    assert refusal(data[-1:], d).limit == "user_properties"


def test_byte_at_a_time_at_the_limit_decodes() -> None:
    """A stream of packets at the limits fed a byte at a time decodes whole."""
    packets = [Publish("t", b"x", properties=users(4)),
               Subscribe(1, (("a/#", 1),), (0,), users(4)),
               Puback(3, 0x10, users(4)), Disconnect(0, users(4))]
    stream = b"".join(encode(p, 5) for p in packets)
    d = decoder(count=4)
    got: list[Packet] = []
    for i in range(len(stream)):
        d.feed(stream[i:i + 1])
        got.extend(d)
    assert got == packets


@pytest.mark.parametrize("packet", [
    Subscribe(1, (("a/#", 1),), (0,), users(3)),
    Unsubscribe(1, ("a/#",), users(3)),
    Puback(2, 0, users(3)),
    Disconnect(0, users(3)),
    Auth(0x18, users(3, authentication_method="SCRAM-SHA-256")),
], ids=lambda p: type(p).__name__)
def test_every_packet_with_properties_is_bounded(packet: Packet) -> None:
    """The limit holds in every packet that carries properties, not only PUBLISH."""
    assert refusal(encode(packet, 5), decoder(count=2)).code == 0x97


def test_connect_and_its_will_have_a_limit_each() -> None:
    """A CONNECT's own properties and its will's are blocks of their own; beyond
    the limit in either, the error says the CONNECT is to be answered (CONNACK)."""
    will = Will("w", b"gone", 0, False, users(2))
    ok = Connect("MQTT", 5, "c", True, 0, will, properties=users(2))
    assert decode_all(encode(ok, 5), decoder(count=2)) == [ok]
    for bad in (Connect("MQTT", 5, "c", True, 0, will, properties=users(3)),
                Connect("MQTT", 5, "c", True, 0, Will("w", b"", 0, False, users(3)))):
        exc = refusal(encode(bad, 5), Decoder(property_limits=PropertyLimits(2)))
        assert (exc.code, exc.in_connect5) == (0x97, True)


def test_subscription_identifiers_are_bounded_too() -> None:
    """A client sends at most one subscription identifier: a PUBLISH with a second
    is refused at the second (0x82), as a second in SUBSCRIBE always was."""
    two = Publish("t", b"x", properties=Properties(subscription_identifiers=(1, 2)))
    assert refusal(encode(two, 5), decoder(sub_ids=1)).code == 0x82
    assert decode_all(encode(two, 5), Decoder(protocol_level=5)) == [two]   # no bound


def test_a_decoder_without_limits_takes_what_the_packet_size_allows() -> None:
    """The default decoder (a client's) has no property bound."""
    packet = Publish("t", b"x", properties=users(5000))
    assert decode_all(encode(packet, 5), Decoder(protocol_level=5)) == [packet]


@given(data=st.data(), count=st.integers(0, 3), size=st.integers(0, 12))
def test_any_packet_decodes_whole_or_is_refused_for_its_properties(
        data: st.DataObject, count: int, size: int) -> None:
    """Under any limits a valid packet decodes to itself when every block is within
    them, and raises 0x97 when one is not."""
    packet = data.draw(st.sampled_from(sorted(STRATEGIES)).flatmap(STRATEGIES.__getitem__))
    blocks = [getattr(packet, "properties", None)]
    will = getattr(packet, "will", None)
    if will is not None:
        blocks.append(will.properties)
    over = any(b is not None and (
        len(b.user_properties) > count
        or sum(len(k.encode()) + len(v.encode()) for k, v in b.user_properties) > size)
        for b in blocks)
    d = Decoder(protocol_level=5, property_limits=PropertyLimits(count, size))
    d.feed(encode(packet, 5))
    if over:
        with pytest.raises(MalformedPacket) as info:
            d.next_packet()
        assert info.value.code == 0x97
    else:
        assert d.next_packet() == packet


# --------------------------------------------------------------------------
# the connection: the refusal


def test_publish_beyond_the_limit_closes_with_0x97(log_lines: list[str]) -> None:
    """A PUBLISH beyond --max-user-properties: DISCONNECT 0x97 with a reason string,
    nothing routed, counted under limits/user_properties, one log line for two
    clients; a PUBLISH at the limit is routed with every property."""
    h = Harness(max_user_properties=4)
    watcher = h.watcher("t/#")
    ok = connected(h, "ok")
    ok.send(Publish("t/a", b"1", properties=users(4)))
    [(message, *_)] = watcher.published()
    assert message.props.user_properties == pairs(4)
    for name in ("bad1", "bad2"):
        c = connected(h, name)
        c.send(Publish("t/b", b"2", properties=users(5)))
        got = closed_with(c, 0x97)
        assert got.properties is not None and "more than 4 user properties" in (
            got.properties.reason_string or "")
    assert len(watcher.published()) == 1
    assert h.broker.stats.limits == {"user_properties": 2}
    lines = [line for line in log_lines if "went beyond a limit" in line]
    assert len(lines) == 1 and "0x97" in lines[0] and "bad1" in lines[0]
    assert ok.open


def test_user_property_bytes_close_with_0x97() -> None:
    """Beyond --max-user-property-bytes: DISCONNECT 0x97, counted under its name."""
    h = Harness(max_user_property_bytes=8)
    c = connected(h)
    c.send(Subscribe(1, (("a", 0),), (0,), Properties(user_properties=(("name", "value"),))))
    closed_with(c, 0x97)
    assert h.broker.stats.limits == {"user_property_bytes": 1}


def test_a_subscribe_beyond_the_filter_limit_is_refused_before_its_rest_is_read() -> None:
    """A SUBSCRIBE with more filters than --max-subscribe-filters raises 0x97 at the
    first filter too many (the rest is never read: the filter after it is not even
    valid), at MQTT 5 and 3.1.1 alike; one at the limit decodes."""
    limits = PropertyLimits(subscribe_filters=3)
    at = Subscribe(7, tuple((f"f/{i}", 0) for i in range(3)), (0,) * 3)
    assert decode_all(encode(at, 5), Decoder(protocol_level=5, property_limits=limits)) == [at]
    over = encode(Subscribe(7, (*((f"f/{i}", 0) for i in range(4)), ("a/#/b", 0)),
                            (0,) * 5), 5)
    error = refusal(over, Decoder(protocol_level=5, property_limits=limits))
    assert error.code == 0x97 and error.limit == "subscribe_filters"
    assert "more than 3 topic filters" in error.reason
    over4 = encode(Subscribe(7, tuple((f"f/{i}", 0) for i in range(4))), 4)
    assert refusal(over4, Decoder(protocol_level=4, property_limits=limits)).code == 0x97


def test_a_packet_only_servers_send_is_refused_at_its_fixed_header() -> None:
    """A server's decoder refuses CONNACK, SUBACK, UNSUBACK and PINGRESP from a client
    at the first byte, before the rest (a 1 MB SUBACK) has even arrived; a client's
    decoder takes them."""
    for packet in (Connack(False, 0), Suback(1, (0,)), Unsuback(1, (0,)), Pingresp()):
        data = encode(packet, 5)
        d = Decoder(protocol_level=5, server=True)
        d.feed(data[:1])                                # the fixed header's first byte
        with pytest.raises(MalformedPacket) as info:
            d.next_packet()
        assert info.value.code == 0x82 and "a client may not send" in info.value.reason
        assert decode_all(data, Decoder(protocol_level=5)) == [packet]
    huge = bytes([0x90]) + encode_varint(1 << 20)       # a SUBACK announcing 1 MB
    d = Decoder(protocol_level=5, server=True)
    d.feed(huge)
    with pytest.raises(MalformedPacket):
        d.next_packet()


def test_a_subscribe_beyond_the_filter_limit_closes_with_0x97() -> None:
    """The connection: DISCONNECT 0x97, nothing subscribed, counted under
    limits/subscribe_filters."""
    h = Harness(max_subscribe_filters=2)
    c = connected(h)
    c.send(Subscribe(1, (("a", 0), ("b", 0), ("c", 0)), (0, 0, 0)))
    closed_with(c, 0x97)
    assert h.broker.stats.limits == {"subscribe_filters": 1}


def test_connect_beyond_the_limit_gets_connack_0x97() -> None:
    """A CONNECT (or its will) beyond the limit is answered CONNACK 0x97 and closed;
    no session is made."""
    h = Harness(max_user_properties=2)
    c = h.client()
    c.proto.dataReceived(encode(Connect("MQTT", 5, "big", True, 0, properties=users(3)), 5))
    d = Decoder(protocol_level=5)
    d.feed(c.transport.value())
    [ack] = list(d)
    assert isinstance(ack, Connack) and ack.return_code == 0x97
    assert c.transport.disconnecting
    assert "big" not in h.broker.sessions
    assert h.broker.stats.limits == {"user_properties": 1}


# --------------------------------------------------------------------------
# the connection: work per reactor turn


class CostlyLink(FakeLink):
    """A subscriber whose every delivery takes ``cost`` seconds of ``clock``."""

    def __init__(self, clock: Any, cost: float) -> None:
        super().__init__()
        self.clock = clock
        self.cost = cost

    def send_publish(self, *args: Any) -> None:
        super().send_publish(*args)
        self.clock.advance(self.cost)


def reactor_turn(clock: Any) -> None:
    """The timed calls of one reactor iteration: those due now run, and what they
    schedule for now waits for the next iteration, after the reactor has polled
    (Twisted's ``runUntilCurrent``; ``Clock.advance(0)`` would run those too)."""
    now = clock.seconds()
    for call in [c for c in clock.getDelayedCalls() if c.getTime() <= now]:
        clock.calls.remove(call)
        call.called = 1
        call.func(*call.args, **call.kw)


def costly_watcher(h: Harness, cost: float) -> CostlyLink:
    link = CostlyLink(h.clock, cost)
    session = h.broker.open_session(link, "costly", True, None).session
    h.broker.activate(session, link, "test")
    from mqttamqp.core.auth import Identity
    h.broker.subscribe(session, Identity("costly"), [("t/#", 0)])
    return link


def test_input_beyond_the_turn_waits_for_the_next_turn() -> None:
    """Packets that take 2 ms each with --mqtt-turn-ms 5: three are handled in the
    read's turn, then the connection is not read and the rest waits for a later
    turn, after one poll of the reactor (the turn after the read's handles none:
    its poll reads the others first); each such turn handles three more, in
    order, the PINGREQ after them; then reading resumes and no timer is left."""
    h = Harness(mqtt_turn=0.005)
    link = costly_watcher(h, 0.002)
    c = connected(h)
    c.send(*[Publish("t/a", str(i).encode()) for i in range(10)], Pingreq())
    seen = [len(link.published())]
    assert c.transport.producerState == "paused"
    assert c.received() == []
    while c.transport.producerState == "paused":
        reactor_turn(h.clock)
        seen.append(len(link.published()))
    assert seen == [3, 3, 6, 6, 9, 9, 10]
    assert [m.payload for m, *_ in link.published()] == [str(i).encode() for i in range(10)]
    assert c.received() == [Pingresp()]
    assert h.broker.stats.mqtt_turns_yielded == 3
    assert timers_left(h.clock) == []


def test_cheap_input_is_handled_in_one_turn() -> None:
    """Packets that take no time: a thousand in one read are handled at once, with
    no pause and nothing scheduled (throughput pays nothing for the bound)."""
    h = Harness(mqtt_turn=0.005)
    watcher = h.watcher("t/#")
    c = connected(h)
    c.send(*[Publish("t/a", b"x") for _ in range(1000)])
    assert len(watcher.published()) == 1000
    assert c.transport.producerState == "producing"
    assert h.broker.stats.mqtt_turns_yielded == 0
    assert timers_left(h.clock) == []


def test_input_that_arrives_while_held_keeps_its_place() -> None:
    """Bytes delivered while the connection waits for its next turn (a TLS record
    already decrypted, say) are only buffered: handled after what was held."""
    h = Harness(mqtt_turn=0.005)
    link = costly_watcher(h, 0.004)
    c = connected(h)
    c.send(*[Publish("t/a", str(i).encode()) for i in range(3)])
    assert len(link.published()) == 2
    c.send(Publish("t/a", b"late"))
    assert len(link.published()) == 2
    while c.transport.producerState == "paused":
        reactor_turn(h.clock)
    assert [m.payload for m, *_ in link.published()] == [b"0", b"1", b"2", b"late"]


def test_a_connection_closed_while_held_leaves_no_timer() -> None:
    """Closed while its input waits for the next turn: the turn's timer is cancelled
    and nothing more of its input is handled."""
    h = Harness(mqtt_turn=0.005)
    link = costly_watcher(h, 0.004)
    c = connected(h, keepalive=0)
    c.send(*[Publish("t/a", b"x") for _ in range(5)])
    assert len(link.published()) == 2
    c.proto.close("closed from the console")
    c.lost()
    reactor_turn(h.clock)
    assert len(link.published()) == 2
    assert timers_left(h.clock) == []


class PollingClock(Clock):
    """A ``Clock`` with a poll-like reactor's poller, reporting ``ready``."""

    _POLL_IN = select.EPOLLIN
    _POLL_DISCONNECTED = select.EPOLLHUP | select.EPOLLERR

    def __init__(self) -> None:
        super().__init__()
        self.ready: list[tuple[int, int]] = []
        self._poller = self

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        assert timeout == 0
        return self.ready


class PollingHarness(Harness):
    """A ``Harness`` on a ``PollingClock``."""

    def __init__(self, **limits: Any) -> None:
        limits.setdefault("sys_interval", 0)
        self.clock = self.polling = PollingClock()
        self.store = NullStore()
        self.broker = Broker(self.clock, self.store, Limits(**limits))
        self.factory = MQTTFactory(self.broker, self.clock)


def test_the_turn_goes_on_while_nobody_else_waits() -> None:
    """With nobody else to read (the reactor's poller says so) a connection goes on
    past its share; once another socket has input it stops at the next check."""
    h = PollingHarness(mqtt_turn=0.005)
    clock = h.polling
    link = costly_watcher(h, 0.002)
    c = connected(h)
    c.send(*[Publish("t/a", b"x") for _ in range(10)])
    assert len(link.published()) == 10                  # nobody waited: one turn
    assert c.transport.producerState == "producing"
    clock.ready = [(99, select.EPOLLOUT)]               # (writable is not waiting)
    c.send(*[Publish("t/a", b"x") for _ in range(10)])
    assert len(link.published()) == 20
    clock.ready = [(99, select.EPOLLIN)]
    c.send(*[Publish("t/a", b"x") for _ in range(10)])
    assert len(link.published()) == 23
    assert c.transport.producerState == "paused"


def test_others_waiting_asks_the_real_poller_without_taking_its_events() -> None:
    """``net.tcp.others_waiting`` on a real epoll: input on the connection's own
    socket does not count, on another one does, and asking again (the reactor's
    own poll) still finds it; a reactor without a poller: True."""
    poller = select.epoll()
    reactor = type("Reactor", (), {"_poller": poller, "_POLL_IN": select.EPOLLIN,
                                   "_POLL_DISCONNECTED": select.EPOLLHUP})()
    own, own_peer = socket.socketpair()
    other, other_peer = socket.socketpair()
    try:
        for sock in (own, other):
            poller.register(sock.fileno(), select.EPOLLIN)
        assert not others_waiting(reactor, own.fileno())
        own_peer.sendall(b"more of the same client")
        assert not others_waiting(reactor, own.fileno())
        other_peer.sendall(b"\xc0\x00")                  # another client's PINGREQ
        assert others_waiting(reactor, own.fileno())
        assert others_waiting(reactor, own.fileno())
        assert {fd for fd, _ in poller.poll(0)} == {own.fileno(), other.fileno()}
        assert others_waiting(Clock(), own.fileno())
    finally:
        poller.close()
        for sock in (own, own_peer, other, other_peer):
            sock.close()


def test_no_turn_bound_when_zero() -> None:
    """--mqtt-turn-ms 0: a read is handled whole however long it takes."""
    h = Harness(mqtt_turn=0)
    link = costly_watcher(h, 0.004)
    c = connected(h)
    c.send(*[Publish("t/a", b"x") for _ in range(10)])
    assert len(link.published()) == 10
    assert c.transport.producerState == "producing"




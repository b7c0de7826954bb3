"""What one MQTT client's input may cost the broker (issue 26, section 4).

MQTT 5 user properties are bounded per property block, in count
(``--max-user-properties``) and in bytes of names and values
(``--max-user-property-bytes``): the codec refuses a block beyond either with
0x97 at the first property too many, so a 100,000-property packet is not
decoded; the connection is closed with DISCONNECT 0x97 (CONNACK 0x97 for a
CONNECT), counted in ``$SYS/broker/limits/<name>`` and logged once a minute.

Codec and protocol tests run in memory (``StringTransport``, ``task.Clock``); the
last ones talk raw MQTT 5 to a real broker.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from brokerproc import BrokerProcess
from hypothesis import given
from hypothesis import strategies as st
from test_mqtt_raw import RawClient
from test_protocol5_unit import closed_with, connected
from test_protocol_unit import Harness

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
    Unsubscribe,
    Will,
)
from mqttamqp.mqtt.properties import encode_varint
from tests.test_codec5 import STRATEGIES

# --------------------------------------------------------------------------
# helpers


def pairs(n: int, name: str = "k", value: str = "v") -> tuple[tuple[str, str], ...]:
    return tuple((name, value) for _ in range(n))


def users(n: int, **more: Any) -> Properties:
    return Properties(user_properties=pairs(n), **more)


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


def raw_publish(props_body: bytes, topic: bytes = b"t") -> bytes:
    """A QoS 0 PUBLISH with this property block body (built by hand)."""
    body = len(topic).to_bytes(2, "big") + topic + encode_varint(len(props_body)) \
        + props_body + b"x"
    return b"\x30" + encode_varint(len(body)) + body


def raw_pair(name: bytes, value: bytes) -> bytes:
    return (b"\x26" + len(name).to_bytes(2, "big") + name
            + len(value).to_bytes(2, "big") + value)


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
# the real broker, raw MQTT 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("bounds")),
                         "--max-user-properties", "16", listeners=("--mqtt", "--metrics"))
    proc.start()
    yield proc
    proc.stop()


def client5(broker: BrokerProcess, client_id: str) -> RawClient:
    c = RawClient(broker.mqtt_port, level=5)
    c.send(Connect("MQTT", 5, client_id, True, 0))
    ack = c.expect(Connack)
    assert isinstance(ack, Connack) and ack.return_code == 0
    return c


def metric(broker: BrokerProcess, name: str) -> float:
    url = f"http://127.0.0.1:{broker.ports['METRICS']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_real_broker_refuses_too_many_user_properties(broker: BrokerProcess) -> None:
    """The issue's packet (100,000 user properties) gets DISCONNECT 0x97 and a
    closed socket; one log line; the limit is counted in /metrics; a packet at the
    limit reaches a subscriber with its properties."""
    sub = client5(broker, "bounds-sub")
    sub.send(Subscribe(1, (("bounds/#", 0),), (0,)))
    sub.expect(Suback)
    pub = client5(broker, "bounds-pub")
    pub.send(Publish("bounds/ok", b"x", properties=users(16)))
    got = sub.expect(Publish)
    assert isinstance(got, Publish) and got.properties is not None
    assert got.properties.user_properties == pairs(16)
    bad = client5(broker, "bounds-bad")
    bad.send(raw_publish(raw_pair(b"k", b"v") * 100_000, b"bounds/bad"))
    closing = bad.wait_closed()
    assert [type(p) for p in closing] == [Disconnect]
    assert isinstance(closing[0], Disconnect) and closing[0].reason_code == 0x97
    broker.wait_for_line(r"bounds-bad .* went beyond a limit: .*more than 16 user properties")
    assert metric(broker, 'mqttamqp_limit_hits_total{limit="user_properties"}') >= 1
    sub.send(Pingreq())
    sub.expect(Pingresp)
    assert [p for p in sub.backlog if isinstance(p, Publish)] == []

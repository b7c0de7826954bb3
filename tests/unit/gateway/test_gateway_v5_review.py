"""A reviewer's findings on MQTT 5 through a gateway (issue #29 §1): each as the
broker does it; against the in-memory core (``gateway_memory``, ``amqp_memory``)."""

from __future__ import annotations

from amqp_memory import ACCEPTED, REJECTED, Net, outcome
from amqp_messages import control
from gateway_memory import Gateway
from proton import symbol, ulong
from test_gateway_acks import mqtt5_client
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.amqp.codec.contract import Mqtt5Props, mqtt5_props
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.gateway.wire import will_message
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Publish,
    Suback,
    Subscribe,
    Will,
)


def test_a_will_declared_utf8_that_is_not_is_accepted_and_published() -> None:
    """A will with payload format 1 and a non-UTF-8 payload is accepted (CONNACK 0,
    as the broker does) and published on a brute end, without the declaration."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    watcher = net.mqtt("watchbad", level=5)
    watcher.subscribe(("wb/#", 1))
    will = Will("wb/gone", b"\xff\xfe", 1, False, Properties(payload_format_indicator=1))
    proto = gw.factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 5, "dyingbad", True, 0, will), 5))
    net.pump()
    dec = Decoder(protocol_level=5)
    dec.feed(transport.value())
    (connack,) = [p for p in dec if isinstance(p, Connack)]
    assert connack.return_code == 0
    proto.connectionLost(Failure(ConnectionDone()))
    net.pump()
    (got,) = watcher.publishes()
    assert (got.topic, got.payload) == ("wb/gone", b"\xff\xfe")
    assert got.properties is None or got.properties.payload_format_indicator is None


def test_a_repeated_filter_carries_the_options_of_the_entry_granted() -> None:
    """A shared filter given twice, without and then with No Local, gets SUBACK
    (0, 0x8F); the core stores the granted entry's options (no No Local)."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5twice")
    send(Subscribe(1, (("$share/g/t", 0), ("$share/g/t", 0)), options=(0, 0x04)))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (0, 0x8F)
    session = net.broker.sessions["v5twice"]
    assert "$share/g/t" in session.subscriptions
    assert session.sub_options.get("$share/g/t", 0) == 0


def test_a_will_with_message_expiry_0_reaches_the_core_as_ttl_0() -> None:
    """A will's message expiry interval 0 goes with AMQP_WILL as header.ttl 0 (not
    left out: a will that never expires), and AMQP_WILL keeps its subject and topic."""
    wire = decode_message(will_message("c0", "w0/gone", b"bye", 1, False, Mqtt5Props(
        None, 0, None, None, None, ())))
    props = mqtt5_props(wire)
    assert props is not None and props.expiry_interval == 0
    assert (wire.subject, wire.to) == ("will", "w0/gone")


def test_an_invalid_topic_name_closes_with_0x90_and_an_empty_one_with_0x82() -> None:
    """A PUBLISH to a topic with a control character closes an MQTT 5 client with
    0x90 (topic name invalid, as the broker does); an empty one, no alias, with 0x82."""
    for topic, code in (("a/\x01", 0x90), ("", 0x82)):
        net = Net()
        gw = Gateway(net, connections=1, credit=4)
        send, take = mqtt5_client(net, gw, "v5topic")
        send(Publish(topic, b"x", 0, False, False, None))
        assert [p.reason_code for p in take() if isinstance(p, Disconnect)] == [code]
        assert gw.factory.published == 0


def test_retain_handling_3_or_a_reserved_bit_from_an_amqp_peer_is_a_decode_error() -> None:
    """AMQP_SUBSCRIBE whose options byte has retain handling 3 (0x30) or a reserved
    bit (0x40, 0x80) is Rejected with amqp:decode-error; retain handling 2 is taken."""
    net = Net()
    net.mqtt("ro", clean=False).disconnect()
    fe = net.fe("ro")
    fe.list()
    fe.attach_publish()

    def subscribe(option: int, packet_id: int) -> tuple[int, str | None]:
        msg = control("subscribe", "ro", body={"ro/t": 1}, message_id=ulong(packet_id))
        msg.annotations = {symbol("x-opt-mqtt-subscription-options"): {"ro/t": option}}
        return outcome(fe.send(msg))

    for packet_id, bad in enumerate((0x30, 0x40, 0x80, 0x04 | 0x30), start=1):
        assert subscribe(bad, packet_id) == (REJECTED, "amqp:decode-error"), hex(bad)
    assert fe.list() == {}
    assert subscribe(0x20 | 0x04, 9) == (ACCEPTED, None)
    assert fe.list() == {"ro/t": 1}


def test_topic_alias_0_closes_the_client_with_0x94() -> None:
    """A PUBLISH with topic alias 0 closes an MQTT 5 client with DISCONNECT 0x94
    (Topic Alias invalid, MQTT-3.3.2-8), on the broker and through a gateway."""
    net = Net()
    direct = net.mqtt("v5alias0d", level=5)
    direct.send(Publish("a/0", b"x", 0, False, False, None, Properties(topic_alias=0)))
    assert [p.reason_code for p in direct.take(Disconnect)] == [0x94]
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5alias0")
    send(Publish("a/0", b"x", 0, False, False, None, Properties(topic_alias=0)))
    assert [p.reason_code for p in take() if isinstance(p, Disconnect)] == [0x94]
    assert gw.factory.published == 0

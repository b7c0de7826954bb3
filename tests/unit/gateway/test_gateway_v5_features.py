"""MQTT 5 features through a gateway (issue #29 §1): SUBACK 0x8F for an invalid
filter, topic aliases from the client, will properties, retain handling; against
the in-memory core (``gateway_memory``, ``amqp_memory``)."""

from __future__ import annotations

from amqp_memory import Net
from gateway_memory import Gateway
from test_gateway_acks import mqtt5_client
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.amqp.codec.contract import retained_for
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connect,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Will,
)


def test_an_invalid_mqtt5_filter_gets_0x8f_and_the_others_are_granted() -> None:
    """An MQTT 5 SUBSCRIBE with an invalid filter gets 0x8F for it in SUBACK (not a
    close), as from the broker; the other filters reach the core and are granted."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5bad")
    send(Subscribe(1, (("ok/#", 1), ("bad/#/x", 1), ("$share/g/t", 0))))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (1, 0x8F, 0)
    assert set(net.broker.sessions["v5bad"].subscriptions) == {"ok/#", "$share/g/t"}


def test_topic_aliases_from_the_client_reach_the_topic_they_stand_for() -> None:
    """A PUBLISH with a topic and an alias sets it; later ones with the alias alone
    (QoS 0 and 1) go to that topic; a topic with a known alias sets it anew."""
    net = Net()
    gw = Gateway(net, connections=1, credit=8)
    send, take = mqtt5_client(net, gw, "v5alias")
    send(Subscribe(1, (("a/#", 1),)))
    assert [p for p in take() if isinstance(p, Suback)]
    send(Publish("a/1", b"1", 1, False, False, 10, Properties(topic_alias=1)),
         Publish("", b"2", 0, False, False, None, Properties(topic_alias=1)),
         Publish("", b"3", 1, False, False, 11, Properties(topic_alias=1)),
         Publish("a/2", b"4", 1, False, False, 12, Properties(topic_alias=1)),
         Publish("", b"5", 1, False, False, 13, Properties(topic_alias=1)))
    got = take()
    assert [(p.topic, p.payload) for p in got if isinstance(p, Publish)] == [
        ("a/1", b"1"), ("a/1", b"2"), ("a/1", b"3"), ("a/2", b"4"), ("a/2", b"5")]
    assert sorted(p.packet_id for p in got if isinstance(p, Puback)) == [10, 11, 12, 13]


def test_an_alias_never_set_closes_the_client_with_0x82() -> None:
    """A PUBLISH with an empty topic and an alias the client never set is a protocol
    error (DISCONNECT 0x82, as from the broker); nothing goes to the core."""
    net = Net()
    gw = Gateway(net, connections=1, credit=8)
    send, take = mqtt5_client(net, gw, "v5noalias")
    send(Publish("", b"x", 0, False, False, None, Properties(topic_alias=5)))
    got = take()
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [0x82]
    assert gw.factory.published == 0


def test_an_mqtt5_wills_properties_reach_the_core_and_its_subscribers() -> None:
    """An MQTT 5 will's content type, response topic, correlation data, payload
    format, message expiry and user properties go with AMQP_WILL; the will the core
    publishes on a brute end carries them to an MQTT 5 subscriber."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    watcher = net.mqtt("watch5", level=5)
    watcher.subscribe(("w5/#", 1))
    will = Will("w5/gone", b"bye", 1, False, Properties(
        payload_format_indicator=1, message_expiry_interval=600, content_type="text/plain",
        response_topic="re/w5", correlation_data=b"\x01\x02",
        user_properties=(("why", "test"),)))
    proto = gw.factory.buildProtocol(None)
    proto.makeConnection(StringTransport())
    proto.dataReceived(encode(Connect("MQTT", 5, "dying5", True, 0, will), 5))
    net.pump()
    proto.connectionLost(Failure(ConnectionDone()))
    net.pump()
    (got,) = watcher.publishes()
    props = got.properties
    assert (got.topic, got.payload) == ("w5/gone", b"bye")
    assert props is not None
    assert (props.payload_format_indicator, props.content_type, props.response_topic,
            props.correlation_data, props.user_properties) == (
        1, "text/plain", "re/w5", b"\x01\x02", (("why", "test"),))
    assert props.message_expiry_interval is not None
    assert 0 < props.message_expiry_interval <= 600


def test_retain_handling_is_honoured_through_a_gateway() -> None:
    """Retain handling 0 sends retained messages on every SUBSCRIBE, 1 only when the
    subscription is new, 2 never (the core reads it from the options annotation)."""
    net = Net()
    gw = Gateway(net, connections=1, credit=8)
    net.mqtt("keeper").publish("r/1", b"kept", 1, retain=True)
    send, take = mqtt5_client(net, gw, "v5rh")

    def retained_after(packet_id: int, topic_filter: str, handling: int) -> list[bytes]:
        send(Subscribe(packet_id, ((topic_filter, 0),), options=(handling << 4,)))
        got = take()
        assert [p for p in got if isinstance(p, Suback)]
        return [p.payload for p in got if isinstance(p, Publish) and p.retain]

    assert retained_after(1, "r/#", 2) == []
    assert retained_after(2, "r/#", 2) == []
    assert retained_after(3, "r/+", 1) == [b"kept"]
    assert retained_after(4, "r/+", 1) == []
    assert retained_after(5, "r/1", 0) == [b"kept"]
    assert retained_after(6, "r/1", 0) == [b"kept"]


def test_retained_for_reads_retain_handling_from_the_options_annotation() -> None:
    """The core's reading of AMQP_SUBSCRIBE's options: 0 (or absent) sends retained
    messages, 1 only for a filter the session did not have, 2 never; no annotation
    sends them for every filter."""
    requests = [("a", 0), ("b", 1), ("c", 0), ("d", 0), ("e", 2)]
    annotations = {"x-opt-mqtt-subscription-options": {"a": 0x04, "b": 0x10, "c": 0x10,
                                                       "d": 0x20}}
    assert retained_for(annotations, requests, {"c"}) == [True, True, False, False, True]
    assert retained_for({}, requests, {"c"}) == [True] * 5


def test_the_alias_table_is_made_at_the_first_alias_and_never_for_3_1_1() -> None:
    """Review finding: every gateway client (3.1.1 ones too, which cannot send an
    alias) had an inbound alias table; it is made at the first PUBLISH that sets an
    alias, and an MQTT 5 client that sets none has none either."""
    net = Net()
    gw = Gateway(net, connections=1, credit=8)
    old = gw.client("v311")
    old.send(Publish("a/1", b"1", 1, False, False, 10))
    net.pump()
    assert old.proto.aliases is None
    send, take = mqtt5_client(net, gw, "v5plain")
    send(Publish("a/2", b"2", 1, False, False, 11, Properties(user_properties=(("k", "v"),))))
    assert [p.packet_id for p in take() if isinstance(p, Puback)] == [11]
    proto = gw.factory.clients["v5plain"]
    assert proto.aliases is None
    send(Publish("a/3", b"3", 0, False, False, None, Properties(topic_alias=2)),
         Publish("", b"4", 1, False, False, 12, Properties(topic_alias=2)))
    assert [p.packet_id for p in take() if isinstance(p, Puback)] == [12]
    assert proto.aliases is not None and proto.aliases._topics == {2: "a/3"}

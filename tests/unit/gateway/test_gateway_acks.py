"""A gateway client's acknowledgements of its deliveries are checked as a broker checks
them (the wrong kind for the delivery's QoS and state closes the connection, one
logged reason), and a delivery that arrives while the client's own acknowledgements
still await the core is written after them (PUBREC before the copy of its own QoS 2
message), on the frontend's fakes (``test_gateway_frontend``)."""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import Net
from gateway_memory import Gateway
from test_gateway_frontend import CONNECT, FakePool, connected, packets
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttamqp.gateway.channel import Outcome
from mqttamqp.gateway.frontend import GatewayProtocol
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
)


def _ready() -> tuple[GatewayProtocol, StringTransport, Any, Clock]:
    proto, transport, clock = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    channel.released_ = []
    channel.released = lambda pid, dlv: channel.released_.append((pid, dlv))
    channel.logged = []
    proto.factory.warn = (  # type: ignore[method-assign]
        lambda cause, fmt, **kw: channel.logged.append(kw.get("r")))
    return proto, transport, channel, clock


def _closed_brute(proto: GatewayProtocol, transport: StringTransport, channel: Any,
                  reason: str) -> None:
    """Closed with its will (brute), and one reason logged."""
    assert proto.rules.closed
    assert transport.disconnecting
    assert channel.closed is not None and channel.closed[0]
    assert channel.logged == [reason]


@pytest.mark.parametrize("ack", [Pubrec, Pubcomp])
def test_qos2_ack_for_a_qos1_delivery_closes(ack: type) -> None:
    """PUBREC or PUBCOMP for a QoS 1 delivery in flight closes the client (brute),
    and the delivery is not settled."""
    proto, transport, channel, _ = _ready()
    proto.deliver("t", b"m", 1, False, False, "d1", None, 5)
    packets(transport)
    proto.dataReceived(encode(ack(5)))
    _closed_brute(proto, transport, channel,
                  f"{ack.__name__.upper()} for packet id 5, a QoS 1 message in flight")
    assert channel.finished_ == [] and channel.released_ == []


@pytest.mark.parametrize("ack", [Puback, Pubcomp])
def test_ack_for_qos2_before_pubrec_closes(ack: type) -> None:
    """PUBACK or PUBCOMP for a QoS 2 delivery the client has not PUBREC'd closes."""
    proto, transport, channel, _ = _ready()
    proto.deliver("t", b"m", 2, False, False, "d2", None, 6)
    packets(transport)
    proto.dataReceived(encode(ack(6)))
    _closed_brute(proto, transport, channel, "PUBACK for packet id 6, a QoS 2 message in "
                  "flight (before PUBREC)" if ack is Puback else
                  "PUBCOMP for packet id 6 before PUBREC")
    assert channel.finished_ == []


@pytest.mark.parametrize("after_pubrel", [False, True], ids=["awaiting-core", "pubrel-sent"])
def test_puback_after_pubrec_closes(after_pubrel: bool) -> None:
    """PUBACK after PUBREC closes, whether the core's AMQP_PUBREL (so PUBREL) came
    yet or not: the delivery counts as released from the client's PUBREC on."""
    proto, transport, channel, _ = _ready()
    proto.deliver("t", b"m", 2, False, False, "d3", None, 7)
    proto.dataReceived(encode(Pubrec(7)))
    assert channel.released_ == [(7, "d3")]
    if after_pubrel:
        proto.release(7, "rel-7")
    proto.dataReceived(encode(Puback(7)))
    _closed_brute(proto, transport, channel,
                  "PUBACK for packet id 7, a QoS 2 message in flight (after PUBREL)")


def test_the_right_acknowledgements_and_unknown_ids_do_not_close() -> None:
    """PUBACK for QoS 1, PUBREC then PUBCOMP for QoS 2, a repeated PUBREC and
    acknowledgements of ids not in flight (late duplicates) keep the client."""
    proto, _transport, channel, _ = _ready()
    proto.deliver("t", b"a", 1, False, False, "d1", None, 1)
    proto.deliver("t", b"b", 2, False, False, "d2", None, 2)
    proto.dataReceived(encode(Puback(1)) + encode(Pubrec(2)) + encode(Pubrec(2))
                       + encode(Puback(99)) + encode(Pubrec(98)) + encode(Pubcomp(97)))
    proto.release(2, "rel-2")
    proto.dataReceived(encode(Pubcomp(2)))
    assert not proto.rules.closed
    assert channel.finished_ == ["d1", "rel-2"]
    assert proto.outbound.exactly_once == set() and proto.outbound.inflight == {}


def test_pubrec_goes_before_the_copy_of_the_clients_own_qos2_message() -> None:
    """A delivery that arrives before the core's Accepted of the client's QoS 2
    PUBLISH is written after its PUBREC; PUBREC waits for the Accepted."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("own/t", b"q2", 2, False, False, 11)))
    ((_t, _p, _q, answered),) = channel.published
    proto.deliver("own/t", b"q2", 2, False, False, "copy", None, 40)
    assert packets(transport) == []   # (neither: the core has not answered)
    answered(Outcome(True))
    got = packets(transport)
    assert [type(p) for p in got] == [Pubrec, Publish]
    assert got[0] == Pubrec(11) and got[1].packet_id == 40
    assert proto.factory.held_deliveries == 1
    proto.dataReceived(encode(Pubrel(11)))
    assert packets(transport) == [Pubcomp(11)]


def test_held_deliveries_keep_their_order_and_qos0_is_settled_once_written() -> None:
    """Deliveries to a topic whose own QoS 1 PUBLISH awaits the core come after its
    PUBACK in the order they came, a QoS 0 one settled only once written; a
    delivery to another topic goes at once."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("a/1", b"mine", 1, False, False, 5)))
    ((_t, _p, _q, answered),) = channel.published
    proto.deliver("a/1", b"zero", 0, False, False, "q0", None, None)
    proto.deliver("a/2", b"other", 0, False, False, "q0x", None, None)
    proto.deliver("a/1", b"one", 1, False, False, "q1", None, 8)
    assert [p.payload for p in packets(transport)] == [b"other"]
    assert channel.finished_ == ["q0x"]
    answered(Outcome(True))
    got = packets(transport)
    assert [type(p) for p in got] == [Puback, Publish, Publish]
    assert [p.payload for p in got[1:]] == [b"zero", b"one"]
    assert channel.finished_ == ["q0x", "q0"]
    proto.deliver("a/1", b"now", 0, False, False, "q0b", None, None)
    assert [p.payload for p in packets(transport)] == [b"now"]
    assert channel.finished_ == ["q0x", "q0", "q0b"]
    assert proto.factory.held_deliveries == 2
    assert not proto._own_topics


def test_pending_puback_or_suback_does_not_delay_other_topics() -> None:
    """A PUBACK awaiting the core's durable commit, or a SUBACK awaiting the core,
    does not hold deliveries to topics the client did not publish to."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("mine", b"m", 1, False, False, 5)))
    proto.dataReceived(encode(Subscribe(3, (("a/#", 1),))))
    proto.deliver("a/1", b"x", 0, False, False, "q0", None, None)
    proto.deliver("a/2", b"y", 1, False, False, "q1", None, 8)
    assert [p.payload for p in packets(transport)] == [b"x", b"y"]
    assert channel.finished_ == ["q0"] and proto.factory.held_deliveries == 0


def test_an_acknowledgement_answered_but_not_yet_written_still_holds_its_topic() -> None:
    """A PUBACK the core answered that waits behind an earlier unanswered one still
    goes before the copy of its own message; the copy goes when it does."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("x", b"1", 1, False, False, 1))
                       + encode(Publish("t", b"2", 1, False, False, 2)))
    (_a, (_t, _p, _q, second)) = channel.published
    first = channel.published[0][3]
    second(Outcome(True))
    proto.deliver("t", b"copy", 0, False, False, "c", None, None)
    assert packets(transport) == []
    first(Outcome(True))
    got = packets(transport)
    assert got[:2] == [Puback(1), Puback(2)] and got[2].payload == b"copy"


def test_retained_messages_come_after_an_answered_suback_that_waits() -> None:
    """A SUBACK the core answered that waits behind an unanswered PUBACK holds every
    delivery (the retained messages it sent) until it is written."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("x", b"1", 1, False, False, 1)))
    proto.dataReceived(encode(Subscribe(3, (("r/#", 0),))))
    channel.subscribed[0][2].callback(Outcome(True))
    proto.deliver("r/1", b"kept", 0, True, False, "r", None, None)
    assert packets(transport) == []
    channel.published[0][3](Outcome(True))
    got = packets(transport)
    assert [type(p) for p in got] == [Puback, Suback, Publish]


def test_the_topic_positions_stay_bounded_by_the_queue() -> None:
    """The positions kept for the order rule are pruned to about twice the entries
    still queued, and emptied with the queue."""
    proto, _transport, channel, _ = _ready()
    proto.dataReceived(encode(Publish("block", b"b", 1, False, False, 1)))
    for i in range(200):
        proto.dataReceived(encode(Publish(f"t/{i}", b"", 1, False, False, 2 + i)))
    proto.dataReceived(encode(Publish("tail", b"", 1, False, False, 300)))
    for _t, _p, _q, answered in channel.published[1:-1]:
        answered(Outcome(True))
    assert proto._own_topics is not None
    assert len(proto._own_topics) == 202   # (nothing written: all behind "block")
    channel.published[0][3](Outcome(True))
    assert len(proto.acks) == 1 and proto._own_topics == {"tail": 201}
    channel.published[-1][3](Outcome(True))
    assert proto.acks.empty and not proto._own_topics


def mqtt5_client(net: Net, gw: Gateway, cid: str) -> tuple[Any, Any]:
    """An MQTT 5 client of ``gw`` (``gateway_memory``'s are 3.1.1): send, take."""
    proto = gw.factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    dec = Decoder(protocol_level=5)

    def send(*ps: object) -> None:
        for p in ps:
            proto.dataReceived(encode(p, 5))
        net.pump()

    def take() -> list[object]:
        net.pump()
        dec.feed(transport.value())
        transport.clear()
        return list(dec)

    send(Connect("MQTT", 5, cid, True, 0, None))
    take()
    return send, take


def test_a_failed_pubrec_ends_the_exchange_without_pubrel() -> None:
    """MQTT 5 PUBREC with a failure code (>= 0x80) gets no PUBREL, as from a broker,
    and the core is done with the message (the delivery settled)."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5")
    send(Subscribe(1, (("t", 2),)))
    take()
    net.mqtt("pub").publish("t", b"x", 2)
    (m,) = [p for p in take() if isinstance(p, Publish)]
    send(Pubrec(m.packet_id, 0x80))
    assert not [p for p in take() if isinstance(p, Pubrel)]
    assert not net.broker.sessions["v5"].inflight


def test_puback_for_a_pubrel_resent_after_a_reconnect_closes() -> None:
    """After a reconnect the core resends PUBREL for a PUBREC'd delivery; PUBACK for
    it breaks the protocol and closes the connection, as on a broker."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    c = gw.client("p", clean=False)
    c.send(Subscribe(1, (("t", 2),)))
    assert c.take(Suback)
    net.mqtt("pub").publish("t", b"x", 2)
    (m,) = c.take(Publish)
    c.send(Pubrec(m.packet_id))
    assert c.take(Pubrel)
    c.drop()
    c2 = gw.client("p", clean=False)
    (rel,) = c2.take(Pubrel)
    c2.send(Puback(rel.packet_id))
    assert c2.proto.rules.closed


def test_a_released_packet_id_is_not_reused_for_a_new_delivery() -> None:
    """The core's packet id of a delivery whose PUBREL was sent is refused for another
    PUBLISH until PUBCOMP (resent PUBREL after a reconnect too)."""
    from mqttamqp.gateway.outbound import Outbound

    out = Outbound()
    out.pubrel(7, "rel")
    assert out.publish("t", b"x", 1, False, False, "d", None, 7) is None
    assert out.completed(7) == "rel"
    assert out.publish("t", b"x", 1, False, False, "d", None, 7)

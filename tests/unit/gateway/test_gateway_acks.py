"""A gateway client's acknowledgements of its deliveries are checked as a broker checks
them (the wrong kind for the delivery's QoS and state closes the connection, one
logged reason), and a delivery that arrives while the client's own acknowledgements
still await the core is written after them (PUBREC before the copy of its own QoS 2
message), on the frontend's fakes (``test_gateway_frontend``)."""

from __future__ import annotations

from typing import Any

import pytest
from test_gateway_frontend import CONNECT, FakePool, connected, packets
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttamqp.gateway.channel import Outcome
from mqttamqp.gateway.frontend import GatewayProtocol
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe


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
    """Deliveries held behind a pending SUBACK come after it in the order they came,
    a QoS 0 one settled only once written; with nothing pending they go at once."""
    proto, transport, channel, _ = _ready()
    proto.dataReceived(encode(Subscribe(3, (("a/#", 1),))))
    proto.deliver("a/1", b"zero", 0, False, False, "q0", None, None)
    proto.deliver("a/2", b"one", 1, False, False, "q1", None, 8)
    assert packets(transport) == [] and channel.finished_ == []
    channel.subscribed[0][2].callback(Outcome(True))
    got = packets(transport)
    assert [type(p) for p in got] == [Suback, Publish, Publish]
    assert [p.payload for p in got[1:]] == [b"zero", b"one"]
    assert channel.finished_ == ["q0"]
    proto.deliver("a/3", b"now", 0, False, False, "q0b", None, None)
    assert [p.payload for p in packets(transport)] == [b"now"]
    assert channel.finished_ == ["q0", "q0b"]
    assert proto.factory.held_deliveries == 2

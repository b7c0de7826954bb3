"""When CONNACK is written: at once in the turn that read CONNECT when nothing of
the connection's waits, no packet follows CONNECT in the read and the session has
no message to send after it (``handshake._send_now``), else with the rest of the
batch, in order."""

from __future__ import annotations

from mqtt_memory import ACCEPTED, Harness
from twisted.internet.testing import StringTransport

from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    ConnackCode,
    Connect,
    Pingreq,
    Pingresp,
    Publish,
    Subscribe,
)


class _CountingTransport(StringTransport):
    writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


def _decoded(data: bytes) -> list[object]:
    decoder = Decoder()
    decoder.feed(data)
    return list(decoder)


def test_connack_is_written_before_an_outer_batch_ends() -> None:
    """A CONNECT alone in its read is answered at once, even inside a batch opened
    around it (a WebSocket read of several frames opens one): the CONNACK does not
    wait for that batch's end."""
    h = Harness()
    c = h.client()
    h.broker.begin_batch()
    try:
        c.send(Connect("MQTT", 4, "c", True, 60))
        assert _decoded(c.transport.value()) == [ACCEPTED]
    finally:
        h.broker.end_batch()
    assert c.open and c.proto.keepalive == 60


def test_a_packet_behind_connect_keeps_connack_in_the_batch_and_in_order() -> None:
    """CONNECT and PINGREQ in one read: CONNACK waits with the PINGRESP for the
    batch's end and both go out in one write, CONNACK first."""
    h = Harness()
    proto = h.factory.buildProtocol(None)
    transport = _CountingTransport()
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 4, "c", True, 0)) + encode(Pingreq()))
    assert _decoded(transport.value()) == [ACCEPTED, Pingresp()]
    assert transport.writes == 1


def test_a_connect_alone_is_one_write() -> None:
    """The common case: one CONNECT read, one write (the CONNACK)."""
    h = Harness()
    proto = h.factory.buildProtocol(None)
    transport = _CountingTransport()
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 4, "c", True, 0)))
    assert _decoded(transport.value()) == [ACCEPTED] and transport.writes == 1


def test_a_resumed_session_with_messages_waiting_is_one_write() -> None:
    """A persistent session resumed with a message waiting for it: the CONNACK and
    the message go out together, CONNACK first, in one write (as before CONNACK was
    ever sent at once), not CONNACK alone and then the message."""
    h = Harness()
    sub = h.client()
    sub.connect("s", clean=False)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.proto.transport.loseConnection()
    sub.lost()
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("t", b"m", 1, False, False, 1))
    proto = h.factory.buildProtocol(None)
    transport = _CountingTransport()
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 4, "s", False, 0)))
    got = _decoded(transport.value())
    assert got[0] == Connack(True, ConnackCode.ACCEPTED)
    assert [(p.topic, p.payload) for p in got[1:]] == [("t", b"m")]  # type: ignore[attr-defined]
    assert transport.writes == 1

"""When CONNACK is written: at once in the turn that read CONNECT when nothing of
the connection's waits and no packet follows CONNECT in the read
(``handshake._send_now``), else with the rest of the batch, in order."""

from __future__ import annotations

from mqtt_memory import ACCEPTED, Harness
from twisted.internet.testing import StringTransport

from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connect, Pingreq, Pingresp


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

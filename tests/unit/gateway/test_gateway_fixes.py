"""Regression tests of the gateway review (issue #29 §1), on the frontend's fakes
(``test_gateway_frontend``): packet ids are the core's, a paused client is not
expired, MQTT 5 failure reason codes and maximum packet size, SUBSCRIBE bounded by
the acknowledgement rule, the core ending a channel, CONNECT's one deadline."""

from __future__ import annotations

from test_gateway_frontend import CONNECT, FakePool, connected, packets

from mqttamqp.amqp.codec.encode import encode_publish
from mqttamqp.amqp.codec.publish import decode_publish
from mqttamqp.gateway.channel import _message_id
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Pubcomp, Pubrec, Pubrel


def test_message_id_of_a_publish_delivery_is_read_in_place() -> None:
    """The core's packet id (message-id, small and large ulong) is read from the
    properties section of a ``.publish`` delivery; none without one."""
    for pid in (1, 255, 256, 65535):
        data = encode_publish("a/b", b"x", 1, False, 0, None, pid)
        assert _message_id(data, decode_publish(data, False).bare_start) == pid
    data = encode_publish("a/b", b"x", 0, False, 0, None)
    assert _message_id(data, decode_publish(data, True).bare_start) is None


def test_qos2_delivery_and_pubrel_use_the_cores_packet_id() -> None:
    """A QoS 2 delivery goes out with the core's packet id (not one the gateway
    makes up), the client's PUBREC names it, and PUBREL/PUBCOMP use it too."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    released: list[tuple[int, object]] = []
    channel.released = lambda pid, dlv: released.append((pid, dlv))  # type: ignore[attr-defined]
    proto.deliver("x/y", b"two", 2, False, False, "dlv-9", None, 9)
    (sent,) = packets(transport)
    assert sent.packet_id == 9
    proto.dataReceived(encode(Pubrec(9)))
    assert released == [(9, "dlv-9")]
    proto.release(9, "rel-9")
    assert packets(transport) == [Pubrel(9)]
    proto.dataReceived(encode(Pubcomp(9)))
    assert channel.finished_ == ["rel-9"]

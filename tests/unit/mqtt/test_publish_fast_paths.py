"""The shortcut a 3.1.1 QoS 0 PUBLISH takes on the way out (``Publish.wire``,
``outbound.QOS0_FRAME``) gives the bytes the general code would: the frame as it
came, or the encoded one where the two could differ."""

from __future__ import annotations

from typing import Any

from mqtt_memory import Harness

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Publish, Subscribe


def _subscriber(h: Harness, name: str, level: int = 4) -> Any:
    if level == 5:
        from mqtt_memory import connected
        s: Any = connected(h, name)
    else:
        s = h.client()
        s.connect(name, level=level)
    s.send(Subscribe(1, (("t/#", 0),)))
    s.received()
    return s


def test_a_qos0_publish_goes_out_as_it_came_or_encoded() -> None:
    """A 3.1.1 QoS 0 PUBLISH without flags whose length is in the fewest bytes
    reaches 3.1/3.1.1 subscribers as the very bytes it came in (``Publish.wire``);
    any other is encoded for them, and MQTT 5 subscribers get their own frame."""
    h = Harness()
    subs = [_subscriber(h, "s4"), _subscriber(h, "s3", level=3)]
    five = _subscriber(h, "s5", level=5)
    pub = h.client()
    pub.connect("p")
    for payload in (b"x" * 64, b"y" * 300):   # (one and two length bytes)
        frame = encode(Publish("t/a", payload))
        pub.proto.dataReceived(frame * 2)
        for s in subs:
            assert s.transport.value() == frame * 2
            s.transport.clear()
        assert five.received() == [Publish("t/a", payload)] * 2
    # Not the wire: a longer length form (9 as 0x89 0x00), retained, QoS 1 (and DUP).
    odd = bytes((0x30, 0x89, 0x00)) + encode(Publish("t/b", b"1234"))[2:]
    sent = [Publish("t/b", b"1234", retain=True), Publish("t/b", b"1234", 1, packet_id=7),
            Publish("t/b", b"1234", 1, dup=True, packet_id=8)]
    pub.proto.dataReceived(odd + b"".join(encode(p) for p in sent))
    want = encode(Publish("t/b", b"1234"))
    for s in subs:
        assert s.transport.value() == want * 4, s.transport.value()
        s.transport.clear()
    assert five.received() == [Publish("t/b", b"1234")] * 4

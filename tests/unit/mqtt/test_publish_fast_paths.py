"""The shortcut a 3.1.1 QoS 0 PUBLISH takes on the way out (``Publish.wire``,
``outbound.QOS0_FRAME``) gives the bytes the general code would: the frame as it
came, or the encoded one where the two could differ."""

from __future__ import annotations

from typing import Any

from compiled import not_compiled
from mqtt_memory import Harness

from mqttamqp.mqtt import codec, protocol
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


@not_compiled
def test_plain_frame_not_encoded_others_are(monkeypatch: Any) -> None:
    """The frame as it came is what goes out (``encode_publish`` is not called for
    it); a longer length form is encoded, once for both subscribers."""
    h = Harness()
    subs = []
    for name, level in (("s4", 4), ("s3", 3)):
        s = h.client()
        s.connect(name, level=level)
        s.send(Subscribe(1, (("t/#", 0),)))
        s.received()
        subs.append(s)
    pub = h.client()
    pub.connect("p")
    calls: list[bytes] = []
    real = protocol.encode_publish

    def counting(*a: Any) -> bytes:
        calls.append(a[0])
        return real(*a)
    monkeypatch.setattr(protocol, "encode_publish", counting)
    frame = encode(Publish("t/a", b"x" * 300))
    pub.proto.dataReceived(frame)
    assert calls == []                                   # not encoded: the wire
    for s in subs:
        assert s.transport.value() == frame
        s.transport.clear()
    odd = bytes((0x30, 0x89, 0x00)) + encode(Publish("t/b", b"1234"))[2:]
    pub.proto.dataReceived(odd)
    assert calls == [b"t/b"]                             # encoded once, shared
    for s in subs:
        assert s.transport.value() == encode(Publish("t/b", b"1234"))


def test_decoder_sets_wire_only_where_it_is_the_frame() -> None:
    """``Publish.wire`` is set for a plain QoS 0 frame read whole (bytes, or a
    bytearray fed whole), never for a retained one, a longer length form, or a
    frame split over reads whose leftover was longer than the next read (the
    decoder's buffer then a bytearray; a shorter leftover is joined into bytes)."""
    plain = encode(Publish("t", b"p"))
    for data, want in ((plain, plain), (bytearray(plain), plain),
                       (encode(Publish("t", b"p", retain=True)), None),
                       (bytes((0x30, 0x84, 0x00)) + plain[2:], None)):
        d = codec.Decoder(1 << 20, 4, server=True)
        d.feed(data)
        p = d.next_packet()
        assert isinstance(p, Publish) and getattr(p, "wire", None) == want
    big = encode(Publish("t", b"q" * 1000))   # (a split read: a bytearray buffer)
    d = codec.Decoder(1 << 20, 4, server=True)
    d.feed(big[:900])
    assert d.next_packet() is None
    d.feed(big[900:])
    p = d.next_packet()
    assert isinstance(p, Publish) and p.payload == b"q" * 1000 and p.wire is None

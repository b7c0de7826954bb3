"""A 3.1.1 remote's PUBLISH above this broker's --max-packet-size: read past (never
held), acknowledged so that the remote forgets it, counted; the packets after it are
handled; the connection stays.  Whole and byte at a time."""

from __future__ import annotations

import pytest
from bridge_remote import TABLE, Remote, accept
from core_broker import connect, make_broker, subscribe

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.oversize import OversizedPublish
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.fields import MalformedPacket
from mqttamqp.mqtt.packets import Puback, Publish, Pubrec, Suback, Subscribe


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_an_oversized_in_publish_is_read_past_and_acknowledged(chunk: int | None) -> None:
    """QoS 1 and 2 PUBLISHes above the maximum: PUBACK / PUBREC, counted, not
    published here; the small ones around them arrive; the connection stays up."""
    broker, clock, _ = make_broker(max_packet_size=1024)
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), remote)
    bridge.start()
    accept(remote)
    (sub,) = remote.packets()
    assert isinstance(sub, Subscribe)
    remote.send(Suback(sub.packet_id, (1,)))
    local, link, _ = connect(broker, "near")
    subscribe(broker, local, ("commands/#", 2))
    data = b"".join(encode(p) for p in (
        Publish("commands/a", b"first", 1, False, False, 1),
        Publish("commands/big", b"B" * 5000, 1, False, False, 2),
        Publish("commands/big2", b"C" * 3000, 2, False, False, 3),
        Publish("commands/b", b"last", 1, False, False, 4)))
    assert remote.client is not None and remote.transport is not None
    step = chunk or len(data)
    for i in range(0, len(data), step):
        remote.client.dataReceived(data[i:i + step])
    assert [p for p in remote.packets() if isinstance(p, Puback | Pubrec)] == [
        Puback(1), Puback(2), Pubrec(3), Puback(4)]
    assert [payload for _, payload, *_ in link.sent] == [b"first", b"last"]
    assert bridge.too_large_in == 2 and bridge.received == 2
    assert not remote.transport.disconnecting


def test_an_oversized_packet_other_than_publish_still_closes() -> None:
    """Only a PUBLISH is read past; any other packet type above the maximum is an error."""
    skip = OversizedPublish()
    with pytest.raises(MalformedPacket):
        skip.feed(b"\x90\xff\xff\x03")   # (a SUBACK's fixed header)

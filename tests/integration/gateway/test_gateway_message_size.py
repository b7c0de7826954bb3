"""A PUBLISH the core's AMQP link cannot take (its max-message-size, the core's
--max-packet-size, is smaller than the message with its AMQP envelope): the gateway
closes the publisher with one logged reason and its will is published, rather than
let the core detach the link (which ended the client as if by the core: no will, no
line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from gateway_proc import start_gateway, uid
from rawclient import RawClient

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Pingreq, Pingresp, Publish, Will

pytestmark = pytest.mark.timeout(60)


def test_publish_over_the_cores_message_size_closes_with_the_will(tmp_path: Path) -> None:
    """A 1,024-byte PUBLISH through a gateway to a core whose limit is 1,024 bytes: the
    publisher is closed, the gateway logs why once, the will reaches a subscriber."""
    with BrokerProcess(str(tmp_path / "core"), "--max-packet-size", "1024",
                       listeners=("--mqtt", "--amqp")) as core:
        gateway = start_gateway(tmp_path, f"amqp://127.0.0.1:{core.ports['AMQP']}")
        sub, pub = RawClient(gateway.mqtt_port), RawClient(gateway.mqtt_port)
        try:
            sub.connect(uid("s"))
            sub.subscribe(("size/will", 1))
            publisher = uid("p")
            pub.connect(publisher, will=Will("size/will", b"gone", 1, False))
            big = encode(Publish("size/t", b"x" * (1024 - 3 - 2 - 6)))
            assert len(big) == 1024   # (the MQTT packet fits; the AMQP message does not)
            pub.send(big)
            assert pub.wait_closed() == []
            assert sub.receive_acked().payload == b"gone"
            line = gateway.wait_for_line(rf"closing {publisher} .*over the core's "
                                         r"max-message-size 1024")
            assert [entry for entry in gateway.log if publisher in entry] == [line]
            sub.send(Pingreq())   # (the others on the upstream connection still work)
            assert sub.recv() == Pingresp()
        finally:
            sub.close()
            pub.close()
            gateway.stop()

"""The HA tests' client keeps a QoS 2 PUBREL owed across refused reconnects
(``tests/support/pahokeep.py``): without it paho-mqtt 2.2.0 re-sends the PUBLISH
after its PUBREL once a reconnect attempt fails, a duplicate that is the client's."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest
from pahokeep import KeepPubrel


def _refusing_port() -> tuple[socket.socket, int]:
    """A bound loopback port nothing listens on (connects are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, int(s.getsockname()[1])


def _owed(client: mqtt.Client, mid: int, state: mqtt.MessageState) -> mqtt.MQTTMessage:
    msg = mqtt.MQTTMessage(mid=mid, topic=b"t")
    msg.qos = 2
    msg.state = state
    client._out_messages[mid] = msg
    return msg


def test_an_owed_pubrel_stays_owed_across_two_refused_reconnects() -> None:
    """Two refused reconnect attempts leave a message whose PUBREL was sent to be
    re-sent as PUBREL, and one still waiting for PUBREC to be re-sent as PUBLISH."""
    holder, port = _refusing_port()
    client = KeepPubrel(mqtt.CallbackAPIVersion.VERSION2, client_id="keep", clean_session=False)
    try:
        client.connect_async("127.0.0.1", port)
        released = _owed(client, 1, mqtt.mqtt_ms_wait_for_pubcomp)
        sent = _owed(client, 2, mqtt.mqtt_ms_wait_for_pubrec)
        for _ in range(2):
            with pytest.raises(ConnectionRefusedError):
                client.reconnect()
        assert released.state == mqtt.mqtt_ms_resend_pubrel
        assert sent.state == mqtt.mqtt_ms_publish and sent.dup
    finally:
        holder.close()

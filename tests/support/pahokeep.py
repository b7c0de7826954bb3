"""A paho-mqtt client that keeps a QoS 2 PUBREL owed across failed reconnects.

paho-mqtt 2.2.0 moves a QoS 2 message whose PUBREL was sent to ``resend_pubrel`` at
each ``reconnect()``; a second attempt (after a refused connect, as when a client
given several addresses tries the dead leader's first) resets it again and the
second reset turns it into ``publish``: the PUBLISH goes out again after its PUBREL,
which MQTT 3.1.1 forbids (4.3.3, "MUST NOT re-send the PUBLISH once it has sent the
corresponding PUBREL"), and a broker, which released the packet id at PUBREL, rightly
takes it as a new message (a QoS 2 duplicate that is the client's).  Used by the
``--ha`` tests and bench/ha_chain.py; bench/ha_chain.py ``--paho-as-is`` shows it.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt

__all__ = ["KeepPubrel"]


class KeepPubrel(mqtt.Client):
    """``mqtt.Client`` whose owed PUBRELs stay owed across reconnect attempts."""

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            owed = [m for m in self._out_messages.values()
                    if m.qos == 2 and m.state == mqtt.mqtt_ms_resend_pubrel]
        super()._messages_reconnect_reset_out()
        with self._out_message_mutex:
            for m in owed:
                m.state = mqtt.mqtt_ms_resend_pubrel

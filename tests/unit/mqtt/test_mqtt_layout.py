"""What one MQTT connection object holds: the slots an idle connection pays for."""

from __future__ import annotations

from compiled import COMPILED
from mqtt_memory import Harness

from mqttamqp.mqtt.protocol import MQTTProtocol


def test_the_connection_fits_pymallocs_320_byte_class() -> None:
    """``MQTTProtocol`` with the collector's header is at most 320 bytes (no slot for
    Twisted's ``connected``, an MQTT 5 AUTH exchange, a protocol error's reason nor
    the bridge flag): an idle connection's largest object (bench/README.md, idle
    connections, sixth round).  In the compiled build it is a native class (no
    ``__slots__``: its fields are those ``link.MQTTLink`` and ``__init__`` declare, a
    vtable pointer more, a bool a byte): 296 bytes, 312 with the header."""
    if not COMPILED:
        assert not {"connected", "_auth", "_cause_detail", "bridge_peer"} & set(
            MQTTProtocol.__slots__)
        assert MQTTProtocol.__basicsize__ == 304
    else:
        assert MQTTProtocol.__basicsize__ == 296
    assert MQTTProtocol.__basicsize__ + 16 <= 320


def test_connected_says_whether_a_transport_was_given() -> None:
    """``connected`` is 0 before ``makeConnection`` and 1 after, as Twisted's
    ``BaseProtocol`` has it, without a slot of its own."""
    h = Harness()
    proto = h.factory.buildProtocol(None)
    assert proto.connected == 0 and proto._auth is None
    c = h.client()
    assert c.proto.connected == 1 and c.proto._auth is None

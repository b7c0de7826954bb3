"""``net.slotted.SlottedProtocol``: Twisted's protocol interface without an instance
dict, as the MQTT connection uses it."""

from __future__ import annotations

from typing import Any


def test_a_slotted_protocol_is_a_twisted_protocol_without_a_dict() -> None:
    """A subclass naming Twisted's three attributes in its slots provides IProtocol
    and ILoggingContext, is connected by ``makeConnection`` (which calls
    ``connectionMade``), and has no ``__dict__`` nor weak-reference slot."""
    from twisted.internet.interfaces import ILoggingContext, IProtocol
    from twisted.internet.testing import StringTransport
    from zope.interface.verify import verifyObject  # type: ignore[import-untyped]

    from mqttamqp.net.slotted import SlottedProtocol

    class Echo(SlottedProtocol):
        __slots__ = ("connected", "factory", "made", "transport")

        def __init__(self) -> None:
            self.connected = 0
            self.made = False

        def connectionMade(self) -> None:
            self.made = True

        def dataReceived(self, data: bytes) -> None:
            self.transport.write(data)

    proto = Echo()
    assert verifyObject(IProtocol, proto) and verifyObject(ILoggingContext, proto)
    transport: Any = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(b"hi")
    assert proto.made and proto.connected == 1 and transport.value() == b"hi"
    assert proto.logPrefix() == "Echo"
    assert not hasattr(proto, "__dict__") and not hasattr(proto, "__weakref__")


def test_the_mqtt_connection_has_no_instance_dict() -> None:
    """Every class of ``MQTTProtocol`` declares slots: no dict, no weak-reference
    slot (issue 31 §2: ~40 bytes an idle connection)."""
    from mqttamqp.mqtt.protocol import MQTTProtocol

    assert MQTTProtocol.__dictoffset__ == 0 and MQTTProtocol.__weakrefoffset__ == 0

"""What one MQTT connection object holds: the slots an idle connection pays for."""

from __future__ import annotations

from compiled import COMPILED
from mqtt_memory import Harness
from twisted.internet.interfaces import ILoggingContext, IProtocol, IPushProducer
from zope.interface.verify import verifyObject

from mqttamqp.mqtt import debuglog
from mqttamqp.mqtt.protocol import MQTTProtocol


def test_the_connection_fits_pymallocs_320_byte_class() -> None:
    """``MQTTProtocol`` with the collector's header is at most 320 bytes (no slot for
    Twisted's ``connected``, an MQTT 5 AUTH exchange, a protocol error's reason nor
    the bridge flag): an idle connection's largest object (bench/README.md, idle
    connections, sixth round).  In the compiled build it is a native class (no
    ``__slots__``: its fields are those ``link.MQTTLink`` and ``__init__`` declare, a
    vtable pointer more, a bool a byte): 296 bytes, 312 with the header."""
    fields = (set(MQTTProtocol.__slots__) if not COMPILED
              else set(MQTTProtocol.__mypyc_attrs__))
    assert not {"connected", "_auth", "_cause_detail", "bridge_peer"} & fields
    assert MQTTProtocol.__basicsize__ == (296 if COMPILED else 304)
    assert MQTTProtocol.__basicsize__ + 16 <= 320


def test_connected_says_whether_a_transport_was_given() -> None:
    """``connected`` is 0 before ``makeConnection`` and 1 after, as Twisted's
    ``BaseProtocol`` has it, without a slot of its own."""
    h = Harness()
    proto = h.factory.buildProtocol(None)
    assert proto.connected == 0 and proto._auth is None
    c = h.client()
    assert c.proto.connected == 1 and c.proto._auth is None


def test_the_connection_is_what_twisted_asks_of_a_protocol() -> None:
    """It provides Twisted's protocol, push-producer and logging-context interfaces
    (declared after the class, ``classImplements``: a class decorator would keep it
    from being native), also while the debug log has swapped its class."""
    h = Harness()
    c = h.client()
    for interface in (IProtocol, IPushProducer, ILoggingContext):
        assert verifyObject(interface, c.proto)
    assert c.proto.logPrefix() == "MQTTProtocol"
    debuglog.start(c.proto, h.clock.seconds() + 60)
    assert type(c.proto) is not MQTTProtocol
    assert IProtocol.providedBy(c.proto) and IPushProducer.providedBy(c.proto)

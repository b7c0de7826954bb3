"""One MQTT connection in memory, for the unit tests of the MQTT side: ``MQTTProtocol``
on a ``StringTransport`` in front of a real ``Broker`` on a ``Clock`` (``Harness``),
with packet-level send and receive (``Client``, ``Client5`` for MQTT 5).

The transport only records; where a real reactor would call ``connectionLost`` after
``loseConnection``, the tests do it themselves (``Client.lost``).
"""

from __future__ import annotations

from typing import Any

import fakes
from fakes import NullStore
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Will,
)
from mqttamqp.mqtt.protocol import MQTTFactory, MQTTProtocol
from mqttamqp.security.admission import guards


class FakeLink(fakes.FakeLink):
    """A subscriber on the core: publishes as (topic, payload, qos, retain)."""

    @property
    def sent(self) -> list[tuple[str, bytes, int, bool]]:
        return [(m.topic, m.payload, q, r) for m, q, _pid, _dup, r in self.published()]


class Client:
    """One MQTTProtocol on a StringTransport, with packet-level send and receive."""

    def __init__(self, factory: MQTTFactory) -> None:
        self.proto: MQTTProtocol = factory.buildProtocol(None)
        self.transport = StringTransport()
        self.decoder = Decoder()
        self.proto.makeConnection(self.transport)  # type: ignore[no-untyped-call]

    def send(self, *packets: Packet) -> None:
        self.proto.dataReceived(b"".join(encode(p) for p in packets))

    def received(self) -> list[Packet]:
        self.decoder.feed(self.transport.value())
        self.transport.clear()
        return list(self.decoder)

    def connect(self, client_id: str = "c", clean: bool = True, keepalive: int = 0,
                will: Will | None = None, level: int = 4) -> list[Packet]:
        name = "MQTT" if level == 4 else "MQIsdp"
        self.send(Connect(name, level, client_id, clean, keepalive, will))
        return self.received()

    @property
    def open(self) -> bool:
        return not self.transport.disconnecting

    def lost(self) -> None:
        """What the reactor does after loseConnection: report the connection lost."""
        assert self.transport.disconnecting
        self.proto.connectionLost(Failure(ConnectionDone()))


class Harness:
    def __init__(self, store: NullStore | None = None, *, recorder: Any = None,
                 authenticator: Any = None, **limits: Any) -> None:
        limits.setdefault("sys_interval", 0)
        self.clock = Clock()
        self.store = store if store is not None else NullStore()
        self.broker = Broker(self.clock, self.store, Limits(**limits), recorder=recorder,
                             authenticator=authenticator,
                             guards=guards(self.clock.seconds, Limits(**limits)))
        self.factory = MQTTFactory(self.broker, self.clock)

    def client(self) -> Client:
        return Client(self.factory)

    def watcher(self, topic_filter: str, client_id: str = "watcher") -> FakeLink:
        """A subscriber on the core, not on MQTT, to see what gets routed."""
        link = FakeLink()
        session = self.broker.open_session(link, client_id, True, None).session
        self.broker.activate(session, link, "test")
        self.broker.subscribe(session, _identity(client_id), [(topic_filter, 2)])
        return link


def _identity(client_id: str) -> Any:
    from mqttamqp.core.auth import Identity
    return Identity(client_id)


ACCEPTED = Connack(False, 0)


class TcpLikeTransport(StringTransport):
    """Pauses its streaming producer once more than ``buffer`` bytes are held, as
    Twisted's FileDescriptor does past its 64 KiB write buffer."""

    buffer = 64 * 1024
    producer_paused = False

    def write(self, data: bytes) -> None:
        super().write(data)
        if (self.producer is not None and self.streaming and not self.producer_paused
                and len(self.value()) > self.buffer):
            self.producer_paused = True
            self.producer.pauseProducing()  # type: ignore[attr-defined]


class Client5(Client):
    """A level 5 client: packets encoded and decoded with MQTT 5 layouts."""

    def __init__(self, factory: Any) -> None:
        super().__init__(factory)
        self.decoder = Decoder(protocol_level=5)
        self.pending: list[Packet] = []   # what came with CONNACK

    def received(self) -> list[Packet]:
        got, self.pending = self.pending + super().received(), []
        return got

    def send(self, *packets: Packet) -> None:
        self.proto.dataReceived(b"".join(encode(p, 5) for p in packets))

    def send_raw(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def connect5(self, client_id: str = "c", clean: bool = True, keepalive: int = 0,
                 will: Will | None = None, **props: Any) -> Connack:
        self.send(Connect("MQTT", 5, client_id, clean, keepalive, will,
                          properties=Properties(**props) if props else None))
        got = self.received()
        assert got and isinstance(got[0], Connack), got
        self.pending = got[1:]
        return got[0]


def client5(h: Harness) -> Client5:
    return Client5(h.factory)


def connected(h: Harness, client_id: str = "c", **props: Any) -> Client5:
    c = client5(h)
    ack = c.connect5(client_id, **props)
    assert ack.return_code == 0, ack
    return c


def closed_with(c: Client5, code: int) -> Disconnect:
    got = c.received()
    assert got and isinstance(got[-1], Disconnect), got
    assert got[-1].reason_code == code, got[-1]
    assert not c.open
    return got[-1]

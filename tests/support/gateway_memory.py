"""A gateway wired to an in-memory core (no tests here): ``amqp_memory.Net``'s broker on
its ``task.Clock``, the gateway's ``UpstreamPool`` whose connections reach that
broker's ``AMQPConnection`` through ``StringTransport``, and MQTT clients as
``GatewayProtocol`` objects driven packet by packet.  ``Net.pump`` moves the bytes
(each ``Upstream`` wire is one of its peers), so every contract message the gateway
sends is read by the core's own services, and every answer comes from them.
"""

from __future__ import annotations

from typing import Any

from amqp_memory import Net
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.frontend import GatewayFactory, GatewayProtocol
from mqttamqp.gateway.pool import UpstreamPool
from mqttamqp.gateway.target import Upstream
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Connect, Packet, Will

__all__ = ["Gateway", "Client", "Wire"]


class Wire:
    """One upstream connection: the gateway's engine ↔ the core's AMQPConnection."""

    def __init__(self, net: Net, conn: UpstreamConnection) -> None:
        self.net = net
        self.conn = conn
        self.server = net.factory.buildProtocol(None)
        self.server_side = StringTransport()
        self.client_side = StringTransport()
        self.lost = False

    def step(self) -> bool:
        if self.lost:
            return False
        moved = False
        out = self.client_side.value()
        if out:
            self.client_side.clear()
            self.server.dataReceived(out)
            moved = True
        back = self.server_side.value()
        if back:
            self.server_side.clear()
            self.conn.dataReceived(back)
            moved = True
        if self.server_side.disconnecting or self.client_side.disconnecting:
            self.cut()
            moved = True
        return moved

    def cut(self) -> None:
        """The TCP connection dies (both ends see it)."""
        if not self.lost:
            self.lost = True
            self.server.connectionLost(Failure(ConnectionDone()))
            self.conn.connectionLost(Failure(ConnectionDone()))


class Gateway:
    """A gateway of ``connections`` upstream connections in front of ``net``'s core."""

    def __init__(self, net: Net, connections: int = 2, credit: int = 8) -> None:
        self.net = net
        self.up = True
        self.wires: list[Wire] = []
        self.pool = UpstreamPool(net.clock, Upstream("core", 5672, False), self._connect,
                                 connections, "gw-test", 60.0, 1 << 20)
        self.factory = GatewayFactory(self.pool, net.clock, net.broker.limits, credit)
        self.pool.start()
        net.pump()

    def _connect(self, conn: UpstreamConnection) -> Deferred[Any]:
        if not self.up:
            return _refused()
        wire = Wire(self.net, conn)
        self.wires.append(wire)
        self.net.peers.append(wire)  # type: ignore[arg-type]
        wire.server.makeConnection(wire.server_side)
        conn.makeConnection(wire.client_side)
        return succeed(conn)

    def client(self, client_id: str, clean: bool = True, will: Will | None = None,
               keepalive: int = 0, bridge: bool = False) -> Client:
        return Client(self, client_id, clean, will, keepalive, bridge)


def _refused() -> Deferred[Any]:
    from twisted.internet.defer import fail

    return fail(ConnectionRefusedError("refused"))


class Client:
    """An MQTT 3.1.1 client of the gateway on a ``StringTransport`` (``bridge``: with
    Mosquitto's bridge flag)."""

    def __init__(self, gateway: Gateway, client_id: str, clean: bool, will: Will | None,
                 keepalive: int, bridge: bool = False) -> None:
        self.gateway = gateway
        proto = gateway.factory.buildProtocol(None)
        assert isinstance(proto, GatewayProtocol)
        self.proto = proto
        self.transport = StringTransport()
        self.proto.makeConnection(self.transport)
        self.decoder = Decoder()
        self.inbox: list[Packet] = []
        self.send(Connect("MQTT", 4, client_id, clean, keepalive, will, bridge=bridge))
        (self.connack,) = self.take(Connack)

    def send(self, *packets: Packet) -> None:
        self.proto.dataReceived(b"".join(encode(p) for p in packets))
        self.gateway.net.pump()

    def take(self, *kinds: type) -> list[Any]:
        """The packets of ``kinds`` received and not yet taken, in order."""
        self.gateway.net.pump()
        self.decoder.feed(self.transport.value())
        self.transport.clear()
        self.inbox.extend(self.decoder)
        taken = [p for p in self.inbox if isinstance(p, kinds)]
        self.inbox = [p for p in self.inbox if not isinstance(p, kinds)]
        return taken

    def drop(self) -> None:
        """The client's socket dies (no DISCONNECT)."""
        self.proto.connectionLost(Failure(ConnectionDone()))
        self.gateway.net.pump()

"""A WebSocket socket in its HTTP upgrade under --max-connections (``UpgradeSlots``):
counted with the MQTT connections from its accept, never twice once its upgrade is
done, released on every way its upgrade can end; beyond the bound, closed at its
accept, counted and logged as an MQTT socket is; the same in gateway mode, under
the gateway's count.  autobahn's server protocol on a fake socket, the in-memory
broker of ``support/mqtt_memory.py`` (or a ``GatewayFactory``), a ``Clock``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from mqtt_memory import ACCEPTED, Harness, TcpLikeTransport
from twisted.internet import ssl
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from wsclient import BINARY, FrameReader, client_frame, request

from mqttamqp.core.limits import Limits
from mqttamqp.gateway.frontend import GatewayFactory, GatewayProtocol
from mqttamqp.gateway.websocket import WebSocketSide
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connect
from mqttamqp.mqtt.websocket import MAX_REQUEST_HEAD, MQTTWebSocketFactory, OriginRule


class Socket(TcpLikeTransport):
    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(peerAddress=IPv4Address("TCP", host, 40000))

    def unregisterProducer(self) -> None:
        if self.producer is not None:   # (a real socket's takes none registered too)
            super().unregisterProducer()


def _ws_factory(h: Harness) -> MQTTWebSocketFactory:
    return MQTTWebSocketFactory(h.factory, h.clock, OriginRule(), reactor=h.clock)


def _accept(factory: MQTTWebSocketFactory, host: str = "127.0.0.1") -> tuple[Any, Socket]:
    """What the listening port does with a new socket: build, then connect."""
    ws = factory.buildProtocol(IPv4Address("TCP", host, 40000))
    socket = Socket(host)
    ws.makeConnection(socket)
    return ws, socket


def _count(h: Harness) -> int:
    return h.factory.opened.count()


def _lost(ws: Any, why: type[Exception] = ConnectionDone) -> None:
    """What the reactor does once the socket is closed."""
    ws.connectionLost(Failure(why()))


def test_sockets_in_their_upgrade_are_counted_and_one_more_is_closed_at_accept(
        log_lines: list[str]) -> None:
    """With --max-connections 2, two sockets that have sent nothing hold both places:
    a third WebSocket socket is closed at its accept (no WebSocket protocol built for
    it), counted as refused and as a max_connections limit hit, in the gate's line
    (one a minute for the cause, TCP's too); an MQTT socket on TCP is refused too."""
    h = Harness(max_connections=2)
    factory = _ws_factory(h)
    _accept(factory)
    _accept(factory)
    assert _count(h) == 2
    third, socket = _accept(factory)
    assert socket.disconnected   # (aborted in its connectionMade)
    assert not hasattr(third, "state")   # no autobahn protocol: nothing read or held
    assert _count(h) == 2
    tcp = h.client()
    assert not tcp.open
    stats = h.broker.stats
    assert stats.connections_refused == 2
    assert stats.limits["max_connections"] == 2
    assert [line for line in log_lines if "refusing MQTT over WebSocket connection from "
            "127.0.0.1:40000: --max-connections (2) reached" in line]


def test_under_tls_the_refused_socket_is_aborted_too() -> None:
    """A wss: listener wraps the factory in TLS: the refused socket's stand-in is
    wrapped too (not None, which TLS cannot wrap) and aborts the socket below."""
    h = Harness(max_connections=1)
    tls = TLSMemoryBIOFactory(ssl.CertificateOptions(), False, _ws_factory(h))
    tls.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1)).makeConnection(StringTransport())
    below = StringTransport()
    refused = tls.buildProtocol(IPv4Address("TCP", "127.0.0.1", 2))
    refused.makeConnection(below)
    assert below.disconnected
    assert _count(h) == 1 and h.broker.stats.connections_refused == 1


def test_an_open_websocket_is_counted_once() -> None:
    """With --max-connections 1, the socket's place passes to its MQTT connection at
    the end of its upgrade: the connection is admitted (it was not counted twice)
    and is still the one counted."""
    h = Harness(max_connections=1)
    factory = _ws_factory(h)
    ws, socket = _accept(factory)
    ws.dataReceived(request())
    assert socket.value().startswith(b"HTTP/1.1 101"), socket.value()
    socket.clear()
    assert ws.mqtt is not None and ws.mqtt.transport is not None
    assert not socket.disconnected and not socket.disconnecting
    ws.dataReceived(client_frame(encode(Connect("MQTT", 4, "w", True, 0))))
    frames = FrameReader().feed(socket.value())
    assert [f.opcode for f in frames] == [BINARY]
    decoder = Decoder()
    decoder.feed(frames[0].payload)
    assert list(decoder) == [ACCEPTED]
    assert _count(h) == 1
    assert h.broker.stats.connections_refused == 0
    assert not h.client().open    # the place is the MQTT connection's
    ws.mqtt.connectionLost(Failure(ConnectionDone()))
    _lost(ws)
    assert _count(h) == 0


def _bad_request(ws: Any, h: Harness) -> None:
    ws.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")   # no upgrade asked


def _refused_upgrade(ws: Any, h: Harness) -> None:
    ws.dataReceived(request(path="/elsewhere"))                # 404


def _wrong_version(ws: Any, h: Harness) -> None:
    ws.dataReceived(request(version=8))                        # 426


def _timeout(ws: Any, h: Harness) -> None:
    ws.dataReceived(b"GET /mqtt HTTP/1.1\r\n")
    h.clock.advance(h.broker.limits.connect_timeout + 0.1)


def _overlong_head(ws: Any, h: Harness) -> None:
    ws.dataReceived(b"GET /mqtt HTTP/1.1\r\nX-Pad: " + b"a" * MAX_REQUEST_HEAD)


def _peer_close(ws: Any, h: Harness) -> None:
    pass                                                       # closed having sent nothing


def _closed_during_upgrade(ws: Any, h: Harness) -> None:
    ws.dataReceived(request()[:40])                            # half a request


def _shutdown(ws: Any, h: Harness) -> None:
    for conn in h.factory.opened.all():                        # the shutdown sweep
        conn.server_stopping()


@pytest.mark.parametrize("path", [_bad_request, _refused_upgrade, _wrong_version, _timeout,
                                  _overlong_head, _peer_close, _closed_during_upgrade,
                                  _shutdown], ids=lambda f: f.__name__.strip("_"))
def test_the_place_is_released_however_the_upgrade_ends(
        path: Callable[[Any, Harness], None]) -> None:
    """Each way a socket's upgrade can end without opening releases its place once
    the socket is lost (it holds its place while it is being closed), and a new
    socket then has it."""
    h = Harness(max_connections=1, connect_timeout=5)
    factory = _ws_factory(h)
    ws, _ = _accept(factory)
    path(ws, h)
    assert _count(h) == 1
    _lost(ws, ConnectionLost)
    assert _count(h) == 0
    assert h.clock.getDelayedCalls() == []
    _, socket = _accept(factory)
    assert not socket.disconnected and _count(h) == 1


def test_the_shutdown_sweep_cuts_a_socket_in_its_upgrade() -> None:
    """The broker's sweeps of its open MQTT connections (shutdown, --ha fencing)
    reach the sockets still in their upgrade."""
    h = Harness()
    ws, socket = _accept(_ws_factory(h))
    assert h.factory.opened.all() == [ws]
    ws.server_stopping()
    assert socket.disconnected


def test_a_websocket_spends_one_connection_rate_token() -> None:
    """The connection rate of an address is checked at a WebSocket's accept, as a TCP
    socket's is; its MQTT connection, admitted at the end of the upgrade, gets the
    token back first: one token a WebSocket, not two."""
    h = Harness(max_connect_rate=1, connect_burst=1)
    ws, socket = _accept(_ws_factory(h), host="192.0.2.7")
    ws.dataReceived(request(host="192.0.2.7"))
    assert socket.value().startswith(b"HTTP/1.1 101"), socket.value()
    assert not socket.disconnected
    assert h.broker.stats.connections_refused == 0
    _, again = _accept(_ws_factory(h), host="192.0.2.7")   # (the bucket is empty)
    assert again.disconnected and h.broker.stats.connections_refused == 1
    h.clock.advance(1)
    _, later = _accept(_ws_factory(h), host="192.0.2.7")
    assert not later.disconnected


def test_one_address_cannot_hold_every_place_with_sockets_in_their_upgrade() -> None:
    """A WebSocket socket's accept spends its address's --max-connect-rate token: with
    a rate of 1 and a burst of 1, ten sockets from one address leave one in its
    upgrade (nine refused at accept, the rate's limit counted), and a client from
    another address still connects."""
    h = Harness(max_connections=10, max_connect_rate=1, connect_burst=1)
    factory = _ws_factory(h)
    sockets = [_accept(factory, host="192.0.2.7")[1] for _ in range(10)]
    assert sum(not s.disconnected for s in sockets) == 1 and _count(h) == 1
    assert h.broker.stats.limits.get("connect_rate") == 9
    other = h.client()
    other.connect("other")
    assert other.open


def test_a_failed_hand_over_closes_the_socket(log_lines: list[str]) -> None:
    """Building the MQTT connection at the end of the upgrade raises: the socket,
    no longer counted in its upgrade nor timed, is closed, not left open, with one
    line that says why."""
    h = Harness(max_connections=1)
    ws, socket = _accept(_ws_factory(h))

    def fails(addr: Any) -> Any:
        raise RuntimeError("no MQTT connection")

    h.factory.buildProtocol = fails  # type: ignore[method-assign]
    ws.dataReceived(request())
    assert socket.disconnected and _count(h) == 0
    assert len([line for line in log_lines if "could not be built" in line]) == 1


# -- gateway mode: the gateway's own count ---------------------------------------------


class _NoUpstream:
    def pick(self, prefer: Any = None) -> Any:
        return None


def _gateway(max_connections: int) -> tuple[GatewayFactory, MQTTWebSocketFactory]:
    clock = Clock()
    gateway = GatewayFactory(_NoUpstream(), clock,  # type: ignore[arg-type]
                             Limits(max_connections=max_connections), 8)
    return gateway, MQTTWebSocketFactory(WebSocketSide(gateway), clock, OriginRule(),
                                         reactor=clock)


def test_a_gateway_counts_sockets_in_their_upgrade_too() -> None:
    """In gateway mode, sockets in their upgrade hold places under the gateway's
    --max-connections: one more WebSocket socket, or TCP one, is refused (counted in
    its refused connections); a socket that leaves gives its place back; at the end
    of an upgrade the place passes to the client (counted once); the gateway's
    close_all cuts a socket still in its upgrade."""
    gateway, factory = _gateway(2)
    first, _ = _accept(factory)
    _accept(factory)
    assert len(gateway.upgrading) == 2
    _, socket = _accept(factory)
    assert socket.disconnected
    assert not isinstance(gateway.buildProtocol(None), GatewayProtocol)
    assert gateway.refused_connections == 2
    _lost(first)
    assert len(gateway.upgrading) == 1
    ws, socket = _accept(factory)
    ws.dataReceived(request())
    assert socket.value().startswith(b"HTTP/1.1 101"), socket.value()
    assert ws not in gateway.upgrading and ws.mqtt in gateway.connections
    assert len(gateway.upgrading) + len(gateway.connections) == 2
    assert gateway.refused_connections == 2
    (left,) = gateway.upgrading
    gateway.close_all("stopping")
    assert left.transport.disconnected

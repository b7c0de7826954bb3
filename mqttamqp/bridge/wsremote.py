"""``ws://`` and ``wss://`` remotes: the bridge's MQTT client over a WebSocket.

What it owns: connecting one ``BridgeClient`` through autobahn's Twisted WebSocket
client (the library the broker's own ``--mqtt-ws`` listener runs on), asking for the
subprotocol ``mqtt``, with the opening handshake bounded by ``connect-timeout`` and
frames and messages bounded by ``MAX_FRAME_PACKETS`` times ``--max-packet-size``
(what a remote sends above that closes the connection, as on the broker's listener);
once the WebSocket is open the client runs on ``net.websocket.StreamOverWebSocket``,
the same stream view the listener gives ``MQTTProtocol`` (each write one binary
message; producers, pausing and aborting are the socket's, so back-pressure and
"the remote is not read" work as on TCP).  The connect Deferred fires when the
WebSocket is open, and fails when the TCP connection, TLS or the handshake does.

What it must not do: know MQTT (``client`` does) or decide when to connect
(``bridge`` does).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.python.failure import Failure

from mqttamqp.bridge.client import BridgeClient
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.net.websocket import QuietLog, StreamOverWebSocket

__all__ = ["MAX_FRAME_PACKETS", "SUBPROTOCOL", "HandshakeFailed", "connect_websocket"]

SUBPROTOCOL = "mqtt"
MAX_FRAME_PACKETS = 4   # (as the broker's listener: a frame may hold several packets)


class HandshakeFailed(Exception):
    """The WebSocket did not open (the remote refused the request, or closed)."""


class _Remote(WebSocketClientProtocol):
    """One WebSocket to the remote, carrying one ``BridgeClient``'s bytes."""

    log = QuietLog()
    factory: _Factory

    def __init__(self) -> None:
        super().__init__()
        self.stream: StreamOverWebSocket | None = None

    def connectionMade(self) -> None:
        self.factory.socket = self.transport   # (a cancelled attempt aborts it)
        super().connectionMade()

    def onOpen(self) -> None:
        factory = self.factory
        self.stream = StreamOverWebSocket(self)   # type: ignore[arg-type]
        factory.client.makeConnection(self.stream)  # type: ignore[no-untyped-call]
        if not factory.opened.called:
            factory.opened.callback(factory.client)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if isBinary:
            self.factory.client.dataReceived(payload)
        else:
            self.factory.client.drop("a text WebSocket message from the remote")

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        factory = self.factory
        why = f"WebSocket closed ({code or 'no code'}{': ' + reason if reason else ''})"
        if self.stream is None:
            if not factory.opened.called:
                factory.opened.errback(HandshakeFailed(f"WebSocket handshake failed: "
                                                       f"{reason or why}"))
            return
        self.stream = None
        factory.client.connectionLost(Failure(ConnectionDone(why) if wasClean
                                              else ConnectionLost(why)))


class _Factory(WebSocketClientFactory):
    protocol = _Remote  # type: ignore[assignment]
    noisy = False
    log = QuietLog()

    def __init__(self, url: str, client: BridgeClient, opened: Deferred[Any],
                 settings: BridgeSettings, max_packet_size: int) -> None:
        super().__init__(url, protocols=[SUBPROTOCOL])  # type: ignore[no-untyped-call]
        self.client = client
        self.opened = opened
        self.socket: Any = None
        limit = MAX_FRAME_PACKETS * max_packet_size
        self.setProtocolOptions(  # type: ignore[no-untyped-call]
            openHandshakeTimeout=settings.connect_timeout,
            closeHandshakeTimeout=settings.connect_timeout,
            maxFramePayloadSize=limit, maxMessagePayloadSize=limit)


def url_of(settings: BridgeSettings) -> str:
    """The WebSocket URL of a ``ws(s)://`` address (path ``/mqtt`` unless it has one)."""
    parts = urlsplit(settings.address)
    path = parts.path or "/mqtt"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"     # an IPv6 address
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{host}:{settings.port}{path}{query}"


def connect_websocket(endpoint: Any, settings: BridgeSettings, max_packet_size: int,
                      client: BridgeClient) -> Deferred[Any]:
    """Connect ``client`` over ``endpoint`` (TCP, or TLS for wss://) and a WebSocket;
    fires with it once the WebSocket is open.  Cancelling it drops the attempt."""
    connecting: list[Any] = []

    def cancel(_: Deferred[Any]) -> None:
        for d in connecting:
            d.cancel()
        if factory.socket is not None:   # (connected, the handshake under way)
            factory.socket.abortConnection()

    opened: Deferred[Any] = Deferred(cancel)
    factory = _Factory(url_of(settings), client, opened, settings, max_packet_size)
    tcp = endpoint.connect(factory)
    connecting.append(tcp)

    def failed(failure: Failure) -> None:
        if not opened.called:
            opened.errback(failure)

    tcp.addErrback(failed)
    return opened

"""A WebSocket seen as a byte stream: the transport a protocol written for TCP
(``MQTTProtocol``) runs on when its bytes travel in autobahn's WebSocket messages.

What it owns: ``StreamOverWebSocket`` (each ``write`` one binary message; reading,
producers, addresses and aborting are the underlying socket's, so back-pressure
and the TLS peer certificate work as on TCP), the RFC 6455 close codes, and
``QuietLog``, the logger given to autobahn's protocol and factory classes.

What it must not do: know the protocol it carries, check a handshake (the
protocol's WebSocket server does: ``mqtt.websocket``), or import the core.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autobahn.twisted.websocket import WebSocketServerProtocol
from twisted.internet.interfaces import IPushProducer, ISSLTransport, ITransport
from twisted.logger import Logger
from zope.interface import alsoProvides, implementer  # type: ignore[import-untyped]

__all__ = ["CLOSE_NORMAL", "CLOSE_TOO_BIG", "CLOSE_UNSUPPORTED_DATA", "QuietLog",
           "StreamOverWebSocket"]

# RFC 6455 close codes.
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_TOO_BIG = 1009


@implementer(ITransport, IPushProducer)
class StreamOverWebSocket:
    """The transport a stream protocol (``MQTTProtocol``) sees on a WebSocket: writes
    become binary messages; addresses, producers, pausing and aborting are the underlying
    socket's (so its write buffer gives the protocol the same back-pressure, and
    the same QoS 0 backlog accounting, as on TCP)."""

    def __init__(self, ws: WebSocketServerProtocol) -> None:
        self._ws = ws
        self._socket: Any = ws.transport
        self.disconnecting = False
        if ISSLTransport.providedBy(self._socket):
            # wss: the protocol reads the client certificate (--tls-cert-as-user).
            alsoProvides(self, ISSLTransport)

    def write(self, data: bytes) -> None:
        # Once a close frame went either way the WebSocket takes no more messages
        # (autobahn raises); the connection is ending, as a TCP socket's write after
        # the peer's FIN, so the bytes are dropped.  Never raise into the router.
        ws = self._ws
        if not self.disconnecting and ws.state == ws.STATE_OPEN:
            ws.sendMessage(data, isBinary=True)  # type: ignore[no-untyped-call]

    def writeSequence(self, data: Iterable[bytes]) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        """What was written is already on the socket; the closing handshake follows
        it (autobahn drops the socket if the peer does not answer in time)."""
        if not self.disconnecting:
            self.disconnecting = True
            self._ws.sendClose(CLOSE_NORMAL)

    def abortConnection(self) -> None:
        self.disconnecting = True
        self._socket.abortConnection()

    @property
    def disconnected(self) -> bool:
        """The socket below is closed (TCP's flag; under TLS, the TCP one's): the
        close grace's cut has nothing left to cut (``adapter.grace``)."""
        socket = self._socket
        return bool(getattr(socket, "disconnected", False) or getattr(
            getattr(socket, "transport", None), "disconnected", False))

    def getPeer(self) -> Any:
        return self._socket.getPeer()

    def getHost(self) -> Any:
        return self._socket.getHost()

    def getPeerCertificate(self) -> Any:
        return self._socket.getPeerCertificate()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self._socket.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self._socket.unregisterProducer()

    # Reading: the protocol pauses and resumes the socket itself.
    def pauseProducing(self) -> None:
        self._socket.pauseProducing()

    def resumeProducing(self) -> None:
        self._socket.resumeProducing()

    def stopProducing(self) -> None:
        self._socket.stopProducing()


class QuietLog:
    """autobahn's logger for a WebSocket server that logs its peers' faults itself,
    once per cause (``mqtt.websocket``): autobahn's lines would repeat them,
    unlimited (a refused handshake is two of its lines); errors still reach the
    log."""

    def __init__(self) -> None:
        self._log = Logger(namespace="autobahn")

    def error(self, fmt: str, **kw: Any) -> None:
        self._log.error(fmt, **kw)

    critical = error

    def failure(self, fmt: str, failure: Any = None, **kw: Any) -> None:
        self._log.failure(fmt, failure, **kw)

    def _drop(self, *args: Any, **kw: Any) -> None:
        pass

    trace = debug = info = warn = _drop

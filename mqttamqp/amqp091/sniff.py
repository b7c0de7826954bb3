"""The AMQP port shared by AMQP 1.0 and 0.9.1: the 8-byte protocol header decides.

What it owns: ``SharedPortFactory`` (what the AMQP listeners, plain and TLS, are
given) and ``HeaderSniffer``, the protocol of a socket until its header is read:
``AMQP 0 0 9 1`` hands the socket to a 0.9.1 connection, ``AMQP 0 1 0 0`` and
``AMQP 3 1 0 0`` to the AMQP 1.0 connection, unchanged; the bytes read so far are
fed to the one chosen, and from then on the transport calls it directly (no
cost per read after the switch).  Anything else gets the 0.9.1 header back and
a close (AMQP 0.9.1 §4.2.2), with one log line a minute for that cause.  A socket
that sends no header within the connect time-out is dropped.  The factory keeps
the sockets still waiting for their header (``connections``, one entry each until
the header, the time-out or the close), so that the service can abort them when --ha
leadership is lost, as it does the connections of every protocol.  They are bounded
by ``bound`` (the service gives --max-connections): a socket accepted while that
many wait for their header is closed at once, counted (in ``stats``, the broker's,
as a refused connection and a ``max_connections`` limit hit) and logged, one line a
minute (aborted: ``net.accept.RefusedAtAccept``, under TLS too).

What it must not do: speak either protocol beyond the header.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.amqp091.negotiation import HEADER_091, sniff
from mqttamqp.amqp091.negotiation import Protocol as Kind
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.net.accept import RefusedAtAccept

__all__ = ["SharedPortFactory", "HeaderSniffer", "shared_port"]


class HeaderSniffer(Protocol):
    """A socket whose protocol header has not come yet."""

    log = Logger()
    transport: Any

    def __init__(self, factory: SharedPortFactory) -> None:
        self.factory = factory
        self._buffer = b""
        self._timer: DelayedCall | None = None
        self._done = False

    def connectionMade(self) -> None:
        self.factory.connections.add(self)
        self._timer = self.factory.clock.callLater(self.factory.timeout, self._timed_out)

    def dataReceived(self, data: bytes) -> None:
        if self._done:
            return
        self._buffer += data
        kind = sniff(self._buffer)
        if kind is None:
            return
        self._done = True
        self._cancel()
        self.factory.connections.discard(self)
        if kind == Kind.AMQP091:
            self._switch(self.factory.amqp091, self._buffer[8:])
        elif kind == Kind.AMQP10:
            self._switch(self.factory.amqp10, self._buffer)
        else:
            peer = self.transport.getPeer()
            held = self.factory.log_limit.allow("unknown header")
            if held is not None:
                self.log.info("AMQP port: {peer} sent no AMQP protocol header ({h!r}); "
                              "answered with the 0.9.1 header and closed{more}",
                              peer=f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}",
                              h=self._buffer[:8],
                              more=f" ({held} more since the last line)" if held else "")
            self.transport.write(HEADER_091)
            self.transport.loseConnection()

    def _switch(self, factory: Any, first: bytes) -> None:
        transport = self.transport
        protocol = factory.buildProtocol(transport.getPeer())
        if hasattr(transport, "wrappedProtocol"):     # TLS: the TLS protocol wraps us
            transport.wrappedProtocol = protocol
        else:
            transport.protocol = protocol
        self._buffer = b""
        protocol.makeConnection(transport)
        if first:
            protocol.dataReceived(first)

    def _timed_out(self) -> None:
        self._timer = None
        if not self._done:
            self._done = True
            self.transport.abortConnection()

    def _cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._cancel()
        self.factory.connections.discard(self)


class SharedPortFactory(Factory):
    """What an AMQP listener is given: a sniffer per socket, then the factory of the
    protocol its header names."""

    noisy = False

    log = Logger()

    def __init__(self, amqp10: Any, amqp091: Any, clock: Clock, timeout: float,
                 bound: int | None = None, stats: Any = None) -> None:
        self.amqp10 = amqp10
        self.amqp091 = amqp091
        self.clock = clock
        self.timeout = timeout
        self.log_limit = LogLimiter(clock.seconds)
        # sockets whose header has not come, at most ``bound`` (None: no bound)
        self.connections: set[HeaderSniffer] = set()
        self.bound = bound
        self.stats = stats

    def buildProtocol(self, addr: Any) -> HeaderSniffer | RefusedAtAccept:
        if self.bound is not None and len(self.connections) >= self.bound:
            if self.stats is not None:
                self.stats.connections_refused += 1
                self.stats.limit_hit("max_connections")
            held = self.log_limit.allow("pending")
            if held is not None:
                self.log.warn("AMQP port: {n} sockets are waiting for their protocol "
                              "header (--max-connections); closing a new one from {peer} "
                              "at once{more}", n=len(self.connections),
                              peer=f"{getattr(addr, 'host', '?')}:{getattr(addr, 'port', '?')}",
                              more=f" ({held} more since the last line)" if held else "")
            return RefusedAtAccept()   # (not None: an ssl: listener wraps it)
        return HeaderSniffer(self)


def shared_port(amqp10: Any, amqp091: Any, broker: Any, clock: Clock) -> SharedPortFactory:
    """The AMQP port's factory for the broker's two AMQP factories: each counts the
    other's connections under --max-connections (one port), and the sockets waiting
    for their header are bounded by it too, timed out after --connect-timeout."""
    amqp091.port_sharers = amqp10.connections
    amqp10.port_sharers = amqp091.connections
    limits = broker.limits
    return SharedPortFactory(amqp10, amqp091, clock, limits.connect_timeout,
                             limits.max_connections, broker.stats)

"""Writing to a TCP transport without waiting for the next reactor turn.

Twisted's ``transport.write`` buffers, registers the socket with epoll and sends
on the next turn of the reactor: two epoll calls per write and one turn of
latency per hop, which profiles of the broker put at a tenth of its reactor
thread.  ``send`` gives the bytes to the socket at once when nothing is
buffered on a plain TCP transport; what the socket does not take is written
through the transport as usual, so its buffer and its producer (pauseProducing
past 64 KiB) work unchanged.  TLS and WebSocket transports take the usual path.

Only for a protocol that batches its own output and sets TCP_NODELAY (MQTT):
many small sends in a row (AMQP's frames, written as proton produces them) run
into Nagle's algorithm and the peer's delayed ACKs (AMQP fell to a tenth).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.tcp import Port, Server

__all__ = ["LeanServer", "lean_port", "plain_tcp", "send"]


def _no_fileno() -> int:
    return -1


class LeanServer(Server):
    """``tcp.Server`` without three objects per connection that an idle broker
    keeps for every client: the ``logstr`` and ``repstr`` strings (~150 bytes,
    read only when Twisted logs or a repr is taken) and ``fileno``, a bound method
    of the socket (72 bytes).  Each is computed when read; Twisted's assignments
    of them are ignored.  Behaviour is otherwise Twisted's own.
    """

    @property
    def logstr(self) -> str:
        return f"{self._getLogPrefix(self.protocol)},{self.sessionno},{self.hostname}"

    @logstr.setter
    def logstr(self, value: str) -> None:
        pass

    @property
    def repstr(self) -> str:
        server = self.server
        port = server._realPortNumber if server is not None else None
        protocol = getattr(self, "protocol", None)
        return f"<{type(protocol).__name__} #{self.sessionno} on {port}>"

    @repstr.setter
    def repstr(self, value: str) -> None:
        pass

    @property
    def fileno(self) -> Callable[[], int]:
        # (after the connection is lost Twisted deletes its socket: -1, as
        # ``FileDescriptor.fileno``.  Not ``self.__dict__``: reading it makes
        # CPython build the instance's dict, 64 bytes more.)
        try:
            return self.socket.fileno
        except AttributeError:
            return _no_fileno

    @fileno.setter
    def fileno(self, value: Callable[[], int]) -> None:
        pass

    @fileno.deleter
    def fileno(self) -> None:
        pass


def lean_port(port: Any) -> None:
    """Make a plain TCP listening port build ``LeanServer`` transports."""
    if type(port) is Port and port.transport is Server:
        port.transport = LeanServer


_PLAIN = (Server, LeanServer)


def send(transport: Any, data: bytes) -> None:
    """``transport.write(data)``, sent at once when that changes nothing else."""
    if (type(transport) in _PLAIN and transport.connected and not transport._tempDataLen
            and transport.offset >= len(transport.dataBuffer)
            and not transport.disconnecting and not transport._writeDisconnected):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):    # (else the connection is lost: write() finds out)
            if sent >= len(data):
                return
            data = data[sent:]
    transport.write(data)


def plain_tcp(transport: Any) -> bool:
    """A plain (not TLS, not WebSocket) TCP server transport."""
    return type(transport) in _PLAIN

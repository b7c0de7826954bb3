"""Writing to a TCP transport without waiting for the next reactor turn.

Twisted's ``transport.write`` buffers, registers the socket with epoll and sends
on the next turn of the reactor: two epoll calls per write and one turn of
latency per hop, which profiles of the broker put at a tenth of its reactor
thread.  ``send`` gives the bytes to the socket at once when nothing is
buffered on a plain TCP transport; what the socket does not take is written
through the transport as usual, so its buffer and its producer (pauseProducing
past 64 KiB) work unchanged.  TLS and WebSocket transports take the usual path.

Only for a protocol that batches its own output and sets TCP_NODELAY (MQTT
per batch, AMQP once per pump of its engine): many small sends in a row without
TCP_NODELAY (AMQP's frames, once written as proton produced them) run into
Nagle's algorithm and the peer's delayed ACKs (AMQP fell to a tenth).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.tcp import Server

__all__ = ["send"]


def send(transport: Any, data: bytes) -> None:
    """``transport.write(data)``, sent at once when that changes nothing else."""
    if (type(transport) is Server and transport.connected and not transport._tempDataLen
            and transport.offset >= len(transport.dataBuffer)
            and not transport.disconnecting and not transport._writeDisconnected):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):    # (else the connection is lost: write() finds out)
            if sent >= len(data):
                return
            data = data[sent:]
    transport.write(data)

"""Writing to a plain TCP transport at once: ``send``, ``register_push_producer``,
``plain_tcp``; the part of ``net.tcp`` that runs for every write and every connect.

``net.tcp`` says why a write goes to the socket in the call (its docstring, "Writing
at once").  These three live apart from it so that the compiled build can compile
them (setup.py ``COMPILED``): ``net.tcp``'s classes subclass Twisted's and stay
interpreted, and ``send`` runs 1.7 times a paced message and once a connect (the
CONNACK).  The transport classes they know are kept in ``KINDS``, one object whose
fields ``net.tcp`` replaces as listening ports start (``_for_port``) and stop
(``_forget``): the compiled functions read a field of a native object, and see each
new tuple.

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

from typing import Any, Final

from twisted.internet.tcp import Server

__all__ = ["KINDS", "Kinds", "plain_tcp", "register_push_producer", "send"]


class Kinds:
    """The transport classes that are plain TCP (``plain``: Twisted's ``Server`` and
    the lean ones with each listening port's own) and the lean ones among them
    (``lean``).  Replaced, never changed in place, by ``net.tcp``."""

    __slots__ = ("lean", "plain")

    def __init__(self, plain: tuple[type, ...], lean: tuple[type, ...]) -> None:
        self.plain = plain
        self.lean = lean


#: (``net.tcp`` adds its classes when it is imported)
KINDS: Final = Kinds((Server,), ())

_SEND_LIMIT: Final[int] = Server.SEND_LIMIT   # (more at once: through ``writeSomeData``)


def register_push_producer(transport: Any, producer: Any) -> None:
    """``transport.registerProducer(producer, True)``; on a ``LeanServer`` without the
    calls through Twisted's TLS check (``_newtls.ConnectionMixin``), and with
    ``streamingProducer`` left at its class default."""
    if (type(transport) in KINDS.lean and transport.producer is None
            and not transport.disconnected and not transport.TLS):
        transport.producer = producer
    else:
        transport.registerProducer(producer, True)


def send(transport: Any, data: bytes) -> None:
    """``transport.write(data)``, sent at once when that changes nothing else."""
    if (type(transport) in KINDS.plain and transport.connected and not transport._tempDataLen
            and transport.offset >= len(transport.dataBuffer)
            and not transport.disconnecting and not transport._writeDisconnected
            and not transport._aborting):   # (``abortConnection``: nothing more goes out)
        # The socket's own ``send``, which ``writeSomeData`` calls through a
        # memoryview and ``untilConcludes`` (two Python calls more a write; a paced
        # message is two writes).  Would block, interrupted, or lost: ``write``
        # buffers what is left, and its next write finds the error.
        sent: int
        if len(data) <= _SEND_LIMIT:
            try:
                sent = transport.socket.send(data)
            except OSError:
                sent = 0
        else:
            written = transport.writeSomeData(data)   # (its first SEND_LIMIT bytes)
            sent = written if isinstance(written, int) else 0   # (else: the connection is lost)
        if sent >= len(data):
            return
        if sent:
            data = data[sent:]
    transport.write(data)


def plain_tcp(transport: Any) -> bool:
    """A plain (not TLS, not WebSocket) TCP server transport."""
    return type(transport) in KINDS.plain

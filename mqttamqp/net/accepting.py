"""``net.tcp.LeanPort``'s accept loop and ``LeanServer``'s ``__init__`` as plain
functions, which the compiled build compiles (setup.py ``COMPILED``): ``net.tcp``'s
classes subclass Twisted's and stay interpreted, and these two bodies ran once a
connect as interpreted frames (the loop ~90 bytecodes, ``__init__`` ~70 and the
type call's lookup of a Python ``__init__``).  What they do is ``net.tcp``'s, as its
docstrings say; they are only moved.

What it must not do: know any protocol, import the broker's core, or import
``net.tcp`` (which imports it).
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.address import IPv6Address

__all__ = ["accept_loop", "lean_server", "init_lean_server"]


def init_lean_server(self: Any, sock: Any, protocol: Any, client: tuple[Any, ...],
                     server: Any, reactor: Any) -> None:
    """``LeanServer.__init__``'s body (``Connection.__init__`` and
    ``FileDescriptor.__init__``, less the defaults): see ``net.tcp.LeanServer``."""
    self.reactor = reactor
    self.socket = sock
    sock.setblocking(False)
    self.protocol = protocol
    if len(client) != 2:
        self._addressType = IPv6Address
        self._client6 = client
    own = self._own_port   # (a port's own class: ``lean_port``)
    if own is None or own() is not server:
        self.server = server
    self.peer = f"{client[0]}:{client[1]}"
    # (``startReading``; under ``net.dispatch``'s lean dispatch without the
    # three Python calls of ``startReading``, ``addReader`` and ``_add``)
    add_reader = getattr(reactor, "_lean_add_reader", None)
    if add_reader is None:
        self.startReading()
    else:
        add_reader(self, sock.fileno())


def lean_server(cls: Any, sock: Any, protocol: Any, client: tuple[Any, ...], server: Any,
                reactor: Any) -> Any:
    """``cls(sock, protocol, client, server, sessionno, reactor)`` for a class whose
    ``__init__`` is ``LeanServer``'s (``init_lean_server``): the object made and
    initialised without the type call's lookup and call of a Python ``__init__``."""
    transport = object.__new__(cls)
    init_lean_server(transport, sock, protocol, client, server, reactor)
    return transport


def accept_loop(port: Any, reactor: Any, read: Any, readable: int, reads: Any,
                read_accepted: Any, lean: bool) -> bool:
    """``LeanPort._accept_and_read``'s loop over the waiting connections (see
    ``net.tcp.LeanPort``).  ``lean``: the port's transport class has
    ``LeanServer``'s ``__init__`` (``lean_server`` builds it).  True: an accept failed
    otherwise than "no more connections", and the caller hands the rest of the turn
    to Twisted's ``Port.doRead`` (which handles it); False: done."""
    listener: Any = port.socket
    accept = listener._accept
    family, kind, proto = listener.family, listener.type, listener.proto
    factory: Any = port.factory
    address: Any = port._buildAddr if getattr(factory, "wants_address", True) else None
    build: Any = port.transport
    limit: int = port.numberAccepts
    accepted = 0
    while accepted < limit:
        if port.disconnecting:
            return False
        try:
            fd, addr = accept()
        except BlockingIOError:
            break
        except OSError:
            return True
        accepted += 1
        skt = socket.socket(family, kind, proto, fd)
        if len(addr) == 4:
            # IPv6: the host with its scope id, as ``Port.doRead``
            host = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
            addr = (host[0], *addr[1:])
        protocol = factory.buildProtocol(None if address is None else address(addr))
        if protocol is None:
            skt.close()
            continue
        session: int = port.sessionno
        port.sessionno = session + 1
        if lean:
            transport: Any = lean_server(build, skt, protocol, addr, port, reactor)
        else:
            transport = build(skt, protocol, addr, port, session, reactor)
        protocol.makeConnection(transport)
        if fd in reads and transport.connected and not transport.disconnecting:
            if read_accepted is None:
                read(transport, fd, readable)
            else:
                read_accepted(transport, fd)
    # (Twisted's scaling of the accepts per turn)
    port.numberAccepts = limit + 20 if accepted == limit else max(1, accepted)
    return False

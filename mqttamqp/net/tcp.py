"""Lean TCP transports: writing without waiting for the next reactor turn, reading
a new connection in the turn that accepts it, and less memory per connection.

Writing at once (``send``, in ``net.sending``, which the compiled build compiles):

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

``others_waiting`` asks the reactor's poller whether any other descriptor has
input ready, for a connection deciding whether to end its share of a turn.

``lean_port`` turns a listening ``tcp.Port`` into a ``LeanPort`` (its class is
swapped: Twisted builds the port inside ``listenTCP``/endpoints, so there is no
earlier place to choose the class) that builds ``LeanServer`` transports.

Every private name of Twisted used here (``_reads``, ``_doReadOrWrite``,
``_POLL_IN``, ``_poller``, ``_tempDataLen``, ``_writeDisconnected``, ``_aborting``, ...) is checked
against the installed Twisted by ``tests/unit/net/test_net_pins.py``; the versions they were
read from are pinned in pyproject.toml (see ``mqttamqp.net``).

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

import socket
import sys
import weakref
from collections.abc import Callable
from typing import Any

from twisted.internet.tcp import Port, Server
from twisted.python import log

from mqttamqp.net.accepting import accept_loop, init_lean_server
from mqttamqp.net.sending import KINDS

__all__ = ["LeanPort", "LeanServer", "LeanServerNoDelay", "lean_port", "others_waiting",
           "watch_port_classes"]


# protocol class -> its log prefix (a handful of classes)
_PREFIXES: dict[type, str] = {}


def _no_fileno() -> int:
    return -1


class LeanServer(Server):
    """``tcp.Server`` for a broker that holds many idle clients.

    * It keeps no ``logstr`` and ``repstr`` strings (~150 bytes a connection, read
      only when Twisted logs or a repr is taken) and no ``fileno`` (a bound method
      of the socket, 72 bytes): each is made when read; and ``__init__`` does not
      format the two strings (a connect storm's CPU).
    * ``nodelay``: the listening socket has TCP_NODELAY, which Linux gives every
      socket it accepts (``lean_port``), so the protocol need not set it again.
    * One representation of the peer's address, ``peer`` (``"host:port"``, what
      the console and the logs show): Twisted's ``client`` tuple and ``hostname``
      (a tuple, the host string and the port number, 146 bytes a connection) are
      made from it when read (``getPeer``, ``logstr``).  An IPv6 peer keeps its
      tuple too (its flow info and scope id are not in ``peer``).
    * Twisted's write list (``_tempDataBuffer``, 56 bytes) only while it holds
      something: an idle connection, or one whose writes the socket took at once
      (``send``), has none.

    * No session number (an int of 32 bytes past 256, read only for reprs and
      Twisted's ``logstr``): ``sessionno`` is the socket's descriptor number, which
      tells open connections apart as well.
    * What Twisted sets on every transport and an idle one leaves at its first
      value (``_tempDataLen`` 0, ``connected`` 1, ``streamingProducer`` for the one
      push producer ``register_push_producer`` gives it) is a class default, not an
      entry in the instance's dict (8 bytes each): Twisted's own assignments, when
      it writes or closes, make the entry.

    * ``reactor`` is a slot, not an entry in the instance's dict: the transport
      object has room for it in its pymalloc block (56 bytes in the 64-byte class),
      and the dict's values (socket, protocol, server, peer, producer) fit the 64-
      rather than the 80-byte class.  A slot is read as fast as a dict entry
      (``LOAD_ATTR_SLOT``), on the write path (``startWriting``) too.
    * ``server`` (the listening port, read only for ``repr``) is a class attribute
      of a class made for each port (``lean_port``): the dict's values (socket,
      protocol, peer, producer) fit the 48-byte class.  The class holds its port
      by weak reference only (``_PortOf``; None once the port is gone), so it
      never keeps a stopped port, its factory and broker alive.  Those classes are
      in the tuples ``send`` and the others check a transport's type against
      (first: the check finds them at once), and in the fast read classes of
      ``net.dispatch`` (``watch_port_classes``), until their port's
      ``connectionLost`` (``LeanPort``) takes them out.

    ``__init__`` is ``Server.__init__`` (and ``Connection``'s and
    ``FileDescriptor``'s) without the strings and the defaults; behaviour is
    otherwise Twisted's own (tests/unit/net/test_netio.py compares the two).
    """

    __slots__ = ("reactor",)

    nodelay = False
    server: Any = None   # (a port's own class: its port, ``_PortOf``)
    _own_port: weakref.ref[Any] | None = None   # (a port's own class: ``lean_port``)
    _client6: tuple[Any, ...] | None = None   # an IPv6 peer's address tuple
    _pending: list[bytes] | None = None        # ``_tempDataBuffer`` when it has one
    _tempDataLen = 0
    connected = 1
    streamingProducer = True

    def __init__(self, sock: Any, protocol: Any, client: tuple[Any, ...], server: Any,
                 sessionno: int, reactor: Any) -> None:
        # (``Connection.__init__`` and ``FileDescriptor.__init__``, less the
        # defaults: ``net.accepting``, compiled, which ``LeanPort`` calls itself)
        init_lean_server(self, sock, protocol, client, server, reactor)

    def logPrefix(self) -> str:
        """The protocol's log prefix, without the session number and host that
        ``logstr`` adds: Twisted asks for it on every read event (the legacy log
        context of anything logged meanwhile); ``logstr`` would be formatted each
        time.  (One string per protocol class, made once.)"""
        kind = type(getattr(self, "protocol", None))
        prefix = _PREFIXES.get(kind)
        if prefix is None:
            prefix = _PREFIXES[kind] = self._getLogPrefix(getattr(self, "protocol", None))
        return prefix

    @property
    def _tempDataBuffer(self) -> list[bytes]:
        """Twisted's list of writes not yet joined into its ``dataBuffer``: made
        when Twisted first appends to it, dropped when Twisted empties it."""
        pending = self._pending
        if pending is None:
            pending = self._pending = []
        return pending

    @_tempDataBuffer.setter
    def _tempDataBuffer(self, value: list[bytes]) -> None:
        if value or self._pending is not None:   # (no dict entry until written to)
            self._pending = value or None

    @property
    def sessionno(self) -> int:
        """The socket's descriptor number (-1 once closed), in place of Twisted's
        count of accepted connections (only reprs and ``logstr`` read it)."""
        return self.fileno()

    @sessionno.setter
    def sessionno(self, value: int) -> None:
        pass

    @property
    def client(self) -> tuple[Any, ...]:
        """The peer's address as ``accept`` gave it (what ``getPeer`` wraps), made
        from ``peer`` when read."""
        client6 = self._client6
        if client6 is not None:
            return client6
        host, _, port = self.peer.rpartition(":")
        return (host, int(port))

    @client.setter
    def client(self, value: tuple[Any, ...]) -> None:
        self.peer = f"{value[0]}:{value[1]}"
        self._client6 = value if len(value) != 2 else None

    @property
    def hostname(self) -> Any:
        return self.client[0]

    @hostname.setter
    def hostname(self, value: Any) -> None:
        pass

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


class LeanServerNoDelay(LeanServer):
    """A ``LeanServer`` whose socket came with TCP_NODELAY from its listener."""

    nodelay = True


class LeanPort(Port):
    """``tcp.Port`` for a protocol whose client speaks first (MQTT's CONNECT).

    Each connection it accepts is read at once, in the same reactor turn, the way
    the reactor reads a socket epoll reports readable (``_doReadOrWrite``, with its
    error handling, or ``net.dispatch``'s plain read, ``read_accepted``, which has
    the same outcome): a client sends its first packet as soon as its handshake is
    done, so it is usually there already, and the answer goes out without another
    epoll round and event dispatch per connection (a connect storm's CPU, and a
    turn of latency for every client).  What is not there yet is read when epoll
    says so, as usual.  Reactors that are not poll-like (no ``_POLL_IN``: select,
    asyncio) get Twisted's loop.

    The accept loop is Twisted's (``Port.doRead``) for the common case only, without
    its per-turn generator and log buffer; any error but "no more connections" goes
    to Twisted's own loop, which handles it (EMFILE with its reserved descriptor,
    EPERM, ECONNABORTED, ...).  A factory whose ``wants_address`` is false gets
    None for ``buildProtocol``'s address instead of an ``IPv4Address`` it would not
    read (the transport still has the peer's address).
    """

    def doRead(self) -> None:
        try:
            self._accept_and_read()
        except BaseException:
            log.deferr()   # (as ``Port.doRead``)

    def _accept_and_read(self) -> None:
        reactor: Any = self.reactor
        # (the poll-like reactors' own: epoll, poll; ``_reads`` holds descriptors)
        read = getattr(reactor, "_doReadOrWrite", None)
        readable = getattr(reactor, "_POLL_IN", None)
        reads = getattr(reactor, "_reads", None)
        if read is None or readable is None or reads is None:
            Port.doRead(self)
            return
        # (``net.dispatch``'s plain read, when the reactor has it: ``read`` less
        # ``_doReadOrWrite``'s checks, ``doRead`` and ``_dataReceived``)
        read_accepted = getattr(reactor, "_lean_read_accepted", None)
        # (the loop itself: ``net.accepting``, compiled in the compiled build)
        lean = getattr(self.transport, "__init__", None) is LeanServer.__init__
        if accept_loop(self, reactor, read, readable, reads, read_accepted, lean):
            Port.doRead(self)   # (an accept failed: Twisted's loop handles it)

    def connectionLost(self, reason: Any) -> None:
        """Twisted's, then the port's own transport class leaves the tuples and the
        watched sets (``_forget``): a stopped port is not checked against again."""
        try:
            Port.connectionLost(self, reason)
        finally:
            _forget(self.transport)


def lean_port(port: Any) -> None:
    """Make a plain TCP listening port a ``LeanPort`` that builds ``LeanServer``
    transports, with TCP_NODELAY set once on the listening socket where accepted
    sockets inherit it (Linux): one ``setsockopt`` a connection less."""
    if type(port) is not Port or port.transport is not Server:
        return
    port.__class__ = LeanPort
    base: type[LeanServer] = LeanServer
    if sys.platform.startswith("linux"):
        try:
            port.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        else:
            base = LeanServerNoDelay
    port.transport = _for_port(base, port)


#: The sets (``net.dispatch``'s fast read classes, one a reactor) that take a port's
#: class when its base class is in them (``watch_port_classes``), by weak
#: reference (a ``set`` takes one): a set whose reactor is gone drops out.
_WATCHERS: list[weakref.ref[set[type]]] = []


def _watchers() -> list[set[type]]:
    """The watched sets still alive; the dead references are dropped."""
    alive = [classes for ref in _WATCHERS if (classes := ref()) is not None]
    if len(alive) != len(_WATCHERS):
        _WATCHERS[:] = [weakref.ref(classes) for classes in alive]
    return alive


def watch_port_classes(classes: set[type]) -> None:
    """Keep ``classes`` holding the class of each listening lean port whose base
    class (``LeanServer``, ``LeanServerNoDelay``) it holds, for as long as
    ``classes`` lives (it is held by weak reference)."""
    _watchers()
    _WATCHERS.append(weakref.ref(classes))
    classes.update(c for c in KINDS.plain[:-3] if c.__base__ in classes)


class _PortOf:
    """``server`` of a port's own transport class: the port, by weak reference
    (None once it is gone).  Not a data descriptor: a transport given another
    port keeps it in its own dict (``LeanServer.__init__``)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self._ref = ref

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self._ref()


def _for_port(base: type[LeanServer], port: Any) -> type[LeanServer]:
    """A transport class for ``port``: ``base`` with ``server`` the port (weakly),
    first in the tuples and in the watched sets that hold ``base``."""
    ref = weakref.ref(port)
    cls: type[LeanServer] = type(base.__name__, (base,), {
        "__slots__": (), "server": _PortOf(ref), "_own_port": ref, "__module__": __name__,
        "__doc__": f"A ``{base.__name__}`` of one listening port (``lean_port``)."})
    KINDS.plain = (cls, *KINDS.plain)
    KINDS.lean = (cls, *KINDS.lean)
    for classes in _watchers():
        if base in classes:
            classes.add(cls)
    return cls


def _forget(cls: Any) -> None:
    """Take a stopped port's own class out of the tuples and the watched sets (the
    base classes and Twisted's ``Server`` stay)."""
    if cls in (Server, LeanServer, LeanServerNoDelay):
        return
    KINDS.plain = tuple(c for c in KINDS.plain if c is not cls)
    KINDS.lean = tuple(c for c in KINDS.lean if c is not cls)
    for classes in _watchers():
        classes.discard(cls)


KINDS.plain = (Server, LeanServer, LeanServerNoDelay)
KINDS.lean = (LeanServer, LeanServerNoDelay)


def others_waiting(reactor: Any, own_fd: int) -> bool:
    """Whether a descriptor other than ``own_fd`` has input ready: a client's bytes,
    a connection to accept, a thread waking the reactor up.

    Asked by a connection whose share of a turn is over (``MQTTProtocol``): it goes
    on when nobody else waits, since ending a turn costs its subscribers a send
    each (smaller output batches: fan-out to 100 subscribers paid 15-40% more CPU
    per delivery when every 2-10 ms of a publisher's input ended a turn).  The
    poll-like reactors' poller (epoll, poll) is asked without waiting; it is
    level-triggered, so nothing is taken from the reactor's next poll.  Any other
    reactor, or a poller that fails: True (others are assumed to wait)."""
    poller = getattr(reactor, "_poller", None)
    readable = getattr(reactor, "_POLL_IN", None)
    if poller is None or readable is None:
        return True
    wanted = readable | getattr(reactor, "_POLL_DISCONNECTED", 0)
    try:
        ready = poller.poll(0)
    except (OSError, ValueError):
        return True
    return any(fd != own_fd and events & wanted for fd, events in ready)

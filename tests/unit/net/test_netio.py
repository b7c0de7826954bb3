"""``net.tcp.LeanServer``: Twisted's TCP server transport, minus per-connection strings.

A real listening ``tcp.Port`` on 127.0.0.1 port 0 and real client sockets; the
reactor is a stub that only records the descriptors it is asked to watch
(``doRead`` is called by hand), so nothing here runs an event loop.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import pytest
from twisted.internet import main
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.tcp import Port, Server
from twisted.python.failure import Failure

from mqttamqp.net.accept import ACCEPT_PAUSE, AcceptRefusals, watch_accept_errors
from mqttamqp.net.sending import KINDS, plain_tcp
from mqttamqp.net.tcp import LeanServer, LeanServerNoDelay, lean_port


class _Reactor:
    """What ``Port`` and ``Server`` call on their reactor, recorded."""

    def __init__(self) -> None:
        self.readers: set[Any] = set()

    def addReader(self, reader: Any) -> None:
        self.readers.add(reader)

    def removeReader(self, reader: Any) -> None:
        self.readers.discard(reader)

    def addWriter(self, writer: Any) -> None:
        pass

    def removeWriter(self, writer: Any) -> None:
        pass


class _Kept(Protocol):
    def __init__(self, made: list[Any]) -> None:
        self.made = made

    def connectionMade(self) -> None:
        self.made.append(self)


def _accept(lean: bool) -> tuple[Any, socket.socket, Port, list[Any]]:
    """A port (lean or Twisted's own), one client connected and accepted."""
    reactor = _Reactor()
    made: list[Any] = []
    factory = Factory.forProtocol(lambda: _Kept(made))
    port = Port(0, factory, interface="127.0.0.1", reactor=reactor)
    port.startListening()
    if lean:
        lean_port(port)
    client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5)
    for _ in range(100):                   # bounded: the accept is ready at once
        port.doRead()
        if made:
            break
    assert made, "no connection accepted"
    return made[0].transport, client, port, made


def _stop_port(port: Port) -> None:
    """Stop ``port`` as ``stopListening`` ends (its ``connectionLost``), so a lean
    port's own class leaves ``net.tcp``'s tuples."""
    port.connectionLost(Failure(main.CONNECTION_DONE))


def _close(client: socket.socket, port: Port, *transports: Any) -> None:
    client.close()
    for t in transports:
        t.socket.close()
    _stop_port(port)


def test_lean_transport_keeps_twisteds_state_but_not_its_strings() -> None:
    """LeanServer keeps Twisted's transport state minus its per-connection strings,
    address tuple and empty write list, made on demand as Twisted uses them, with one
    ``peer`` string."""
    lean, c1, p1, _ = _accept(True)
    plain, c2, p2, _ = _accept(False)
    try:
        assert isinstance(lean, LeanServer) and type(plain) is Server
        assert plain_tcp(lean) and plain_tcp(plain)
        # Same state, less the strings, the session number and the defaults an idle
        # transport keeps as they are (class attributes), the address as one string,
        # the reactor in a slot (not in the dict) and the port in its own class's.
        assert set(vars(plain)) - set(vars(lean)) == {
            "logstr", "repstr", "fileno", "client", "hostname", "_tempDataBuffer",
            "sessionno", "connected", "_tempDataLen", "reactor", "server"}
        assert type(lean).server is p1 and plain_tcp(lean)
        assert set(vars(lean)) - set(vars(plain)) == {"peer"}
        assert lean.reactor is p1.reactor and lean.server is p1
        assert lean.connected == plain.connected == 1
        assert lean._tempDataLen == plain._tempDataLen == 0
        assert lean.sessionno == lean.fileno()
        # Twisted's write list is made when written to, and dropped once empty.
        assert lean._pending is None
        lean._tempDataBuffer.append(b"x")
        assert lean._pending == [b"x"]
        lean._tempDataBuffer = []
        assert lean._pending is None
        assert lean.peer == f"127.0.0.1:{c1.getsockname()[1]}"
        assert lean.client == (plain.client[0], c1.getsockname()[1])
        assert lean.hostname == plain.hostname == "127.0.0.1"
        # Made when read, as Twisted would have written them (the port numbers and
        # session numbers of the two ports are their own).
        assert lean.logstr == f"_Kept,{lean.sessionno},127.0.0.1"
        # Asked on every read event: the protocol's prefix alone, made once.
        assert lean.logPrefix() == "_Kept" and lean.logPrefix() is lean.logPrefix()
        assert repr(lean) == f"<_Kept #{lean.sessionno} on {p1.getHost().port}>"
        assert repr(plain) == f"<_Kept #{plain.sessionno} on {p2.getHost().port}>"
        assert lean.fileno() == lean.socket.fileno() > 0
        assert lean.getPeer().host == "127.0.0.1"
        assert lean.getPeer().port == c1.getsockname()[1]
    finally:
        _close(c1, p1, lean)
        _close(c2, p2, plain)


class _QuietReactor:
    """What a transport calls on its reactor while it starts reading."""

    def addReader(self, reader: Any) -> None:
        pass


def test_a_lean_transport_keeps_an_ipv6_peers_whole_address() -> None:
    """An IPv6 peer's address keeps its flow info and scope id (``getPeer``), beside
    the one ``host:port`` string the console shows; a reassigned address moves both."""
    ours, theirs = socket.socketpair()
    try:
        lean = LeanServer(ours, Protocol(), ("fe80::1%lo", 4321, 0, 1), None, 7,
                          _QuietReactor())
        assert lean.peer == "fe80::1%lo:4321"
        assert lean.client == ("fe80::1%lo", 4321, 0, 1) and lean.hostname == "fe80::1%lo"
        peer = lean.getPeer()
        assert (peer.host, peer.port, peer.flowInfo, peer.scopeID) == ("fe80::1%lo", 4321, 0, 1)
        lean.client = ("10.0.0.1", 80)
        assert lean.peer == "10.0.0.1:80" and lean.client == ("10.0.0.1", 80)
    finally:
        ours.close()
        theirs.close()


def test_a_lost_lean_transport_answers_minus_one_for_its_descriptor() -> None:
    """A lost lean transport answers -1 for its descriptor, as Twisted's does."""
    lean, client, port, _ = _accept(True)
    sock = lean.socket
    try:
        del lean.socket, lean.fileno        # as tcp.Connection.connectionLost does
        assert lean.fileno() == -1
    finally:
        client.close()
        sock.close()
        _stop_port(port)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's inheritance")
def test_accepted_sockets_inherit_nodelay_from_the_lean_listener() -> None:
    """Sockets accepted by a lean listener with TCP_NODELAY have it set."""
    lean, client, port, _ = _accept(True)
    try:
        assert type(lean).__base__ is LeanServerNoDelay and lean.nodelay
        assert lean.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        _close(client, port, lean)


def test_a_stopped_lean_port_leaves_the_tables_and_is_not_kept_alive() -> None:
    """Once a lean port stops (``connectionLost``), its own transport class leaves
    ``send``'s tuples and every watched set, and nothing in ``net.tcp`` keeps the port
    or its factory (the broker) alive."""
    import gc
    import weakref

    from mqttamqp.net import tcp as lean_tcp

    plain, lean = len(KINDS.plain), len(KINDS.lean)
    watched: set[type] = {LeanServer, LeanServerNoDelay}
    lean_tcp.watch_port_classes(watched)
    factory = Factory.forProtocol(Protocol)
    factory.noisy = False   # (Twisted's start-up log buffer would keep it)
    gone = weakref.ref(factory)
    port = Port(0, factory, interface="127.0.0.1", reactor=_Reactor())
    port.startListening()
    lean_port(port)
    own = port.transport
    assert own in KINDS.plain and own in KINDS.lean and own in watched
    assert own.server is port
    _stop_port(port)
    assert own not in KINDS.plain and own not in KINDS.lean
    assert own not in watched
    assert (len(KINDS.plain), len(KINDS.lean)) == (plain, lean)
    del factory, port
    gc.collect()
    assert gone() is None
    assert own.server is None   # (held weakly: the class does not keep it)
    assert watched in lean_tcp._watchers()
    del watched
    gc.collect()
    lean_tcp._watchers()
    assert all(ref() is not None for ref in lean_tcp._WATCHERS)   # (the dead one dropped)


def test_lean_port_leaves_other_transports_alone() -> None:
    """lean_port leaves a port whose transport class is not Twisted's own alone."""
    class Custom(Server):
        pass

    reactor = _Reactor()
    port = Port(0, Factory.forProtocol(Protocol), interface="127.0.0.1", reactor=reactor)
    port.transport = Custom
    lean_port(port)
    assert port.transport is Custom


# -- LeanPort: the first packet is read in the turn that accepts the connection ----


class _Recording(Protocol):
    def __init__(self, got: list[bytes], fail: bool = False) -> None:
        self.got, self.fail = got, fail

    def dataReceived(self, data: bytes) -> None:
        self.got.append(data)
        if self.fail:
            raise RuntimeError("a protocol's bug")


def _epoll_port(make: Any, lean: bool = False) -> tuple[Any, Port]:
    """A lean port on a real epoll reactor that is never run: ``doRead`` by hand.
    ``lean``: the reactor has ``net.dispatch``'s lean dispatch (as the broker's),
    whose plain read and reader registration the port's accept loop then uses."""
    epollreactor = pytest.importorskip("twisted.internet.epollreactor")
    reactor = epollreactor.EPollReactor()
    if lean:
        from mqttamqp.net.dispatch import lean_dispatch
        assert lean_dispatch(reactor)
        assert callable(reactor._lean_read_accepted) and callable(reactor._lean_add_reader)
    port = Port(0, Factory.forProtocol(make), interface="127.0.0.1", reactor=reactor)
    port.startListening()
    lean_port(port)
    return reactor, port


def _stop(reactor: Any, port: Port, *clients: socket.socket) -> None:
    for client in clients:
        client.close()
    for selectable in list(reactor._selectables.values()):
        if isinstance(selectable, Server):
            selectable.socket.close()
    _stop_port(port)
    reactor._poller.close()


def _connect(port: Port, first: bytes = b"") -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5)
    if first:
        client.sendall(first)
    return client


def _wait_acceptable(port: Port) -> None:
    """Bounded: until the listening socket has a connection to accept."""
    import select as select_module
    readable, _, _ = select_module.select([port.socket], [], [], 5.0)
    assert readable, "no connection to accept within 5 s"


def _accept_until(port: Port, done: Any) -> None:
    """The port's ``doRead`` by hand until ``done()`` (bounded: what it waits for is
    in the accept queue already)."""
    _wait_acceptable(port)
    for _ in range(100):
        port.doRead()
        if done():
            return


@pytest.mark.parametrize("lean", [False, True], ids=["twisted", "lean_dispatch"])
def test_lean_port_reads_the_first_packet_in_the_turn_it_accepts(lean: bool) -> None:
    """A client speaks first: what it sent with its handshake reaches the protocol
    in the same ``doRead`` that accepted it, without another epoll round; a client
    that sent nothing yet is accepted and watched for reading as usual (registered
    with epoll: a later read event finds it)."""
    got: list[bytes] = []
    reactor, port = _epoll_port(lambda: _Recording(got), lean)
    talker = _connect(port, b"\x10\x0cCONNECT...")
    silent = _connect(port)
    try:
        assert type(port) is not Port and port.transport.__base__ is LeanServerNoDelay
        assert port.transport.server is port
        # (the bytes are on the server's socket once the client's sendall returns
        # on loopback; the accept queue is read below)
        _accept_until(port, lambda: len(reactor._selectables) >= 3)  # (waker + two)
        assert got == [b"\x10\x0cCONNECT..."]
        servers = [s for s in reactor._selectables.values() if isinstance(s, Server)]
        assert len(servers) == 2 and all(s.fileno() in reactor._reads for s in servers)
        silent.sendall(b"later")
        for _ in range(100):
            reactor.doPoll(0.05)
            if len(got) == 2:
                break
        assert got == [b"\x10\x0cCONNECT...", b"later"]
    finally:
        _stop(reactor, port, talker, silent)


@pytest.mark.parametrize("lean", [False, True], ids=["twisted", "lean_dispatch"])
def test_lean_port_a_failing_first_read_closes_that_connection_only(lean: bool) -> None:
    """The eager read is the reactor's own (``_doReadOrWrite``, or the lean
    dispatch's plain read with its outcome): a protocol that raises on its first
    packet loses its connection, logged, and the next client is still accepted and
    read."""
    got: list[bytes] = []
    made = iter([True, False])
    reactor, port = _epoll_port(lambda: _Recording(got, fail=next(made)), lean)
    first = _connect(port, b"boom")
    try:
        _accept_until(port, lambda: got)
        first.settimeout(5)
        assert first.recv(10) == b""          # closed by the broker's side
        second = _connect(port, b"fine")
        _accept_until(port, lambda: len(got) == 2)
        assert got == [b"boom", b"fine"]
        second.close()
    finally:
        _stop(reactor, port, first)


def test_lean_port_leaves_accept_errors_to_twisteds_loop() -> None:
    """Any accept error but "no more connections" goes to ``Port.doRead``, which
    knows them all (here ECONNABORTED: logged, and the port goes on)."""
    import errno

    reactor, port = _epoll_port(Protocol)
    real = port.socket
    calls: list[str] = []

    class Listener:
        family, type, proto = real.family, real.type, real.proto

        def _accept(self) -> Any:
            calls.append("_accept")
            raise OSError(errno.ECONNABORTED, "aborted")

        def accept(self) -> Any:
            calls.append("accept")
            raise OSError(errno.ECONNABORTED, "aborted")

        def fileno(self) -> int:
            return real.fileno()

    port.socket = Listener()  # type: ignore[assignment]
    try:
        port.doRead()
        assert calls == ["_accept", "accept"] and port.connected
    finally:
        port.socket = real
        _stop(reactor, port)


def test_lean_port_builds_no_address_for_a_factory_that_wants_none() -> None:
    """``buildProtocol``'s address is built unless the factory says it does not
    read it (``wants_address = False``, the MQTT factory): then it gets None."""
    from twisted.internet.address import IPv4Address

    class Seeing(Factory):
        def __init__(self, wants: bool) -> None:
            self.wants_address = wants
            self.seen: list[Any] = []

        def buildProtocol(self, addr: Any) -> Protocol:
            self.seen.append(addr)
            return Protocol()

    for wants in (True, False):
        factory = Seeing(wants)
        seen = factory.seen

        epollreactor = pytest.importorskip("twisted.internet.epollreactor")
        reactor = epollreactor.EPollReactor()
        port = Port(0, factory, interface="127.0.0.1", reactor=reactor)
        port.startListening()
        lean_port(port)
        client = _connect(port, b"x")
        try:
            _accept_until(port, lambda: factory.seen)  # noqa: B023 (called at once)
            assert len(seen) == 1
            assert isinstance(seen[0], IPv4Address) if wants else seen[0] is None
        finally:
            _stop(reactor, port, client)


def test_lean_port_on_the_select_reactor_is_twisteds_port() -> None:
    """The select reactor has a ``_doReadOrWrite`` of another shape and keeps
    selectables, not descriptors: its connections are accepted by Twisted's loop
    and read when select says so (a review finding: the eager read would have
    called it wrongly had its test ever been true)."""
    from twisted.internet.selectreactor import SelectReactor

    got: list[bytes] = []
    reactor = SelectReactor()
    port = Port(0, Factory.forProtocol(lambda: _Recording(got)), interface="127.0.0.1",
                reactor=reactor)
    port.startListening()
    lean_port(port)
    client = _connect(port, b"hello")
    try:
        _accept_until(port, lambda: any(isinstance(s, Server) for s in reactor._reads))
        [server] = [s for s in reactor._reads if isinstance(s, Server)]
        assert got == []                        # not read in the accepting turn
        server.doRead()
        assert got == [b"hello"]
    finally:
        client.close()
        for selectable in list(reactor._reads):
            if isinstance(selectable, Server):
                selectable.socket.close()
        _stop_port(port)
        reactor.waker.connectionLost(None)


# -- accepts that fail for want of descriptors or memory -----------------------------


class _ClockReactor(_Reactor):
    """The stub reactor, with time (``task.Clock``) for the listener's pause."""

    def __init__(self) -> None:
        super().__init__()
        from twisted.internet.task import Clock

        self.clock = Clock()
        self.callLater = self.clock.callLater
        self.seconds = self.clock.seconds


class _FailingListener:
    """A listening socket whose ``accept`` fails with ``errors`` in turn (an ``int``
    errno), or hands over a connection (a ``_Closable``), then has nothing left."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.family, self.type, self.proto = socket.AF_INET, socket.SOCK_STREAM, 0

    def accept(self) -> tuple[Any, tuple[str, int]]:
        import errno

        outcome = self.outcomes.pop(0) if self.outcomes else errno.EAGAIN
        if isinstance(outcome, int):
            raise OSError(outcome, os.strerror(outcome))
        return outcome, ("127.0.0.1", 40000)

    _accept = accept   # (what LeanPort's loop calls; the fallback calls ``accept``)

    def fileno(self) -> int:
        return 99

    def setsockopt(self, *args: Any) -> None:
        raise OSError("not a socket")


class _Closable:
    closed = False

    def close(self) -> None:
        self.closed = True


def _failing_port(lean: bool, listener: _FailingListener) -> tuple[Port, _ClockReactor]:
    reactor = _ClockReactor()
    port = Port(0, Factory.forProtocol(Protocol), interface="127.0.0.1", reactor=reactor)
    port.socket = listener
    if lean:
        lean_port(port)   # (its setsockopt fails on the fake: transports stay plain)
    port.connected = True
    port.numberAccepts = 100   # (set by startListening)
    port.startReading()
    return port, reactor


@pytest.mark.parametrize("lean", [False, True])
def test_an_accept_without_resources_is_counted_and_pauses_the_listener(
        lean: bool, log_lines: list[str]) -> None:
    """ENFILE (and ENOBUFS, ENOMEM) leave the connection waiting: it is counted, the
    listener stops reading for a second instead of spinning, and Twisted's line
    per attempt is not logged."""
    import errno

    port, reactor = _failing_port(lean, _FailingListener(errno.ENFILE))
    refused: list[str] = []
    watch_accept_errors(port, refused.append)
    port.doRead()
    assert refused == ["ENFILE"]
    assert port not in reactor.readers
    assert not [line for line in log_lines if "accept" in line.lower()], log_lines
    reactor.clock.advance(ACCEPT_PAUSE)
    assert port in reactor.readers


def test_an_emfile_refusal_closes_the_connection_and_logs_nothing(
        log_lines: list[str]) -> None:
    """EMFILE: Twisted's reserved descriptor lets the waiting connection be accepted
    and closed (the client learns at once); it is counted, without Twisted's three
    lines a connection."""
    import errno

    from twisted.internet import tcp

    tcp._reservedFD.reserve()
    waiting = _Closable()
    port, reactor = _failing_port(False, _FailingListener(errno.EMFILE, waiting))
    refused: list[str] = []
    watch_accept_errors(port, refused.append)
    port.doRead()
    assert refused == ["EMFILE"] and waiting.closed
    assert port in reactor.readers
    assert not [line for line in log_lines if "EMFILE" in line], log_lines


def test_refusals_are_one_line_a_spell_and_counted_each() -> None:
    """Many refusals are one error line (why, and what to do) and one line when
    none came for ``quiet`` seconds; each is counted; a new spell logs again."""
    from twisted.internet.task import Clock
    from twisted.logger import formatEvent, globalLogPublisher

    clock = Clock()
    counted: list[int] = []
    refusals = AcceptRefusals(clock, lambda: counted.append(1), quiet=10.0)
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        for _ in range(50):
            refusals.refused("MQTT", "EMFILE")
            clock.advance(0.1)
        assert len(lines) == 1 and "out of file descriptors (limit " in lines[0]
        assert "ulimit -n" in lines[0] and "MQTT" in lines[0]
        assert len(counted) == 50 and refusals.failing
        clock.advance(9.8)
        assert len(lines) == 1          # not quiet for 10 s yet
        clock.advance(0.2)
        assert len(lines) == 2 and "50 connection(s) refused" in lines[1]
        assert not refusals.failing and not clock.getDelayedCalls()
        refusals.refused("AMQP", "ENFILE")
        assert len(lines) == 3 and "system is out of file descriptors" in lines[2]
        refusals.stop()
        assert not clock.getDelayedCalls()
    finally:
        globalLogPublisher.removeObserver(observe)




class _WriterStub:
    """What a ``tcp.Server`` calls on its reactor when it starts and buffers."""

    def __init__(self) -> None:
        self.writers: list[Any] = []

    def addReader(self, reader: Any) -> None:
        pass

    def removeReader(self, reader: Any) -> None:
        pass

    def addWriter(self, writer: Any) -> None:
        self.writers.append(writer)

    def removeWriter(self, writer: Any) -> None:
        pass

    def callLater(self, delay: float, f: Any, *args: Any, **kw: Any) -> None:
        """(``abortConnection`` schedules its ``connectionLost``: not run here.)"""


def test_send_writes_to_the_socket_at_once_and_buffers_what_it_does_not_take() -> None:
    """``net.sending.send``: with nothing buffered the bytes go to the socket in the call;
    what a full socket does not take stays in the transport's buffer, in order (that a
    later write queues behind it is the next test's)."""
    from mqttamqp.net.sending import send

    socketmod = socket
    ours, theirs = socketmod.socketpair()
    ours.setblocking(False)
    stub = _WriterStub()
    try:
        server = Server(ours, Protocol(), ("127.0.0.1", 1), None, 0, stub)
        send(server, b"hello")
        assert theirs.recv(16) == b"hello" and not stub.writers
        ours.setsockopt(socketmod.SOL_SOCKET, socketmod.SO_SNDBUF, 4096)
        big = bytes(range(256)) * 4096      # 1 MiB: more than the socket takes
        send(server, big[:65536])
        send(server, big[65536:131072])
        held = server._tempDataLen + len(server.dataBuffer) - server.offset
        # the rest waits for doWrite, the second write behind the first's rest
        assert held > 0 and stub.writers and all(w is server for w in stub.writers)
        got = bytearray()
        theirs.setblocking(False)
        for _ in range(1000):                 # (bounded: drain what was sent at once)
            try:
                chunk = theirs.recv(1 << 16)
            except BlockingIOError:
                break
            got += chunk
        assert len(got) == 131072 - held and bytes(got) == big[:len(got)]
    finally:
        ours.close()
        theirs.close()


def _drain(peer: socket.socket, into: bytearray) -> None:
    """Read what ``peer`` has now into ``into`` (bounded; ``peer`` is non-blocking)."""
    for _ in range(1000):
        try:
            chunk = peer.recv(1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            return
        into += chunk


def test_a_later_send_queues_behind_buffered_bytes_even_when_the_socket_has_room() -> None:
    """After a partial send and the peer drained, a second send never overtakes the
    first's buffered rest."""
    from mqttamqp.net.sending import send

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        server = Server(ours, Protocol(), ("127.0.0.1", 1), None, 0, _WriterStub())
        first = b"A" * 65536
        send(server, first)
        got = bytearray()
        _drain(theirs, got)
        assert 0 < len(got) < len(first)        # partial: the rest is in the transport
        send(server, b"B" * 10)                  # the socket has room again
        _drain(theirs, got)
        assert b"B" not in got, "the second write overtook the first's buffered rest"
        for _ in range(1000):                    # (bounded: until all of it arrived)
            server.doWrite()                     # (what the reactor does when writable)
            _drain(theirs, got)
            if len(got) >= len(first) + 10:
                break
        assert bytes(got) == first + b"B" * 10
    finally:
        ours.close()
        theirs.close()


def test_send_after_abort_connection_writes_nothing() -> None:
    """After ``abortConnection`` (its ``connectionLost`` not yet run) ``send`` gives
    the socket nothing, as Twisted's ``write`` gives it nothing."""
    from mqttamqp.net.sending import send

    for write in (lambda s: s.write(b"after-abort"), lambda s: send(s, b"after-abort")):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        try:
            server = Server(ours, Protocol(), ("127.0.0.1", 1), None, 0, _WriterStub())
            server.abortConnection()
            assert server.connected and not server.disconnecting   # (the window)
            write(server)
            server.doWrite()                 # (a no-op once aborting, as in Twisted)
            with pytest.raises(BlockingIOError):
                theirs.recv(100)
        finally:
            ours.close()
            theirs.close()


def test_push_producer_registered_on_a_lean_transport_is_paused_by_twisted() -> None:
    """``register_push_producer`` on a LeanServer sets the producer without a dict
    entry for ``streamingProducer``, and Twisted pauses it when its buffer is full."""
    from mqttamqp.net.sending import register_push_producer

    class _Producer:
        paused = 0

        def pauseProducing(self) -> None:
            self.paused += 1

        def resumeProducing(self) -> None:
            pass

        def stopProducing(self) -> None:
            pass

    lean, c1, p1, _ = _accept(True)
    try:
        producer = _Producer()
        register_push_producer(lean, producer)
        assert lean.producer is producer and "streamingProducer" not in vars(lean)
        assert lean.streamingProducer
        lean.write(b"x" * (lean.bufferSize + 1))   # (buffered: written on the next turn)
        assert producer.paused == 1
        lean.unregisterProducer()
        assert lean.producer is None
    finally:
        _close(c1, p1, lean)

"""``net.dispatch``: an epoll reactor's events handled without Twisted's logging
context, with the same outcome: each ready descriptor read, a failure logged and the
turn's other events still handled, any other reactor left alone.

Reactors are built and closed here, never run; the descriptors are a socket pair.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loglines import LogLines
from twisted.internet import tcp
from twisted.internet.epollreactor import EPOLLIN, EPOLLOUT, EPollReactor
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from zope.interface import implementer

from mqttamqp.net import dispatch
from mqttamqp.net.dispatch import lean_dispatch
from mqttamqp.net.tcp import LeanServer, LeanServerNoDelay


class _Reader:
    """A descriptor that records its reads (what ``_doReadOrWrite`` calls)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        self.sock.recv(64)
        self.reads += 1

    def logPrefix(self) -> str:
        return "_Reader"

    def connectionLost(self, reason: Any) -> None:
        pass


def _close(r: EPollReactor) -> None:
    """A reactor that was never run, closed: its selectables, waker and epoll."""
    r.removeAll()
    r.waker.connectionLost(None)
    r._poller.close()


@pytest.fixture
def reactor() -> Iterator[EPollReactor]:
    r = EPollReactor()
    try:
        yield r
    finally:
        _close(r)


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b



def _count_generic(reactor: Any) -> list[int]:
    """The events ``reactor`` hands to its generic ``_doReadOrWrite`` from now on
    (wrapped on the instance; the events, appended to the list returned)."""
    events: list[int] = []
    real = reactor._doReadOrWrite

    def counted(selectable: Any, fd: int, event: int) -> None:
        events.append(event)
        real(selectable, fd, event)

    reactor._doReadOrWrite = counted
    return events

def test_a_ready_descriptor_is_read_by_the_lean_dispatch(reactor: EPollReactor) -> None:
    """After ``lean_dispatch`` one iteration reads each descriptor that has input."""
    assert lean_dispatch(reactor)
    # (a function of the pure build; the compiled build's closure is an object of a
    # class named after it)
    name = getattr(reactor.doPoll, "__name__", type(reactor.doPoll).__name__)
    assert reactor.doIteration == reactor.doPoll and "do_poll" in name
    pairs = [_pair(), _pair()]
    readers = [_Reader(a) for a, _ in pairs]
    try:
        for r in readers:
            reactor.addReader(r)
        for _, b in pairs:
            b.send(b"x")
        reactor.doIteration(1.0)
        assert [r.reads for r in readers] == [1, 1]
        reactor.doIteration(0)   # nothing new: nothing read
        assert [r.reads for r in readers] == [1, 1]
    finally:
        for r in readers:
            reactor.removeReader(r)
        for a, b in pairs:
            a.close()
            b.close()


def test_a_failing_event_is_logged_and_the_others_still_handled(
        reactor: EPollReactor, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception out of ``_doReadOrWrite`` is logged once; the turn goes on."""
    failures: list[str] = []

    class _Log:
        def failure(self, text: str, **kw: Any) -> None:
            failures.append(text)

    monkeypatch.setattr(dispatch, "log", _Log())
    pairs = [_pair(), _pair()]
    readers = [_Reader(a) for a, _ in pairs]
    real = reactor._doReadOrWrite

    def flaky(selectable: Any, fd: int, event: int) -> None:
        if selectable is readers[0]:
            raise RuntimeError("boom")
        real(selectable, fd, event)

    reactor._doReadOrWrite = flaky  # type: ignore[method-assign]
    assert lean_dispatch(reactor)
    try:
        for r in readers:
            reactor.addReader(r)
        for _, b in pairs:
            b.send(b"x")
        reactor.doIteration(1.0)
        assert failures == ["handling an event of {selectable!r} failed"]
        assert readers[1].reads == 1
    finally:
        for r in readers:
            reactor.removeReader(r)
        for a, b in pairs:
            a.close()
            b.close()


def test_other_reactors_are_left_as_they_were() -> None:
    """A clock, or an epoll reactor whose ``doPoll`` is its own, is not changed."""
    clock = Clock()
    assert not lean_dispatch(clock)
    assert not hasattr(clock, "doPoll")

    class Own(EPollReactor):
        def doPoll(self, timeout: float | None) -> None:
            pass

    own = Own()
    try:
        assert not lean_dispatch(own)
        assert own.doPoll.__func__ is Own.doPoll  # type: ignore[attr-defined]
    finally:
        own.removeAll()
        own.waker.connectionLost(None)
        own._poller.close()


def test_applying_it_twice_keeps_the_first(reactor: EPollReactor) -> None:
    """A second call (an --ha takeover starts serving again) changes nothing."""
    assert lean_dispatch(reactor)
    first = reactor.doPoll
    assert lean_dispatch(reactor)
    assert reactor.doPoll is first


def test_an_epoll_reactor_whose_do_poll_body_is_unknown_keeps_it_with_one_line(
        reactor: EPollReactor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Twisted whose ``EPollReactor.doPoll`` calls something the replacement does
    not (its fingerprint differs) keeps its own dispatch, said in one log line."""
    def changed(self: Any, timeout: float | None) -> None:
        self._newHook()                     # (a name Twisted 26.10's body has not)
        EPollReactor.doPoll(self, timeout)

    original = EPollReactor.doPoll
    monkeypatch.setattr(EPollReactor, "doPoll", changed)
    monkeypatch.setattr(EPollReactor, "doIteration", changed)
    assert original is not changed
    with LogLines("EPollReactor.doPoll is not") as lines:
        assert not lean_dispatch(reactor)
    assert len(lines) == 1 and "keeps its own" in lines[0]
    assert reactor.doPoll.__func__ is changed  # type: ignore[attr-defined]
    assert "doPoll" not in vars(reactor) and not getattr(reactor, "_lean_dispatch", False)


# -- the plain-read shortcut: the same outcome as Twisted's own dispatch -------------

@implementer(IHalfCloseableProtocol)
class _HalfCloser(Protocol):
    """A protocol that takes a half-close (``readConnectionLost``)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def dataReceived(self, data: bytes) -> None:
        self.events.append(data)

    def readConnectionLost(self) -> None:
        self.events.append("read-lost")

    def writeConnectionLost(self) -> None:
        self.events.append("write-lost")

    def connectionLost(self, reason: Any = None) -> None:
        self.events.append(type(reason.value).__name__)


class _Recorder(Protocol):
    """A protocol that records what it is given; ``fail`` makes a read raise."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[Any] = []
        self.fail = fail

    def dataReceived(self, data: bytes) -> None:
        self.events.append(data)
        if self.fail:
            raise ValueError("bad bytes")

    def connectionLost(self, reason: Any = None) -> None:
        self.events.append(type(reason.value).__name__)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair over loopback (the server's end non-blocking)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        peer = socket.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
    server.setblocking(False)
    return server, peer


def _transport(kind: type, reactor: EPollReactor, protocol: Protocol,
               pair: Callable[[], tuple[socket.socket, socket.socket]] = _pair
               ) -> tuple[Any, socket.socket]:
    """A server transport of ``kind`` over a socket pair (``pair``), registered with
    ``reactor``; the peer's end with it."""
    a, b = pair()
    transport = kind(a, protocol, ("127.0.0.1", 4000), None, 0, reactor)
    protocol.makeConnection(transport)
    return transport, b


def _outcome(lean: bool, kind: type, protocol: Protocol,
             act: Callable[[socket.socket], None],
             pair: Callable[[], tuple[socket.socket, socket.socket]] = _pair
             ) -> tuple[list[Any], list[str], int]:
    """What ``protocol`` saw, the errors logged, and how many events went through
    ``_doReadOrWrite``, after ``act`` on the peer and two iterations of an epoll
    reactor with the lean dispatch (``lean``) or Twisted's own."""
    reactor = EPollReactor()
    generic = _count_generic(reactor)
    errors: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        failure = event.get("log_failure", event.get("failure"))
        if failure is not None:
            errors.append(type(failure.value).__name__)

    globalLogPublisher.addObserver(observe)
    try:
        if lean:
            assert lean_dispatch(reactor)
        _, peer = _transport(kind, reactor, protocol, pair)
        act(peer)
        reactor.doIteration(1.0)
        reactor.doIteration(0)
        peer.close()
    finally:
        globalLogPublisher.removeObserver(observe)
        reactor.removeAll()
        reactor.waker.connectionLost(None)
        reactor._poller.close()
    return protocol.events, errors, len(generic)  # type: ignore[attr-defined]


_KINDS = [tcp.Server, LeanServer, LeanServerNoDelay]


@pytest.mark.parametrize("kind", _KINDS)
def test_a_plain_read_goes_straight_to_the_protocol(kind: type) -> None:
    """Bytes on a TCP server transport reach ``dataReceived`` as with Twisted's
    dispatch, without ``_doReadOrWrite``."""
    def send(peer: socket.socket) -> None:
        peer.send(b"abc")

    assert _outcome(False, kind, _Recorder(), send) == ([b"abc"], [], 1)
    assert _outcome(True, kind, _Recorder(), send) == ([b"abc"], [], 0)


class _ListeningPort:
    """What a lean port's class reads of its port: its number, for ``repr``."""

    _realPortNumber = 1883


@pytest.fixture(autouse=True)
def _tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """``net.sending``'s tuples and ``net.tcp``'s watched sets as they were before each
    test."""
    from mqttamqp.net import tcp as lean_tcp
    from mqttamqp.net.sending import KINDS

    monkeypatch.setattr(KINDS, "plain", KINDS.plain)
    monkeypatch.setattr(KINDS, "lean", KINDS.lean)
    monkeypatch.setattr(lean_tcp, "_WATCHERS", list(lean_tcp._WATCHERS))


def test_a_lean_ports_own_class_takes_the_shortcut_until_its_port_stops() -> None:
    """A transport of a lean port's own class (``server`` a class attribute: ``lean_port``)
    takes the plain-read shortcut and ``send``'s, whether its class was made before the
    dispatch was installed or after; once its port stops (``_forget``, from its
    ``connectionLost``) it leaves the tuples and every watched set."""
    from mqttamqp.net import tcp as lean_tcp
    from mqttamqp.net.sending import KINDS, plain_tcp

    def send(peer: socket.socket) -> None:
        peer.send(b"abc")

    old_port = _ListeningPort()
    before = lean_tcp._for_port(LeanServerNoDelay, old_port)
    assert _outcome(True, before, _Recorder(), send) == ([b"abc"], [], 0)
    reactor = EPollReactor()
    generic = _count_generic(reactor)
    try:
        assert lean_dispatch(reactor)
        watched = lean_tcp._watchers()
        assert watched and all(before in classes for classes in watched
                               if LeanServerNoDelay in classes)
        after = lean_tcp._for_port(LeanServer, _ListeningPort())
        protocol = _Recorder()
        transport, peer = _transport(after, reactor, protocol)
        assert plain_tcp(transport)   # (and ``send``: the same tuple)
        peer.send(b"abc")
        reactor.doIteration(1.0)
        assert protocol.events == [b"abc"] and generic == []
        lean_tcp._forget(before)     # (its port stopped listening)
        assert before not in KINDS.plain and before not in KINDS.lean
        assert all(before not in classes for classes in lean_tcp._watchers())
        assert after in KINDS.plain and after in KINDS.lean
        peer.close()
    finally:
        reactor.removeAll()
        reactor.waker.connectionLost(None)
        reactor._poller.close()


@pytest.mark.parametrize("kind", _KINDS)
def test_a_half_close_is_a_half_close_as_with_twisted(kind: type) -> None:
    """The peer's shutdown of its writing side: ``readConnectionLost`` for a protocol
    that takes it, ``ConnectionDone`` for one that does not, as Twisted does."""
    def half_close(peer: socket.socket) -> None:
        peer.send(b"last")
        peer.shutdown(socket.SHUT_WR)

    for make in (_HalfCloser, _Recorder):
        twisted_way = _outcome(False, kind, make(), half_close)
        assert twisted_way[0] in ([b"last", "read-lost"], [b"last", "ConnectionDone"])
        assert _outcome(True, kind, make(), half_close)[:2] == twisted_way[:2]


@pytest.mark.parametrize("kind", _KINDS)
def test_an_exception_in_a_read_is_logged_and_loses_the_connection(kind: type) -> None:
    """A protocol that raises in ``dataReceived``: one logged error and the connection
    lost with that exception, as with Twisted's dispatch."""
    def send(peer: socket.socket) -> None:
        peer.send(b"abc")

    expected = ([b"abc", "ValueError"], ["ValueError"])
    assert _outcome(False, kind, _Recorder(fail=True), send)[:2] == expected
    assert _outcome(True, kind, _Recorder(fail=True), send) == (*expected, 0)


def _send_and_close(peer: socket.socket) -> None:
    peer.send(b"abc")
    peer.close()


def test_a_hang_up_takes_twisteds_way() -> None:
    """A hang-up (an AF_UNIX socket pair's peer closed: EPOLLHUP with the last bytes)
    is not a plain read: every event goes through ``_doReadOrWrite``, as without the
    lean dispatch, with the same outcome."""
    twisted_way = _outcome(False, LeanServer, _Recorder(), _send_and_close)
    lean_way = _outcome(True, LeanServer, _Recorder(), _send_and_close)
    assert lean_way == twisted_way and lean_way[0] == [b"abc", "ConnectionDone"]
    assert lean_way[2] >= 1


@pytest.mark.parametrize("kind", _KINDS)
def test_a_tcp_peers_close_is_a_plain_read_with_twisteds_outcome(kind: type) -> None:
    """A TCP peer's close is a FIN (readable, then a read of no bytes), not a hang-up:
    it takes the shortcut, with Twisted's outcome (``ConnectionDone``)."""
    twisted_way = _outcome(False, kind, _Recorder(), _send_and_close, _tcp_pair)
    lean_way = _outcome(True, kind, _Recorder(), _send_and_close, _tcp_pair)
    assert twisted_way[:2] == ([b"abc", "ConnectionDone"], []) and twisted_way[2] >= 1
    assert lean_way == (*twisted_way[:2], 0)


def test_other_descriptors_take_twisteds_way(reactor: EPollReactor) -> None:
    """A descriptor of another class (here a plain reader) goes through
    ``_doReadOrWrite``."""
    calls = _count_generic(reactor)
    assert lean_dispatch(reactor)
    a, b = _pair()
    reader = _Reader(a)
    try:
        reactor.addReader(reader)
        b.send(b"x")
        reactor.doIteration(1.0)
        assert reader.reads == 1 and len(calls) == 1
    finally:
        reactor.removeReader(reader)
        a.close()
        b.close()


def test_an_unknown_read_path_turns_the_shortcut_off(
        reactor: EPollReactor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Twisted whose ``Connection.doRead`` is not the body the shortcut replaces:
    every event goes through ``_doReadOrWrite``, said in one log line."""
    def changed(self: Any) -> Any:
        self._newHook()                       # (a name Twisted 26.10's body has not)

    monkeypatch.setattr(tcp.Connection, "doRead", changed)
    assert dispatch._fast_read_classes(EPollReactor) == frozenset()
    with LogLines("plain-read shortcut") as lines:
        assert lean_dispatch(reactor)
    assert len(lines) == 1 and "Twisted's way" in lines[0]


# -- the lean turn: timers only when something is for them ----------------------------
# (These few run a private epoll reactor for a handful of turns: each ends with a stop
# scheduled at once, and a stop 10 s later bounds it if something goes wrong.)

def _run(reactor: EPollReactor) -> bool:
    """Run ``reactor`` until it stops; True if the test's own stop ended it, not the
    10 s guard.  The guard is a thread's ``callFromThread(stop)``, not a delayed call:
    a loop whose due calls never run would never run the guard's either, and hang."""
    finished = threading.Event()
    guarded: list[bool] = []

    def guard() -> None:
        if not finished.wait(10):
            guarded.append(True)
            reactor.callFromThread(reactor.stop)

    watch = threading.Thread(target=guard, daemon=True)
    watch.start()
    try:
        reactor.run(installSignalHandlers=False)
    finally:
        finished.set()
        watch.join(10)
        reactor.removeAll()
        reactor.waker.connectionLost(None)
        reactor._poller.close()
    return not guarded


def test_the_lean_turn_runs_due_calls_thread_calls_and_the_shutdown() -> None:
    """Under the lean turn, a call made in a turn, a call from another thread and
    the shutdown triggers all run, in order, and ``run`` returns."""
    reactor = EPollReactor()
    assert lean_dispatch(reactor)
    assert "mainLoop" in vars(reactor)
    seen: list[str] = []

    def from_thread() -> None:
        seen.append("thread")
        reactor.callLater(0, reactor.stop)

    def first() -> None:
        seen.append("first")
        reactor.callLater(0, second)

    def second() -> None:
        seen.append("second")
        threading.Thread(target=reactor.callFromThread, args=(from_thread,)).start()

    reactor.addSystemEventTrigger("before", "shutdown", seen.append, "shutdown")
    reactor.callWhenRunning(first)
    assert _run(reactor)
    assert seen == ["first", "second", "thread", "shutdown"]


def test_the_lean_turn_polls_until_the_first_pending_call() -> None:
    """With no call due and none new, a turn runs no timers and polls until the first
    pending call, as Twisted's ``timeout`` says (about 5 s here); once a call is
    due, the timers run and the poll does not wait."""
    reactor = EPollReactor()
    assert lean_dispatch(reactor)
    turns: list[tuple[float | None, int]] = []
    timer_runs: list[int] = []
    run_timers, poll = reactor.runUntilCurrent, reactor.doIteration

    def counted() -> None:
        timer_runs.append(1)
        run_timers()

    def recorded(timeout: float | None) -> None:
        turns.append((timeout, len(timer_runs), reactor.running))
        if len(turns) == 2:
            # (the pending call made due now: moved in the heap, nothing new; its
            # run schedules the stop, so the poll after it must not wait)
            far.reset(0)
        poll(0)

    def due() -> None:
        reactor.callLater(0, reactor.stop)

    reactor.runUntilCurrent = counted  # type: ignore[method-assign]
    reactor.doIteration = recorded  # type: ignore[method-assign]
    far = reactor.callLater(5, due)
    assert _run(reactor)
    (_, runs1, _), (wait2, runs2, _), (wait3, runs3, running3) = turns[:3]
    assert wait2 is not None and 4 < wait2 <= 5 and runs2 == runs1   # (no timers run)
    assert running3 and wait3 == 0 and runs3 == runs2 + 1


def test_a_call_made_in_one_turn_runs_in_a_later_idle_turn() -> None:
    """A ``callLater(0.05)`` made in one turn, with nothing else happening, runs when
    it comes due in a later turn (the poll waits for it, then the timers run)."""
    reactor = EPollReactor()
    assert lean_dispatch(reactor)
    seen: list[str] = []

    def due() -> None:
        seen.append("due")
        reactor.stop()

    reactor.callWhenRunning(lambda: reactor.callLater(0.05, due))
    assert _run(reactor)
    assert seen == ["due"]


def test_a_call_reset_sooner_or_delayed_runs_at_its_new_time() -> None:
    """A pending call ``reset`` to an earlier time runs then (not at its first time),
    and one ``delay``ed runs after a call due in between, under the lean turn."""
    reactor = EPollReactor()
    assert lean_dispatch(reactor)
    seen: list[str] = []
    calls: dict[str, Any] = {}

    def first() -> None:   # (a turn: the calls below are pending from the next one)
        calls["sooner"] = reactor.callLater(60, seen.append, "sooner")
        calls["delayed"] = reactor.callLater(0.05, last)
        calls["between"] = reactor.callLater(0.1, seen.append, "between")
        reactor.callLater(0, second)

    def second() -> None:
        calls["sooner"].reset(0.02)
        calls["delayed"].delay(0.15)

    def last() -> None:
        seen.append("delayed")
        reactor.stop()

    reactor.callWhenRunning(first)
    assert _run(reactor)
    assert seen == ["sooner", "between", "delayed"]


def test_an_error_in_a_lean_turn_is_logged_and_the_loop_goes_on() -> None:
    """An exception out of a turn is logged as Twisted's main loop logs it, and
    the next turn runs."""
    reactor = EPollReactor()
    assert lean_dispatch(reactor)
    poll = reactor.doIteration
    turns: list[int] = []

    def failing_once(timeout: float | None) -> None:
        turns.append(1)
        if len(turns) == 1:
            raise RuntimeError("a broken turn")
        if len(turns) == 2:
            reactor.stop()
        poll(0)

    reactor.doIteration = failing_once  # type: ignore[method-assign]
    with LogLines("Unexpected error in main loop") as lines:
        assert _run(reactor)
    assert len(lines) == 1 and len(turns) >= 3


def test_an_unknown_main_loop_is_kept_with_one_line(
        reactor: EPollReactor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Twisted whose ``timeout`` is not the body the lean turn stands in for: the
    reactor keeps its own ``mainLoop`` (the dispatch is still lean), one log line."""
    from twisted.internet.base import ReactorBase

    def changed(self: Any) -> float | None:
        return self._newHook()               # (a name Twisted 26.10's body has not)

    monkeypatch.setattr(ReactorBase, "timeout", changed)
    with LogLines("lean turn replaces") as lines:
        assert lean_dispatch(reactor)
    assert len(lines) == 1 and "keeps its own" in lines[0]
    assert "mainLoop" not in vars(reactor)


@pytest.mark.parametrize("owner,name", sorted(dispatch._LOOP_HELPER_NAMES))
def test_an_unknown_body_the_lean_turn_relies_on_keeps_twisteds_loop(
        reactor: EPollReactor, monkeypatch: pytest.MonkeyPatch, owner: str,
        name: str) -> None:
    """A Twisted whose ``callLater``, ``DelayedCall.reset`` (or another body the lean
    turn relies on without replacing it) differs: the reactor keeps its own
    ``mainLoop``, said in one log line."""
    from twisted.internet.base import DelayedCall, ReactorBase

    def changed(self: Any, *args: Any, **kw: Any) -> Any:
        return self._newHook()               # (a name Twisted 26.10's body has not)

    monkeypatch.setattr(ReactorBase if owner == "reactor" else DelayedCall, name, changed)
    with LogLines("lean turn replaces") as lines:
        assert lean_dispatch(reactor)
    assert len(lines) == 1 and "keeps its own" in lines[0]
    assert "mainLoop" not in vars(reactor)


def test_a_reactor_with_its_own_read_or_write_keeps_it_for_every_event() -> None:
    """An epoll reactor class whose ``_doReadOrWrite`` is its own: no plain-read
    shortcut (its override sees every event)."""
    class Own(EPollReactor):
        def _doReadOrWrite(self, selectable: Any, fd: int, event: int) -> None:
            EPollReactor._doReadOrWrite(self, selectable, fd, event)

    assert dispatch._fast_read_classes(Own) == frozenset()
    assert dispatch._fast_read_classes(EPollReactor)


def test_a_tls_connection_takes_the_shortcut_and_its_bytes_arrive(tmp_path: Any) -> None:
    """A TLS connection's socket transport is a TCP server transport: its plain reads
    take the shortcut into ``TLSMemoryBIOProtocol``, the handshake completes and the
    application bytes reach the protocol above it."""
    import ssl as pyssl

    from pki import make_pki
    from twisted.internet import ssl
    from twisted.internet.protocol import Factory
    from twisted.protocols.tls import TLSMemoryBIOFactory

    pki = make_pki(str(tmp_path))
    with open(pki.server_key, "rb") as key, open(pki.server_crt, "rb") as crt:
        options = ssl.PrivateCertificate.loadPEM(key.read() + crt.read()).options()
    app = _Recorder()
    tls = TLSMemoryBIOFactory(options, False, Factory.forProtocol(lambda: app))
    reactor = EPollReactor()
    generic = _count_generic(reactor)
    assert lean_dispatch(reactor)
    server, peer = _tcp_pair()
    peer.setblocking(False)
    incoming, outgoing = pyssl.MemoryBIO(), pyssl.MemoryBIO()
    client = pyssl.create_default_context(cafile=pki.ca).wrap_bio(
        incoming, outgoing, server_hostname="localhost")
    try:
        protocol = tls.buildProtocol(("127.0.0.1", 4000))
        protocol.makeConnection(
            LeanServer(server, protocol, ("127.0.0.1", 4000), None, 0, reactor))
        handshaken = sent = False
        for _ in range(200):   # (each turn waits for an event, at most 0.1 s)
            if not handshaken:
                try:
                    client.do_handshake()
                    handshaken = True
                except pyssl.SSLWantReadError:
                    pass
            if handshaken and not sent:
                client.write(b"hello over tls")
                sent = True
            out = outgoing.read()
            if out:
                peer.sendall(out)
            reactor.doIteration(0.1)
            try:
                back = peer.recv(65536)
            except BlockingIOError:
                back = b""
            if back:
                incoming.write(back)
            if b"".join(e for e in app.events if isinstance(e, bytes)) == b"hello over tls":
                break
        assert handshaken
        assert app.events == [b"hello over tls"]
        assert EPollReactor._POLL_IN not in generic   # (no plain read took Twisted's way)
    finally:
        peer.close()
        reactor.removeAll()
        reactor.waker.connectionLost(None)
        reactor._poller.close()


# -- add_reader: a connection a lean port accepted, registered for reading -----------


@pytest.fixture
def lean_and_twisted() -> Iterator[tuple[EPollReactor, EPollReactor]]:
    """Two epoll reactors, never run: one with the lean dispatch (whose ``add_reader``
    a lean port's accept loop calls), one as Twisted has it."""
    pair = (EPollReactor(), EPollReactor())
    assert lean_dispatch(pair[0]) and callable(pair[0]._lean_add_reader)
    try:
        yield pair
    finally:
        for r in pair:
            _close(r)


def _held(reactor: Any, selectable: _Reader) -> tuple[bool, bool, bool, bool]:
    """What ``reactor`` holds of ``selectable``'s descriptor: in its read set, in its
    write set, its selectable, polled continuously."""
    fd = selectable.fileno()
    return (fd in reactor._reads, fd in reactor._writes,
            reactor._selectables.get(fd) is selectable,
            selectable in reactor._continuousPolling._readers)


def test_add_reader_polls_a_descriptor_epoll_refuses_continuously(
        lean_and_twisted: tuple[EPollReactor, EPollReactor], tmp_path: Path) -> None:
    """A regular file: epoll answers ``EPERM``; both reactors poll it instead (the
    lean one does not raise)."""
    lean, twisted = lean_and_twisted
    path = tmp_path / "plain"
    path.write_bytes(b"x")
    plain: Any = open(path, "rb")   # (a ``_Reader`` asks of it only its ``fileno``)
    try:
        ours, theirs = _Reader(plain), _Reader(plain)
        lean._lean_add_reader(ours, plain.fileno())
        twisted.addReader(theirs)
        assert _held(lean, ours) == _held(twisted, theirs) == (False, False, False, True)
    finally:
        lean.removeAll()
        twisted.removeAll()
        plain.close()


def test_add_reader_modifies_a_descriptor_already_written_to_read_and_write(
        lean_and_twisted: tuple[EPollReactor, EPollReactor]) -> None:
    """A writer's descriptor is in epoll already: ``modify``, not a second
    ``register`` (which epoll refuses with ``EEXIST``); epoll then reports it both
    readable and writable."""
    lean, twisted = lean_and_twisted
    a, b = _pair()
    c, d = _pair()
    try:
        ours, theirs = _Reader(a), _Reader(c)
        lean.addWriter(ours)
        twisted.addWriter(theirs)
        lean._lean_add_reader(ours, a.fileno())
        twisted.addReader(theirs)
        assert _held(lean, ours) == _held(twisted, theirs) == (True, True, True, False)
        b.send(b"ready")
        d.send(b"ready")
        for reactor, sock in ((lean, a), (twisted, c)):
            events = dict(reactor._poller.poll(1, 4))
            assert events.get(sock.fileno(), 0) & EPOLLIN
            assert events[sock.fileno()] & EPOLLOUT
    finally:
        lean.removeAll()   # (before the sockets close: epoll forgets them first)
        twisted.removeAll()
        for sock in (a, b, c, d):
            sock.close()


def test_add_reader_leaves_a_descriptor_already_read_as_it_is(
        lean_and_twisted: tuple[EPollReactor, EPollReactor]) -> None:
    """Registered again with another reader: nothing happens (no ``EEXIST`` out of
    epoll, no continuous polling), and the first reader stays the descriptor's."""
    lean, twisted = lean_and_twisted
    a, b = _pair()
    c, d = _pair()
    try:
        ours, theirs = _Reader(a), _Reader(c)
        lean._lean_add_reader(ours, a.fileno())
        twisted.addReader(theirs)
        lean._lean_add_reader(_Reader(a), a.fileno())
        twisted.addReader(_Reader(c))
        assert _held(lean, ours) == _held(twisted, theirs) == (True, False, True, False)
        assert not lean._continuousPolling._readers
        assert not twisted._continuousPolling._readers
    finally:
        lean.removeAll()   # (before the sockets close: epoll forgets them first)
        twisted.removeAll()
        for sock in (a, b, c, d):
            sock.close()

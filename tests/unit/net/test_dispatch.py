"""``net.dispatch``: an epoll reactor's events handled without Twisted's logging
context, with the same outcome: each ready descriptor read, a failure logged and the
turn's other events still handled, any other reactor left alone.

Reactors are built and closed here, never run; the descriptors are a socket pair.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from loglines import LogLines
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.task import Clock

from mqttamqp.net import dispatch
from mqttamqp.net.dispatch import lean_dispatch


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


@pytest.fixture
def reactor() -> Iterator[EPollReactor]:
    r = EPollReactor()
    try:
        yield r
    finally:
        r.removeAll()
        r.waker.connectionLost(None)
        r._poller.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


def test_a_ready_descriptor_is_read_by_the_lean_dispatch(reactor: EPollReactor) -> None:
    """After ``lean_dispatch`` one iteration reads each descriptor that has input."""
    assert lean_dispatch(reactor)
    assert reactor.doIteration == reactor.doPoll and "do_poll" in reactor.doPoll.__name__
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

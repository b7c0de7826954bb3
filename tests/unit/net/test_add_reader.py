"""``net.dispatch``'s ``add_reader`` (the registration of a connection a lean port
accepted) against Twisted's own ``addReader`` on the same kind of descriptor.

Two real epoll reactors, never run: one with the lean dispatch, one as Twisted has
it. Each case registers the same kind of descriptor on both and compares what each
reactor then holds: its read and write sets, its selectables, its continuous
polling, and what epoll reports.  The negative cases are the point: a descriptor
epoll refuses (a regular file: ``EPERM``) is polled continuously, not raised; one
already written to is modified to read and write, not registered twice (``EEXIST``);
one already read is left alone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

epollreactor = pytest.importorskip("twisted.internet.epollreactor")


class _Selectable:
    """The least a reactor asks of a reader: its descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> None:   # (never called: no reactor here runs)
        raise AssertionError("not run")

    doWrite = doRead


def _reactors() -> tuple[Any, Any]:
    from mqttamqp.net.dispatch import lean_dispatch

    lean = epollreactor.EPollReactor()
    assert lean_dispatch(lean) and callable(lean._lean_add_reader)
    return lean, epollreactor.EPollReactor()


def _held(reactor: Any, selectable: _Selectable) -> tuple[bool, bool, bool, bool]:
    fd = selectable.fileno()
    return (fd in reactor._reads, fd in reactor._writes,
            reactor._selectables.get(fd) is selectable,
            selectable in reactor._continuousPolling._readers)


def _close(*reactors: Any) -> None:
    for reactor in reactors:
        polling = reactor._continuousPolling
        for reader in list(polling._readers):
            polling.removeReader(reader)
        reactor._poller.close()
        reactor.waker.connectionLost(None)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_descriptor_epoll_refuses_is_polled_continuously(tmp_path: Any) -> None:
    """A regular file: epoll answers ``EPERM``; both reactors poll it instead."""
    path = tmp_path / "plain"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    lean, twisted = _reactors()
    try:
        ours, theirs = _Selectable(fd), _Selectable(fd)
        lean._lean_add_reader(ours, fd)
        twisted.addReader(theirs)
        assert _held(lean, ours) == _held(twisted, theirs) == (False, False, False, True)
    finally:
        _close(lean, twisted)
        os.close(fd)


def test_a_descriptor_already_written_is_modified_to_read_and_write(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A writer's descriptor is in epoll already: ``modify``, not a second
    ``register`` (which epoll refuses with ``EEXIST``)."""
    a, b = pair
    lean, twisted = _reactors()
    try:
        ours, theirs = _Selectable(a.fileno()), _Selectable(b.fileno())
        lean.addWriter(ours)
        twisted.addWriter(theirs)
        lean._lean_add_reader(ours, a.fileno())
        twisted.addReader(theirs)
        assert _held(lean, ours) == _held(twisted, theirs) == (True, True, True, False)
        b.send(b"ready")   # ``a`` readable (and writable): epoll reports both
        events = dict(lean._poller.poll(1, 4))
        assert events.get(a.fileno(), 0) & epollreactor.EPOLLIN
        assert events[a.fileno()] & epollreactor.EPOLLOUT
    finally:
        _close(lean, twisted)


def test_a_descriptor_already_read_is_left_as_it_is(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """Registered twice: the second is nothing (no ``EEXIST`` out of epoll), and the
    first selectable stays the descriptor's."""
    a, b = pair
    lean, twisted = _reactors()
    try:
        ours = _Selectable(a.fileno())
        lean._lean_add_reader(ours, a.fileno())
        lean._lean_add_reader(_Selectable(a.fileno()), a.fileno())
        theirs = _Selectable(b.fileno())
        twisted.addReader(theirs)
        twisted.addReader(theirs)
        assert _held(lean, ours) == _held(twisted, theirs) == (True, False, True, False)
    finally:
        _close(lean, twisted)

"""A lean dispatch of the epoll reactor's events: each ready descriptor's
``_doReadOrWrite`` called directly, without Twisted's logging context around it.

Twisted's ``EPollReactor.doPoll`` wraps every event in ``log.callWithLogger``: the
selectable's ``logPrefix()``, a copy and an update of the context dict, and four
more Python calls (~1.2 µs warm, eight calls), so that a legacy ``log.msg`` made
while the event is handled is tagged with the connection's prefix.  At full rate one
event brings hundreds of messages and the cost vanishes; at 1,000 paced QoS 1
messages/s every message is two events (its PUBLISH, the subscriber's PUBACK), and
those eight calls per event were ~15 of the 107 Python calls a message costs there
(``bench/lateness.py --profile``), run on cold caches after each wake-up.  The broker
logs through ``twisted.logger``'s namespaced ``Logger``s, which never read that
context; only Twisted's own legacy lines (an unhandled error in a read) lose the
connection's prefix (their ``system`` is ``-``; the traceback names the protocol).

What it keeps: an exception escaping ``_doReadOrWrite`` (which itself catches what
a read or a write raises and closes the connection) is logged, as
``callWithLogger`` did, and the other events of the turn are still handled; EINTR
ends the turn quietly; ``_poller`` and ``_selectables`` are read on every call, so
a wrapped poller (``bench/lateness.py``) or a reset of the reactor still applies.

It changes only a reactor whose ``doPoll`` is ``EPollReactor``'s own (any other
reactor, a subclass that overrides it, or a test's clock is left alone), and only
if that body is the one it was written from: the names ``doPoll`` uses
(``__code__.co_names``) must be those of Twisted 26.10's (``_DO_POLL_NAMES``).  A
Twisted whose ``doPoll`` does something more or else (a new hook, another dispatch)
keeps its own, with one log line.  The private names it reads (``_poller``,
``_selectables``, ``_doReadOrWrite``) and that fingerprint are checked by
``tests/unit/net/test_net_pins.py`` (see ``mqttamqp.net``).

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

import errno
from importlib import metadata
from typing import Any

from twisted.logger import Logger

__all__ = ["lean_dispatch"]

log = Logger(namespace="mqttamqp.net.dispatch")

#: What ``EPollReactor.doPoll`` calls and reads (its ``__code__.co_names``) in the
#: Twisted the replacement was read from and tested on: 26.10, the newest that
#: pyproject.toml allows.  ``do_poll`` below is that body without the
#: ``log.callWithLogger`` around each event.
_DO_POLL_NAMES = frozenset({
    "_poller", "poll", "len", "_selectables", "OSError", "errno", "EINTR",
    "_doReadOrWrite", "log", "callWithLogger", "KeyError"})


def _known_body(reactor_class: Any) -> bool:
    """Whether ``reactor_class.doPoll`` is the body ``do_poll`` replaces (and
    ``doIteration`` is it, as both are replaced)."""
    code = getattr(reactor_class.doPoll, "__code__", None)
    return (code is not None and frozenset(code.co_names) == _DO_POLL_NAMES
            and reactor_class.doIteration is reactor_class.doPoll)


def lean_dispatch(reactor: Any) -> bool:
    """Give ``reactor`` (an ``EPollReactor``) a ``doPoll`` that dispatches without
    the logging context; True if it has it now (or had it), False if the reactor
    is of another kind, or its ``doPoll`` not the body this replaces, and was left
    as it was."""
    try:
        from twisted.internet.epollreactor import EPollReactor
    except ImportError:   # (no epoll on this system)
        return False
    if getattr(reactor, "_lean_dispatch", False):
        return True
    if not isinstance(reactor, EPollReactor) or type(reactor).doPoll is not EPollReactor.doPoll:
        return False
    if not _known_body(EPollReactor):
        try:
            version = metadata.version("twisted")
        except metadata.PackageNotFoundError:
            version = "unknown"
        log.warn("net.dispatch: this Twisted's ({version}) EPollReactor.doPoll is not the "
                 "one the lean dispatch replaces (written for 26.10); the reactor keeps "
                 "its own", version=version)
        return False
    target: Any = reactor   # (its privates, and an instance attribute for doPoll)

    def do_poll(timeout: float | None) -> None:
        if timeout is None:
            timeout = -1   # (wait until an event)
        try:
            events = target._poller.poll(timeout, len(target._selectables))
        except OSError as e:
            if e.errno == errno.EINTR:
                return
            raise
        selectables = target._selectables
        dispatch = target._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:   # (closed by an earlier event of this turn)
                continue
            try:
                dispatch(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                log.failure("handling an event of {selectable!r} failed",
                            selectable=selectable)

    target.doPoll = target.doIteration = do_poll
    target._lean_dispatch = True
    return True

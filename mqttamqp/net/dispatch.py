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

A plain read event takes a shorter way (in ``do_poll``): the event is exactly
"readable" (no hang-up, no error, not writable), and the descriptor is a TCP server
transport of a known class (Twisted's ``tcp.Server``, ``net.tcp``'s ``LeanServer``)
whose ``doRead`` is Twisted's own. Its socket is then read and the bytes handed to the
protocol's ``dataReceived`` by ``plain_read``, without ``_doReadOrWrite``'s generic
checks, the ``fileno`` call and ``doRead``/``_dataReceived`` (one Python call for four
an event; a paced message is two events). The outcome is Twisted's: "would block" is
nothing, a failed ``recv`` is ``CONNECTION_LOST``, no bytes is ``CONNECTION_DONE`` (a
half-close for a transport that takes one), an exception out of the protocol is logged
as Twisted's ``log.err`` does and loses the connection with it, each through the
reactor's ``_disconnectSelectable``. TLS and WebSocket connections take it too: their
socket transport is such a server (``listenSSL`` is ``listenTCP`` with a
``TLSMemoryBIOFactory``; MQTT over WebSocket and AMQP the same), and the protocol
handed the bytes is the TLS or WebSocket layer, which decrypts or unframes them as
under Twisted's dispatch. Any other event (writable, an error, a hang-up: an AF_UNIX
peer's close is one; a TCP peer's FIN is a plain read of no bytes and takes the
shortcut) or any other descriptor (a client still connecting, a listener, the waker)
goes through ``_doReadOrWrite`` as before, and so does a transport whose socket is
gone. It is on only when the bodies it shortens are the ones it was read from
(``_DO_READ_NAMES``, ``_DATA_RECEIVED_NAMES``, ``_READ_OR_WRITE_NAMES``: Twisted
26.10's); otherwise every event takes Twisted's way, with one log line.

The reactor's turn itself (``_lean_main_loop``): Twisted's ``mainLoop`` calls, every
turn, ``runUntilCurrent`` and ``timeout`` (each first inserting new delayed calls,
then reading the clock; ``timeout`` a ``max`` and a ``min``) inside a ``with`` of its
failure handler (``__enter__``, ``__exit__``): six Python calls a turn when no timer
is due, which at a paced rate is nearly every turn.  The lean loop calls both only
when something is for them (a call from a thread, a new or a due delayed call, a
stop, cancelled calls Twisted would sweep), and otherwise computes the same poll
time-out from the first pending call itself; an exception in a turn goes to
Twisted's own handler (logged, the loop goes on), as ``with _topHandler`` did.  It
is the ``mainLoop`` of the next ``run`` (the broker applies it at start-up, before
the loop starts; an ``--ha`` takeover applies it to a running loop, which keeps
Twisted's until the next ``run``).  Only over the bodies it was written from
(``_MAIN_LOOP_NAMES``, ``_RUN_UNTIL_CURRENT_NAMES``, ``_TIMEOUT_NAMES``: 26.10's) and
those it relies on without replacing them (``_LOOP_HELPER_NAMES``: how a delayed call
is made, inserted, cancelled, reset sooner or delayed, a call from a thread queued, a
stop flagged, and ``run`` calling ``mainLoop``); any other keeps Twisted's loop.

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

A connection ``net.tcp.LeanPort`` has just accepted takes two more short ways:
``add_reader`` registers it for reading (``startReading``, ``addReader`` and
``_add``'s work in one call: epoll, then the reactor's ``_reads`` and
``_selectables``, ``_continuousPolling`` for a descriptor epoll refuses) and
``read_accepted`` reads it in the same turn as ``do_poll``'s plain read does. Each
is set only over the bodies it was written from (``_ADD_READER_NAMES``,
``_ADD_NAMES``, ``_START_READING_NAMES``; the plain read's as above); it also reads
``_reads``, ``_writes``, ``_continuousPolling`` and ``_disconnectSelectable``.

In the compiled build (setup.py ``COMPILED``) this module is compiled too: the loop,
``do_poll`` and ``plain_read`` run every turn, and interpreted they were the last
Python frames of a paced message's turn outside the protocol (``bench/README.md``,
"A paced message in the compiled build").  Their closures are then objects of
native classes, not functions (no ``__name__``, no ``__code__``); the fingerprints
above read only Twisted's own bodies, and the module's globals (``log``) are still
looked up at each use.

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

import errno
import sys
from importlib import metadata
from typing import Any

from twisted.internet import base, main, tcp
from twisted.logger import Logger
from twisted.python import log as legacy_log

from mqttamqp.net.tcp import LeanServer, LeanServerNoDelay, watch_port_classes

__all__ = ["lean_dispatch"]

log = Logger(namespace="mqttamqp.net.dispatch")

#: What ``EPollReactor.doPoll`` calls and reads (its ``__code__.co_names``) in the
#: Twisted the replacement was read from and tested on: 26.10, the newest that
#: pyproject.toml allows.  ``do_poll`` below is that body without the
#: ``log.callWithLogger`` around each event.
_DO_POLL_NAMES = frozenset({
    "_poller", "poll", "len", "_selectables", "OSError", "errno", "EINTR",
    "_doReadOrWrite", "log", "callWithLogger", "KeyError"})


#: The names of the bodies a plain read event skips (in ``do_poll``), in Twisted 26.10:
#: ``tcp.Connection.doRead``, ``tcp.Connection._dataReceived`` and the poll-like
#: reactors' ``_doReadOrWrite``.
_DO_READ_NAMES = frozenset({
    "socket", "recv", "bufferSize", "OSError", "args", "EWOULDBLOCK", "main",
    "CONNECTION_LOST", "_dataReceived"})
_DATA_RECEIVED_NAMES = frozenset({"main", "CONNECTION_DONE", "protocol", "dataReceived"})
_READ_OR_WRITE_NAMES = frozenset({
    "_POLL_DISCONNECTED", "_POLL_IN", "_POLL_OUT", "_reads", "CONNECTION_DONE",
    "CONNECTION_LOST", "fileno", "_NO_FILEDESC", "doRead", "doWrite", "BaseException",
    "sys", "exc_info", "log", "err", "_disconnectSelectable"})
#: The transports whose plain read events ``do_poll`` handles itself.
_FAST_CLASSES = (tcp.Server, LeanServer, LeanServerNoDelay)
#: What ``EPollReactor.addReader`` and ``_add`` read, in Twisted 26.10: the bodies
#: ``add_reader`` (a connection ``LeanPort`` accepted starts reading) stands in for.
_ADD_READER_NAMES = frozenset({
    "EPERM", "EPOLLIN", "EPOLLOUT", "OSError", "_add", "_continuousPolling", "_reads",
    "_selectables", "_writes", "addReader", "errno"})
_ADD_NAMES = frozenset({"_poller", "add", "fileno", "modify", "register"})
_START_READING_NAMES = frozenset({"reactor", "addReader"})


#: The names of Twisted 26.10's ``ReactorBase.mainLoop``, ``runUntilCurrent`` and
#: ``timeout``, which ``_lean_main_loop`` stands in for when no timer is due.
_MAIN_LOOP_NAMES = frozenset({
    "_started", "_topHandler", "runUntilCurrent", "timeout", "running", "doIteration",
    "_log", "info"})
_RUN_UNTIL_CURRENT_NAMES = frozenset({
    "threadCallQueue", "_threadCallHandler", "wakeUp", "_insertNewDelayedCalls",
    "seconds", "_pendingTimedCalls", "time", "heappop", "cancelled", "_cancellations",
    "delayed_time", "activate_delay", "heappush", "_log", "failuresHandled", "creator",
    "_DEFAULT_DELAYED_CALL_LOGGING_HANDLER", "called", "func", "args", "kw", "len",
    "heapify", "_justStopped", "fireSystemEvent"})
_TIMEOUT_NAMES = frozenset({"_insertNewDelayedCalls", "_pendingTimedCalls", "time",
                            "seconds", "max", "min"})
#: The bodies the lean turn relies on without standing in for them, in Twisted 26.10:
#: how a delayed call reaches ``_newTimedCalls`` or ``_pendingTimedCalls`` (``callLater``,
#: ``_insertNewDelayedCalls``, ``_moveCallLaterSooner`` for a ``reset`` sooner, a
#: ``delay`` that is inserted again once due), how a cancel is counted, how a call from
#: a thread and a stop are queued and flagged, and ``run`` calling ``mainLoop``.  Keyed
#: by ``(owner, name)``: "reactor" is the reactor's class, "call" ``DelayedCall``.
_LOOP_HELPER_NAMES: dict[tuple[str, str], frozenset[str]] = {
    ("reactor", "_insertNewDelayedCalls"): frozenset({
        "_cancellations", "_newTimedCalls", "_pendingTimedCalls", "activate_delay",
        "cancelled", "heappush"}),
    ("reactor", "callLater"): frozenset({
        "DelayedCall", "_cancelCallLater", "_moveCallLaterSooner", "_newTimedCalls",
        "append", "seconds"}),
    ("reactor", "_cancelCallLater"): frozenset({"_cancellations"}),
    ("reactor", "_moveCallLaterSooner"): frozenset({"ValueError", "_pendingTimedCalls",
                                                     "index"}),
    ("reactor", "callFromThread"): frozenset({"append", "callable", "threadCallQueue",
                                               "wakeUp"}),
    ("reactor", "stop"): frozenset({"ReactorNotRunning", "_justStopped", "_startedBefore",
                                     "_stopped", "error"}),
    ("reactor", "run"): frozenset({"_signals", "mainLoop", "startRunning", "uninstall"}),
    ("call", "reset"): frozenset({
        "AlreadyCalled", "AlreadyCancelled", "called", "cancelled", "delayed_time",
        "error", "resetter", "seconds", "time"}),
    ("call", "delay"): frozenset({
        "AlreadyCalled", "AlreadyCancelled", "activate_delay", "called", "cancelled",
        "delayed_time", "error", "resetter"}),
}
_LONGEST = 2147483   # (``timeout``'s bound: epoll_wait's milliseconds in a C int)


def _names(function: Any) -> frozenset[str]:
    code = getattr(function, "__code__", None)
    return frozenset(code.co_names) if code is not None else frozenset()


def _fast_read_classes(reactor_class: Any) -> frozenset[type]:
    """The transport classes whose plain read events ``do_poll`` handles itself: none
    unless the bodies it shortens are the ones it was written from (and the
    reactor's ``_doReadOrWrite`` is the poll-like reactors' own, not an override),
    and only those whose ``doRead`` and ``_dataReceived`` are ``tcp.Connection``'s."""
    from twisted.internet.posixbase import _PollLikeMixin

    connection: Any = tcp.Connection
    read_or_write = getattr(reactor_class, "_doReadOrWrite", None)
    if (_names(connection.doRead) != _DO_READ_NAMES
            or _names(connection._dataReceived) != _DATA_RECEIVED_NAMES
            or read_or_write is not _PollLikeMixin._doReadOrWrite
            or _names(read_or_write) != _READ_OR_WRITE_NAMES):
        return frozenset()
    return frozenset(
        cls for cls in _FAST_CLASSES
        if cls.doRead is connection.doRead and cls._dataReceived is connection._dataReceived)


def _known_loop(reactor_class: Any) -> bool:
    """Whether ``mainLoop``, ``runUntilCurrent`` and ``timeout`` of ``reactor_class``
    are the bodies ``_lean_main_loop`` was written from, and those it relies on
    (``_LOOP_HELPER_NAMES``) the ones it was written over."""
    owners = {"reactor": reactor_class, "call": base.DelayedCall}
    return (_names(reactor_class.mainLoop) == _MAIN_LOOP_NAMES
            and _names(reactor_class.runUntilCurrent) == _RUN_UNTIL_CURRENT_NAMES
            and _names(reactor_class.timeout) == _TIMEOUT_NAMES
            and all(_names(getattr(owners[owner], name, None)) == names
                    for (owner, name), names in _LOOP_HELPER_NAMES.items())
            and hasattr(base, "_topHandler"))


def _lean_main_loop(target: Any) -> Any:
    """A ``mainLoop`` for ``target`` that runs its timers only when something is for
    them (module docstring)."""
    top: Any = base._topHandler   # (Twisted's "Unexpected error in main loop" handler)

    def main_loop() -> None:
        while target._started:
            try:
                # (typed: the compiled build reads them without generic calls)
                pending: list[Any] = target._pendingTimedCalls
                cancelled: int = target._cancellations
                if (target.threadCallQueue or target._newTimedCalls or target._justStopped
                        or (cancelled > 50 and cancelled > len(pending) >> 1)):
                    target.runUntilCurrent()
                    timeout = target.timeout()
                elif pending:
                    delay: float = pending[0].time - target.seconds()
                    if delay <= 0:
                        target.runUntilCurrent()
                        timeout = target.timeout()
                    else:
                        timeout = delay if delay < _LONGEST else _LONGEST
                else:
                    timeout = None
                target.doIteration(target.running and timeout)
            except BaseException:
                top.__exit__(*sys.exc_info())   # (logged; the loop goes on, as Twisted's)
        base._log.info("Main loop terminated.")

    return main_loop


def _known_add(reactor_class: Any) -> bool:
    """Whether ``reactor_class.addReader`` and ``_add`` are ``EPollReactor``'s own
    bodies of Twisted 26.10, and ``FileDescriptor.startReading`` the one that calls
    ``addReader`` (``add_reader`` stands in for all three)."""
    from twisted.internet.abstract import FileDescriptor
    from twisted.internet.epollreactor import EPollReactor

    return (reactor_class.addReader is EPollReactor.addReader
            and reactor_class._add is EPollReactor._add
            and _names(EPollReactor.addReader) == _ADD_READER_NAMES
            and _names(EPollReactor._add) == _ADD_NAMES
            and _names(FileDescriptor.startReading) == _START_READING_NAMES)


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
    # (a set the lean ports' own classes join: ``net.tcp.watch_port_classes``)
    fast = set(_fast_read_classes(type(reactor)))
    watch_port_classes(fast)
    if not fast:
        log.warn("net.dispatch: this Twisted's read path is not the one the plain-read "
                 "shortcut replaces (written for 26.10); every event takes Twisted's way")
    readable = EPollReactor._POLL_IN
    would_block = errno.EWOULDBLOCK
    lost, done = main.CONNECTION_LOST, main.CONNECTION_DONE

    def plain_read(selectable: Any, sock: Any) -> None:
        """``_doReadOrWrite`` → ``doRead`` → ``_dataReceived`` for a readable socket of
        a fast class, with their outcome: "would block" is nothing, a failed ``recv``
        ``CONNECTION_LOST``, no bytes ``CONNECTION_DONE``, an exception out of the
        protocol logged as ``log.err`` does; each of the last three through the
        reactor's ``_disconnectSelectable`` (``do_poll``'s and ``read_accepted``'s)."""
        why: Any = None
        in_read = False
        try:
            try:
                data = sock.recv(selectable.bufferSize)
            except OSError as se:
                if se.args[0] != would_block:
                    why = lost
            else:
                if data:
                    selectable.protocol.dataReceived(data)
                else:
                    why = done
            in_read = True
        except BaseException as exc:
            why = exc
            legacy_log.err()
        if why:
            try:
                target._disconnectSelectable(selectable, why, in_read)
            except KeyboardInterrupt:
                raise
            except BaseException:
                log.failure("handling an event of {selectable!r} failed",
                            selectable=selectable)

    def do_poll(timeout: float | None) -> None:
        if timeout is None:
            timeout = -1   # (wait until an event)
        try:
            events: list[tuple[int, int]] = target._poller.poll(
                timeout, len(target._selectables))
        except OSError as e:
            if e.errno == errno.EINTR:
                return
            raise
        selectables: dict[int, Any] = target._selectables
        dispatch = target._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:   # (closed by an earlier event of this turn)
                continue
            if event == readable and type(selectable) in fast:
                # (``_doReadOrWrite`` → ``doRead`` → ``_dataReceived``, for this case)
                try:
                    sock = selectable.socket
                except AttributeError:   # (lost already: Twisted's own checks)
                    sock = None
                if sock is not None:
                    plain_read(selectable, sock)
                    continue
            try:
                dispatch(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                log.failure("handling an event of {selectable!r} failed",
                            selectable=selectable)

    def read_accepted(selectable: Any, fd: int) -> None:
        """A connection ``LeanPort`` has just accepted is read in the same turn
        (``net.tcp``): for a fast class, ``do_poll``'s plain read (the same outcome,
        without ``_doReadOrWrite``, ``doRead`` and ``_dataReceived``: three Python
        calls a connect); any other through ``_doReadOrWrite``."""
        if type(selectable) not in fast:
            target._doReadOrWrite(selectable, fd, readable)
            return
        plain_read(selectable, selectable.socket)

    def add_reader(selectable: Any, fd: int) -> None:
        """``selectable.startReading()`` (``addReader``, ``_add``) for a connection
        ``LeanPort`` has just accepted, whose descriptor is ``fd``: one Python call,
        not three.  The same registration, the same order (epoll first, then the
        reactor's own sets), the same fallback for a descriptor epoll refuses."""
        reads = target._reads
        if fd in reads:
            return
        try:
            if fd in target._writes:
                target._poller.modify(fd, epoll_in | epoll_out)
            else:
                target._poller.register(fd, epoll_in)
        except OSError as e:
            if e.errno != errno.EPERM:
                raise
            target._continuousPolling.addReader(selectable)
            return
        reads.add(fd)
        target._selectables[fd] = selectable

    if fast:
        target._lean_read_accepted = read_accepted
    if _known_add(type(reactor)):
        from twisted.internet.epollreactor import EPOLLIN, EPOLLOUT
        epoll_in, epoll_out = EPOLLIN, EPOLLOUT
        target._lean_add_reader = add_reader
    target.doPoll = target.doIteration = do_poll
    if type(reactor).mainLoop is base.ReactorBase.mainLoop and _known_loop(type(reactor)):
        target.mainLoop = _lean_main_loop(target)
    else:
        log.warn("net.dispatch: this reactor's main loop is not the one the lean turn "
                 "replaces (written for Twisted 26.10); it keeps its own")
    target._lean_dispatch = True
    return True

"""The private names ``mqttamqp.net`` relies on exist in the installed Twisted and
proton: an upgrade past the pins in pyproject.toml fails here, not in production
(where ``LeanPort`` and ``others_waiting`` would quietly fall back to the slow
path, and the accept watcher would let Twisted's lines through).

No event loop runs: reactors are built and closed, a port listens on 127.0.0.1
port 0 with a stub reactor, proton's engine objects are made and dropped.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from types import CodeType
from typing import Any

import pytest
from twisted.internet import abstract, endpoints, tcp
from twisted.internet.protocol import Factory, Protocol

import mqttamqp
from mqttamqp.net import accept
from mqttamqp.net.rawproton import lib


class _StubReactor:
    """What a ``Port`` and a ``Server`` call on their reactor while they start."""

    def addReader(self, reader: Any) -> None:
        pass

    def removeReader(self, reader: Any) -> None:
        pass

    def addWriter(self, writer: Any) -> None:
        pass

    def removeWriter(self, writer: Any) -> None:
        pass

    def callLater(self, delay: float, f: Any, *args: Any, **kw: Any) -> None:
        """(``abortConnection`` schedules its ``connectionLost``: not run here.)"""


@pytest.mark.parametrize("module, name", [("epollreactor", "EPollReactor"),
                                          ("pollreactor", "PollReactor")])
def test_the_poll_reactors_have_what_lean_port_and_others_waiting_read(
        module: str, name: str) -> None:
    """``LeanPort`` and ``others_waiting`` read the poll-like reactors' descriptor
    map, read dispatch, poller and event masks."""
    import importlib

    reactor = getattr(importlib.import_module(f"twisted.internet.{module}"), name)()
    try:
        assert callable(reactor._doReadOrWrite)
        assert isinstance(reactor._POLL_IN, int) and reactor._POLL_IN
        assert isinstance(reactor._POLL_DISCONNECTED, int)
        assert reactor.waker.fileno() in reactor._reads
        assert reactor._selectables[reactor.waker.fileno()] is reactor.waker
        assert isinstance(reactor._poller.poll(0), list)
    finally:
        reactor.removeAll()
        reactor.waker.connectionLost(None)
        close = getattr(reactor._poller, "close", None)
        if close is not None:
            close()


def test_the_epoll_reactors_do_poll_is_the_body_lean_dispatch_replaces() -> None:
    """``net.dispatch`` replaces ``EPollReactor.doPoll`` (and ``doIteration``, the same
    function) only when the names it uses are Twisted 26.10's: an upgrade that
    changes the body fails here (in production the reactor would keep its own)."""
    from twisted.internet.epollreactor import EPollReactor

    from mqttamqp.net import dispatch

    assert frozenset(EPollReactor.doPoll.__code__.co_names) == dispatch._DO_POLL_NAMES
    assert EPollReactor.doIteration is EPollReactor.doPoll
    assert dispatch._known_body(EPollReactor)
    # (``add_reader``, for a connection a lean port accepted, stands in for these)
    assert dispatch._known_add(EPollReactor)
    from twisted.internet.abstract import FileDescriptor
    assert (frozenset(FileDescriptor.startReading.__code__.co_names)
            == dispatch._START_READING_NAMES)
    from mqttamqp.net.tcp import LeanServer
    assert LeanServer.startReading is FileDescriptor.startReading


def test_a_tcp_port_has_what_lean_port_and_the_accept_watch_replace() -> None:
    """``lean_port`` swaps the class and transport of a listening ``Port`` and
    drives its accept loop; ``watch_accept_errors`` replaces its ``_logger``."""
    port = tcp.Port(0, Factory.forProtocol(Protocol), interface="127.0.0.1",
                    reactor=_StubReactor())
    port.startListening()
    try:
        assert type(port) is tcp.Port and port.transport is tcp.Server
        assert isinstance(port.numberAccepts, int) and isinstance(port.sessionno, int)
        assert isinstance(port._realPortNumber, int)
        assert callable(port._buildAddr) and callable(port._getLogPrefix)
        assert callable(port.socket._accept)
        logger = port._logger
        assert callable(logger.observer) and isinstance(logger.namespace, str)
    finally:
        port.socket.close()


def test_a_tcp_transport_has_the_write_buffer_that_send_reads() -> None:
    """``send`` writes past the transport (to its ``socket``, at most ``SEND_LIMIT``)
    only when its buffers (``dataBuffer``, ``offset``, ``_tempDataLen``) are empty, its
    write side is open and it is not being aborted (``_aborting``)."""
    ours, theirs = socket.socketpair()
    try:
        server = tcp.Server(ours, Protocol(), ("127.0.0.1", 1), None, 0, _StubReactor())
        assert server._tempDataLen == 0 and server.offset == 0
        assert len(server.dataBuffer) == 0 and server._writeDisconnected is False
        assert server.writeSomeData(b"x") == 1 and theirs.recv(1) == b"x"
        assert server.socket is ours and server.SEND_LIMIT >= 65536   # (``send``)
        assert callable(server._getLogPrefix)
        # ``LeanServer._tempDataBuffer`` stands for the list Twisted makes, appends
        # to and replaces with an empty one once written (``FileDescriptor``).
        assert server._tempDataBuffer == []
        for method in ("write", "writeSequence", "doWrite"):
            code = getattr(abstract.FileDescriptor, method).__code__
            assert "_tempDataBuffer" in code.co_names, method
        # ``send`` writes nothing once ``abortConnection`` set ``_aborting`` (before
        # its ``connectionLost``, while ``connected`` is still true)
        assert server._aborting is False
        server.abortConnection()
        assert server._aborting is True and server.connected and not server.disconnecting
    finally:
        ours.close()
        theirs.close()


def _constants(code: CodeType) -> set[str]:
    found = {c for c in code.co_consts if isinstance(c, str)}
    for c in code.co_consts:
        if isinstance(c, CodeType):
            found |= _constants(c)
    return found


def test_twisted_still_logs_the_accept_failures_the_watch_matches() -> None:
    """The accept watch knows Twisted's lines by their format strings; reworded,
    they would reach the log again, three a refused connection."""
    source = Path(tcp.__file__).read_text(encoding="utf-8")
    strings = _constants(compile(source, tcp.__file__, "exec"))
    for fmt in (accept._EMFILE_RELEASED, accept._EMFILE_CLOSED, accept._EMFILE_RESERVED,
                accept._NOT_ACCEPTED):
        assert fmt in strings, fmt


def test_an_ssl_endpoint_keeps_the_context_factory_tls_replaces() -> None:
    """``net.tls.server_endpoint`` swaps the endpoint's ``_sslContextFactory``."""
    factory = object()
    endpoint = endpoints.SSL4ServerEndpoint(_StubReactor(), 0, factory)  # type: ignore[arg-type]
    assert endpoint._sslContextFactory is factory


def test_cproton_has_every_c_function_the_broker_calls() -> None:
    """Every ``lib.pn_...`` name in the package exists in the installed ``cproton``."""
    root = Path(mqttamqp.__file__).parent
    names = {name for path in root.rglob("*.py")
             for name in re.findall(r"\blib\.((?:pn|PN)_\w+)", path.read_text(encoding="utf-8"))}
    assert len(names) > 20
    assert [name for name in sorted(names) if not hasattr(lib, name)] == []


def test_proton_objects_have_the_raw_pointer_the_adapters_read() -> None:
    """The AMQP adapter reads the C pointer (``_impl``) of proton's connection,
    transport, collector and links."""
    from proton import Collector, Connection, Transport

    connection = Connection()
    link = connection.session().sender("pins")
    for thing in (connection, Transport(Transport.SERVER), Collector(), link):
        assert thing._impl is not None


def test_pn_decref_answers_the_count_left_that_the_held_sessions_probe_reads() -> None:
    """``EngineChores._release_sessions`` probes a freed session's references with
    ``pn_incref`` then ``pn_decref``, whose answer must be the count left (proton
    0.39/0.40's ``object.c``): one more holder, one more in the answer."""
    from proton import Connection

    from mqttamqp.net.rawproton import decref, incref

    session = Connection().session()
    impl = session._impl
    incref(impl)
    alone = decref(impl)
    link = session.sender("pins")    # (a link holds its session)
    incref(impl)
    assert decref(impl) == alone + 1
    del link


def test_autobahn_still_calls_what_the_websocket_server_overrides() -> None:
    """``mqtt.websocket`` overrides autobahn's private ``_fail_connection`` and sets
    ``failedByMe``; ``StreamOverWebSocket`` reads ``state``, the one-frame read
    ``data`` and ``current_frame``: renamed, the override would silently never run."""
    import inspect

    import autobahn.websocket.protocol as ws
    from autobahn.twisted.websocket import WebSocketServerProtocol

    source = inspect.getsource(ws)
    for used in ("self._fail_connection(", "self.failedByMe", "self.wasNotCleanReason",
                 "self.data = ", "self.current_frame = None"):
        assert used in source, used
    for name in ("_fail_connection", "failHandshake", "sendCloseFrame", "dropConnection",
                 "STATE_CONNECTING", "STATE_OPEN", "STATE_CLOSED", "onMessageFrameBegin",
                 "onMessageFrameData", "sendMessage", "sendClose"):
        assert hasattr(WebSocketServerProtocol, name), name


def test_pn_bytes_t_has_the_layout_the_packet_id_tags_are_packed_in() -> None:
    """``rawproton`` packs the tags' ``pn_bytes_t`` values as ``struct``'s native
    ``size_t`` then pointer: the installed ``cproton`` lays the struct out so."""
    import struct

    from mqttamqp.net.rawproton import ffi

    assert ffi.sizeof("pn_bytes_t") == struct.calcsize("@NP")
    assert ffi.offsetof("pn_bytes_t", "size") == 0
    assert ffi.offsetof("pn_bytes_t", "start") == struct.calcsize("@N")


def test_the_read_path_is_the_one_the_plain_read_shortcut_replaces() -> None:
    """``net.dispatch`` reads a plain read event itself only when ``doRead``,
    ``_dataReceived`` and ``_doReadOrWrite`` are Twisted 26.10's bodies: an upgrade
    that changes one fails here (in production every event would take Twisted's
    way); the transports it handles have the socket, buffer size and protocol it
    reads."""
    from twisted.internet.epollreactor import EPollReactor

    from mqttamqp.net import dispatch
    from mqttamqp.net.tcp import LeanServer, LeanServerNoDelay

    connection: Any = tcp.Connection
    assert frozenset(connection.doRead.__code__.co_names) == dispatch._DO_READ_NAMES
    assert frozenset(connection._dataReceived.__code__.co_names) \
        == dispatch._DATA_RECEIVED_NAMES
    assert frozenset(EPollReactor._doReadOrWrite.__code__.co_names) \
        == dispatch._READ_OR_WRITE_NAMES
    assert dispatch._fast_read_classes(EPollReactor) \
        == {tcp.Server, LeanServer, LeanServerNoDelay}
    assert isinstance(tcp.Server.bufferSize, int) and tcp.Server.bufferSize > 0
    assert callable(EPollReactor._disconnectSelectable)


def test_the_main_loop_is_the_one_the_lean_turn_stands_in_for() -> None:
    """``net.dispatch``'s lean turn replaces ``mainLoop`` only when it, ``runUntilCurrent``
    and ``timeout`` are Twisted 26.10's bodies (and those it relies on: ``callLater``,
    the delayed calls' insertion, cancel, ``reset`` and ``delay``, ``callFromThread``,
    ``stop``, ``run``), and reads the delayed calls' and the
    thread calls' private lists and Twisted's main-loop failure handler."""
    from twisted.internet import base
    from twisted.internet.epollreactor import EPollReactor

    from mqttamqp.net import dispatch

    reactor: Any = EPollReactor
    assert frozenset(reactor.mainLoop.__code__.co_names) == dispatch._MAIN_LOOP_NAMES
    assert frozenset(reactor.runUntilCurrent.__code__.co_names) \
        == dispatch._RUN_UNTIL_CURRENT_NAMES
    assert frozenset(reactor.timeout.__code__.co_names) == dispatch._TIMEOUT_NAMES
    owners = {"reactor": reactor, "call": base.DelayedCall}
    for (owner, name), names in dispatch._LOOP_HELPER_NAMES.items():
        body = getattr(owners[owner], name)
        assert frozenset(body.__code__.co_names) == names, (owner, name)
    assert dispatch._known_loop(EPollReactor)
    instance: Any = EPollReactor()
    try:
        assert instance._pendingTimedCalls == [] and instance._newTimedCalls == []
        assert instance.threadCallQueue == [] and instance._cancellations == 0
        assert instance._justStopped is False and instance._started is False
    finally:
        instance.removeAll()
        instance.waker.connectionLost(None)
        instance._poller.close()
    assert callable(base._topHandler.__exit__)

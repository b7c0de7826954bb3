"""The pump of one AMQP connection: a Twisted protocol driving a python-qpid-proton
engine.

What it owns: the engine's objects (``Connection``, ``Transport``, ``Collector``),
bytes in (``Transport.push``, all of one socket read before one pump), events out
of the ``Collector`` (a delivery to its link through raw pointers, every other
event to ``_on_event``), flushes at the end of the broker's batch, the socket's
back-pressure (a push producer), and the frame trace of the console's debug log.
The end-of-pump chores it shares with gateway mode's client engine are
``enginechores.EngineChores``': bytes out (all of one pump in one write), ``tick``
on the injected clock (re-armed only when the deadline moves earlier), freeing links
and sessions closed at both ends.  Proton's own reactor is not used; every buffer
proton hands out is copied.

What it must not do: decide what an event means (``endpoints``), authenticate
(``listener``), or let an exception reach Twisted: one raised while pumping closes
this connection only (``_internal_error``, ``_undecodable``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from proton import Collector, Condition, Connection, Endpoint, Transport
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp.enginechores import EngineChores
from mqttamqp.amqp.links import BrokerLink, OutgoingLink
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.limits import Limits
from mqttamqp.native import mypyc_attr
from mqttamqp.net.rawproton import delivery_link, event_delivery, lib, next_event, pop_event
from mqttamqp.net.sending import send

__all__ = ["EnginePump", "ConnectionState"]


class ConnectionState(Enum):
    HANDSHAKE = "handshake"            # protocol header and SASL
    AUTHENTICATING = "authenticating"  # credentials are being checked; reading paused
    OPENING = "opening"                # engine running, waiting for the peer's open
    OPEN = "open"
    CLOSED = "closed"                  # closing or closed; input is ignored


# (an Enum member read from its class runs the metaclass's __getattr__ hook on
# Python 3.11: this is read per pump)
_CLOSED = ConnectionState.CLOSED


def _frame_tracer(log: Any, c: str, peer: str) -> Callable[[Any, str], None]:
    """Proton's frame tracer for ``EnginePump.start_debug``: each frame logged, up to
    ``MAX_DEBUG_LINES`` a window.  (A function of the module's: mypyc 2.4.1 fails on a
    closure in a method of a class that is not native.)"""
    budget = LineBudget()

    def trace(_transport: Any, frame: str) -> None:
        if budget.take():
            log.info("debug {c} ({peer}): {frame}", c=c, peer=peer, frame=frame[:300])
        elif budget.left == -1:
            log.info("debug {c} ({peer}): {n} lines logged, the most for one "
                     "window; no more", c=c, peer=peer, n=MAX_DEBUG_LINES)
    return trace


# (not a native class: Twisted's ``Protocol`` is its base, and ``endpoints``' classes,
# not compiled, subclass it)
@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
@implementer(IPushProducer)
class EnginePump(EngineChores, Protocol):
    """A connection's engine and socket; subclasses say what its events mean (the
    end-of-pump chores, timers, output and freeing, are ``EngineChores``')."""

    log = Logger()
    transport: Any

    def __init__(self, broker: Broker, clock: Clock, idle_timeout: float,
                 meter: DeliveryMeter) -> None:
        self.broker = broker
        self.meter = meter       # the core's counters, written the adapters' way
        self.clock = clock
        self.limits: Limits = broker.limits
        self.idle_timeout = idle_timeout
        self.state = ConnectionState.HANDSHAKE
        self.peer = "?"
        self.container_id = ""
        # Console counters: bytes per socket read/write (messages are the links').
        self.bytes_in = self.bytes_out = 0
        self.last_activity = 0.0
        # The links served, by their raw pointer (``_pump`` hands each its deliveries).
        self.links: dict[Any, BrokerLink] = {}
        self.pconn: Any = None
        self.ptrans: Any = None
        self.collector: Any = None
        # The socket's buffer is full (IPushProducer): links count what they add.
        self.write_blocked = False
        # Inside ``_pump``: output is written when it ends (a link that sends while
        # it is true need not ask for a flush: ``OutgoingLink.transfer``).
        self.pumping = False
        # ``Transport.push`` calls so far: proton applies a flow frame as it reads it,
        # so a link's own count of its credit is stale after one (``OutgoingLink``).
        self.input_pushes = 0
        self._flush_call: DelayedCall | None = None
        self._flush_pending = False      # registered to run when the batch ends
        self._after: list[Callable[[], None]] = []
        self._timer: DelayedCall | None = None
        self._timer_deadline = 0.0
        self._closing = False
        # Links and sessions closed at both ends, freed once this pump's output is out.
        self._free_links: list[Any] = []
        self._free_sessions: list[Any] = []
        self._held_sessions: list[Any] = []
        self._debug_timer: DelayedCall | None = None   # frames logged until it fires

    # -- what subclasses decide ----------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        """Any event but a delivery's (``_pump``)."""
        raise NotImplementedError

    def _internal_error(self, failure: Failure) -> None:
        """A bug met while handling the peer's input: close this connection only."""
        raise NotImplementedError

    def _undecodable(self, what: str) -> None:
        """The peer sent a string that is not valid UTF-8 where it must be."""
        raise NotImplementedError

    # IPushProducer: the transport's write buffer is full / drained.
    def pauseProducing(self) -> None:
        self.write_blocked = True
        self._blocked_changed()

    def resumeProducing(self) -> None:
        self.write_blocked = False
        self._blocked_changed()
        if self.state is not ConnectionState.OPEN:
            return
        try:
            for link in list(self.links.values()):
                if isinstance(link, OutgoingLink) and not link.closed:
                    link.on_writable()
        except Exception:
            self._internal_error(Failure())
            return
        self.schedule_flush()

    def stopProducing(self) -> None:
        pass

    def _blocked_changed(self) -> None:
        for link in self.links.values():
            if isinstance(link, OutgoingLink):
                link.on_blocked()

    # -- flushing (LinkHost) -------------------------------------------------------------

    def schedule_flush(self) -> None:
        """Output is pending: write it after the current work.  Inside a batch (any
        connection's socket read) that is when the batch ends, as for MQTT;
        otherwise on the next reactor turn."""
        if (self.pumping or self._flush_pending or self._flush_call is not None
                or self.pconn is None):
            return
        if self.broker.after_batch(self._flush):
            self._flush_pending = True
            return
        self._flush_call = self.clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        self._flush_pending = False
        if self.state is not _CLOSED and self.pconn is not None:
            self._pump()

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after the current batch of events (not re-entrantly)."""
        self._after.append(fn)
        self.schedule_flush()

    # -- the engine ---------------------------------------------------------------------

    def _start_engine(self, data: bytes) -> None:
        pconn = Connection()
        ptrans = Transport(Transport.SERVER)
        collector = Collector()
        pconn.collect(collector)
        ptrans.bind(pconn)
        ptrans.idle_timeout = self.idle_timeout
        ptrans.max_frame_size = max(512, min(self.limits.max_packet_size + 1024, 1 << 20))
        # A session beyond this is a framing error: proton closes the connection.
        ptrans.channel_max = max(0, self.limits.amqp_max_sessions - 1)
        self.pconn, self.ptrans, self.collector = pconn, ptrans, collector
        self.state = ConnectionState.OPENING
        if data:
            self._engine_input(data)

    def _engine_input(self, data: bytes) -> None:
        ptrans = self.ptrans
        broker = self.broker
        self.meter.received_bytes(len(data))
        self.bytes_in += len(data)
        self.last_activity = self.clock.seconds()
        # Everything one socket read causes goes to the store as one batch (one
        # hand-off to the writer thread), as for MQTT.
        broker.begin_batch()
        try:
            # The engine takes at most 8 KiB at a time (its input buffer): all of a
            # read goes in before one pump, so that its answers leave in one write
            # (a write per 8 KiB woke the peer several times per read, and a woken
            # peer on a busy machine takes the CPU from the broker mid-read).
            while data:
                capacity = ptrans.capacity()
                if capacity < 0:
                    break  # input side closed: the rest is ignored
                if capacity == 0:
                    self._pump()   # (a frame larger than the buffer: make room)
                    if self.ptrans is None or ptrans.capacity() <= 0:
                        break
                    continue
                self.input_pushes += 1
                if capacity >= len(data):
                    ptrans.push(data)
                    break
                chunk, data = data[:capacity], data[capacity:]
                ptrans.push(chunk)
            self._pump()
        except Exception:
            self._internal_error(Failure())
        finally:
            broker.end_batch()

    def _pump(self) -> None:
        if self.pumping or self.ptrans is None:
            return
        self.pumping = True
        try:
            col = self.collector._impl
            links = self.links
            while True:
                while True:
                    event = next_event(col)
                    if not event:
                        break
                    try:
                        # The per-message path: raw pointers, no wrappers.  Only a
                        # delivery event has a delivery (one proton call, not two).
                        dlv = event_delivery(event)
                        if dlv:
                            link = links.get(delivery_link(dlv))
                            if link is None or link.closed:
                                self._orphan_delivery(dlv)
                            else:
                                link.on_delivery(dlv)
                        else:
                            self._on_event(event)
                    finally:
                        pop_event(col)
                    if self.ptrans is None:
                        return
                if self._after:
                    work, self._after = self._after, []
                    for fn in work:
                        fn()
                    continue
                self._tick()
                if not next_event(col) and not self._after:
                    break
            self._write_output()
            if self._free_links or self._free_sessions or self._held_sessions:
                self._free_closed()
        except UnicodeDecodeError as exc:
            self.pumping = False
            self._undecodable(f"a string that is not valid UTF-8 ({exc.reason} at byte "
                              f"{exc.start})")
        except Exception:
            self.pumping = False
            self._internal_error(Failure())
        finally:
            self.pumping = False

    def _orphan_delivery(self, dlv: Any) -> None:
        """A delivery on a link we no longer serve: consume and settle it."""
        link = delivery_link(dlv)
        if (lib.pn_link_is_receiver(link) and lib.pn_delivery_readable(dlv)
                and not lib.pn_delivery_partial(dlv)):
            lib.pn_link_advance(link)
        lib.pn_delivery_settle(dlv)

    def _on_timer(self) -> None:
        self._timer = None
        if self.state is not _CLOSED and self.ptrans is not None:
            self._pump()

    def _write(self, data: bytes) -> None:
        send(self.transport, data)   # (at once when nothing is buffered: ``net.tcp``)
        self.bytes_out += len(data)
        self.meter.sent_bytes(len(data))

    def _output_closed(self) -> None:
        self._drop()

    def _drop(self) -> None:
        """Close the socket once written (the engine is done or the peer refused)."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timers()
        self.transport.loseConnection()

    def _close_engine(self, condition: str, description: str) -> None:
        pconn = self.pconn
        if pconn is not None and self.ptrans is not None:
            if not (pconn.state & Endpoint.LOCAL_CLOSED):
                if not (pconn.state & Endpoint.LOCAL_ACTIVE):
                    pconn.open()
                pconn.condition = Condition(condition, description)
                pconn.close()
            self._pump()
            if self.ptrans is not None:
                self._write_output()
        self.state = ConnectionState.CLOSED
        self._drop()

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._flush_call):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._flush_call = None
        if self._debug_timer is not None:
            self.stop_debug()

    # -- per-client debug logging (the console's "Debug log") ----------------------

    def start_debug(self, until: float) -> None:
        """Log every AMQP frame in and out of this connection until ``until``, through
        proton's own frame trace (off, it costs nothing)."""
        ptrans = self.ptrans
        if ptrans is None:
            return
        if self._debug_timer is not None and self._debug_timer.active():
            self._debug_timer.cancel()
        else:
            c, peer = self.container_id, self.peer
            ptrans.tracer = _frame_tracer(self.log, c, peer)
            ptrans.trace(Transport.TRACE_FRM)
            self.log.info("debug logging of {c} ({peer}) on for {s:.0f}s", c=c, peer=peer,
                          s=until - self.clock.seconds())
        self._debug_timer = self.clock.callLater(max(0.0, until - self.clock.seconds()),
                                                 self.stop_debug)

    def stop_debug(self) -> None:
        timer, self._debug_timer = self._debug_timer, None
        if timer is None:
            return
        if timer.active():
            timer.cancel()
        if self.ptrans is not None:
            self.ptrans.trace(Transport.TRACE_OFF)
        self.log.info("debug logging of {c} ({peer}) ended", c=self.container_id,
                      peer=self.peer)

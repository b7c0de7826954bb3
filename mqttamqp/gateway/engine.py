"""One AMQP 1.0 client connection from a gateway to its core: a python-qpid-proton
engine in client mode under a Twisted protocol.

What it owns: the engine's objects (``Connection``, a client ``Transport`` with SASL
ANONYMOUS, or PLAIN when ``--upstream`` names a user, ``Collector``), bytes in
(``Transport.push``, all of one socket read before one pump), the engine's events
handed to the channel (``ChannelEvents``) whose session or link they concern, bytes out
coalesced over a reactor turn (``flush``), and the sessions it begins for channels,
bounded by the core's ``channel-max``.  The end-of-pump chores (all of one pump in
one write, ``tick`` on the injected clock for proton's idle time-out and heartbeats,
freeing links and sessions closed at both ends) are ``amqp/enginechores.py``'s
``EngineChores``, shared with the broker's side.  Proton's own reactor is
not used; every buffer it hands out is copied.  The server side of the same shape is
``amqp/pump.py``; this one is a client and knows nothing of the core's broker.

What it must not do: decide what a delivery means (``channel``), reconnect
(``pool``), or let an exception reach Twisted: one raised while pumping drops this
connection, and every channel on it is told (``ChannelEvents.lost``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from proton import Collector, Connection, Endpoint, Event, Transport
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.amqp.enginechores import EngineChores
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.gateway.target import Upstream
from mqttamqp.net.rawproton import (
    EV_LINK_FLOW,
    delivery_link,
    delivery_settle,
    delivery_settled,
    delivery_update,
    describe,
    event_delivery,
    event_link,
    event_type,
    lib,
    next_event,
    pop_event,
)

__all__ = ["ChannelEvents", "ConnectionOwner", "UpstreamConnection"]

# Events handed to channels, by type (the rest are the connection's own or ignored).
_LINK_OPEN = Event.LINK_REMOTE_OPEN
_LINK_CLOSE = Event.LINK_REMOTE_CLOSE
_LINK_DETACH = Event.LINK_REMOTE_DETACH
_RELEASED: int = lib.PN_RELEASED
_SESSION_CLOSE = Event.SESSION_REMOTE_CLOSE
_CONN_OPEN = Event.CONNECTION_REMOTE_OPEN
_CONN_CLOSE = Event.CONNECTION_REMOTE_CLOSE
_TRANSPORT_ERROR = Event.TRANSPORT_ERROR
_LINK_FINAL = Event.LINK_FINAL
_SESSION_FINAL = Event.SESSION_FINAL


class ChannelEvents(Protocol):
    """What a channel (``channel.ChannelEvents``) is told of its session and links."""

    def on_link_open(self, link: Any) -> None: ...

    def on_link_closed(self, link: Any, reason: str | None) -> None: ...

    def on_session_closed(self) -> None: ...

    def on_flow(self, impl: Any) -> None: ...

    def on_delivery(self, dlv: Any) -> None: ...

    def lost(self, reason: str) -> None: ...


class ConnectionOwner(Protocol):
    """What an ``UpstreamConnection`` tells its pool."""

    def upstream_open(self, conn: UpstreamConnection) -> None: ...

    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None: ...


class UpstreamConnection(EngineChores, TwistedProtocol):
    """One AMQP connection to the core, shared by the channels of many MQTT clients."""

    log: ClassVar[Logger] = Logger()
    transport: Any

    def __init__(self, owner: ConnectionOwner, clock: Clock, upstream: Upstream,
                 container_id: str, idle_timeout: float, max_frame_size: int,
                 max_clients: int = 150) -> None:
        self.owner = owner
        self.max_clients = max_clients
        self.clock = clock
        self.upstream = upstream
        self.container_id = container_id
        self.idle_timeout = idle_timeout
        self.max_frame_size = max_frame_size
        self.open = False                  # the core's open frame came
        self.reason = "connection lost"
        self.channel_max = 65535           # the core's, once its open came
        self.pconn: Any = None
        self.ptrans: Any = None
        self.collector: Any = None
        # The channel of each session and link this connection carries (raw pointers).
        self.sessions: dict[Any, ChannelEvents] = {}
        self.links: dict[Any, ChannelEvents] = {}
        self.serial = 0                    # for unique link names
        self._pumping = False
        self._flush_call: DelayedCall | None = None
        self._timer: DelayedCall | None = None
        self._timer_deadline = 0.0
        self._lost = False
        self._free_links: list[Any] = []
        self._free_sessions: list[Any] = []
        self._held_sessions: list[Any] = []

    # -- what channels use ------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self.sessions)

    @property
    def has_room(self) -> bool:
        """Another client's session may begin: under the core's channel-max and this
        connection's ``max_clients`` (the core closes a connection that attaches more
        links than its --amqp-max-links, with every client on it)."""
        return (self.open and not self._lost
                and len(self.sessions) < min(self.channel_max, self.max_clients))

    def begin(self, channel: ChannelEvents) -> Any:
        """A new session for ``channel`` (opened; its frames leave on the next flush)."""
        session = self.pconn.session()
        self.sessions[session._impl] = channel
        session.open()
        self.serial += 1
        return session

    def register(self, link: Any, channel: ChannelEvents) -> None:
        self.links[link._impl] = channel

    def forget(self, channel: ChannelEvents, links: list[Any]) -> None:
        """``channel`` closed ``links`` and its session: no more of their events go to
        it (the session counts against channel-max until the core ends it too)."""
        for link in links:
            self.links.pop(link._impl, None)

    def flush(self) -> None:
        """Output is pending: written at the end of this reactor turn, with whatever
        else the turn adds (one write for many clients' packets)."""
        if self._pumping or self._flush_call is not None or self.ptrans is None:
            return
        self._flush_call = self.clock.callLater(0, self._flushed)

    def flush_now(self) -> None:
        """Write pending output now (a client's end: its detaches must reach the core
        before anything it may do next, and before the core sends it more)."""
        if not self._pumping and self.ptrans is not None:
            self._pump()

    def _flushed(self) -> None:
        self._flush_call = None
        self._pump()

    def close(self, reason: str) -> None:
        """Close the connection (the gateway stops)."""
        self.reason = reason
        if self.pconn is not None and not (self.pconn.state & Endpoint.LOCAL_CLOSED):
            self.pconn.close()
            self._pump()
        if self.transport is not None:
            self.transport.loseConnection()

    # -- Twisted ----------------------------------------------------------------------

    def connectionMade(self) -> None:
        pconn = Connection()
        ptrans = Transport()   # client mode
        collector = Collector()
        pconn.collect(collector)
        pconn.container = self.container_id
        pconn.hostname = self.upstream.server_name or self.upstream.host
        sasl = ptrans.sasl()
        if self.upstream.username:
            pconn.user = self.upstream.username
            pconn.password = self.upstream.password or ""
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True   # (TLS, if any, is Twisted's, below proton)
        else:
            sasl.allowed_mechs("ANONYMOUS")
        ptrans.idle_timeout = self.idle_timeout
        ptrans.max_frame_size = self.max_frame_size
        ptrans.bind(pconn)
        self.pconn, self.ptrans, self.collector = pconn, ptrans, collector
        pconn.open()
        self._pump()

    def dataReceived(self, data: bytes) -> None:
        ptrans = self.ptrans
        if ptrans is None:
            return
        try:
            while data:
                capacity = ptrans.capacity()
                if capacity < 0:
                    break
                if capacity == 0:
                    self._pump()
                    if self.ptrans is None or ptrans.capacity() <= 0:
                        break
                    continue
                chunk, data = data[:capacity], data[capacity:]
                ptrans.push(chunk)
            self._pump()
        except Exception:
            self._failed(Failure())

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self._lost:
            return
        self._lost = True
        self._cancel_timers()
        if self.reason == "connection lost" and reason is not None:
            self.reason = f"connection lost: {reason.getErrorMessage()}"
        ptrans = self.ptrans
        if ptrans is not None:
            ptrans.close_tail()
            ptrans.close_head()
            ptrans.unbind()
            self._release_all_sessions()
        self.ptrans = None
        channels = set(self.sessions.values()) | set(self.links.values())
        self.sessions.clear()
        self.links.clear()
        was_open, self.open = self.open, False
        for channel in channels:
            try:
                channel.lost(f"the upstream connection ended ({self.reason})")
            except Exception:
                self.log.failure("telling a client its upstream connection ended")
        self.owner.upstream_lost(self, self.reason if was_open else
                                 f"not connected: {self.reason}")

    # -- the engine -------------------------------------------------------------------

    def _pump(self) -> None:
        if self._pumping or self.ptrans is None:
            return
        self._pumping = True
        try:
            col = self.collector._impl
            links = self.links
            for _ in range(1_000_000):   # (bounded: each round takes one event)
                event = next_event(col)
                if not event:
                    break
                try:
                    # The per-message path on raw pointers (``rawproton``): a delivery
                    # or a flow costs no wrapper; every other event is wrapped.
                    dlv = event_delivery(event)
                    if dlv:
                        channel = links.get(delivery_link(dlv))
                        if channel is not None:
                            channel.on_delivery(dlv)
                        else:
                            _orphan(dlv)
                    elif event_type(event) == EV_LINK_FLOW:
                        channel = links.get(event_link(event))
                        if channel is not None:
                            channel.on_flow(event_link(event))
                    else:
                        self._on_event(Event.wrap(event))  # type: ignore[no-untyped-call]
                finally:
                    pop_event(col)
                if self.ptrans is None:
                    return
            self._tick()
            self._write_output()
            if self._free_links or self._free_sessions or self._held_sessions:
                self._free_closed()
        except Exception:
            self._pumping = False
            self._failed(Failure())
        finally:
            self._pumping = False

    def _on_event(self, event: Any) -> None:
        kind = event.type
        if kind is _LINK_OPEN:
            channel = self.links.get(event.link._impl)
            if channel is not None:
                channel.on_link_open(event.link)
        elif kind is _LINK_CLOSE or kind is _LINK_DETACH:
            link = event.link
            channel = self.links.pop(link._impl, None)
            if channel is not None:
                channel.on_link_closed(link, describe(_remote_condition(link)))
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.close()
            self._free_links.append(link._impl)
        elif kind is _SESSION_CLOSE:
            session = event.session
            # (counted until the core's end: its channel number is not free before)
            channel = self.sessions.pop(session._impl, None)
            if channel is not None:
                channel.on_session_closed()
            if session.state & Endpoint.LOCAL_ACTIVE:
                session.close()
            self._free_sessions.append(session._impl)
        elif kind is _CONN_OPEN:
            self.open = True
            # (proton numbers channels from 0: channel-max N allows N + 1 sessions)
            self.channel_max = int(self.ptrans.remote_channel_max) + 1
            self.owner.upstream_open(self)
        elif kind is _CONN_CLOSE:
            self.reason = ("the core closed the connection: "
                           + (describe(_conn_condition(self.pconn)) or "no reason given"))
            if not (self.pconn.state & Endpoint.LOCAL_CLOSED):
                self.pconn.close()
        elif kind is _TRANSPORT_ERROR:
            cond = self.ptrans.condition
            if cond is not None and self.reason == "connection lost":
                self.reason = f"{cond.name}: {cond.description}"
        elif kind is _LINK_FINAL:
            self.links.pop(event.link._impl, None)
        elif kind is _SESSION_FINAL:
            self.sessions.pop(event.session._impl, None)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _output_closed(self) -> None:
        if self.transport is not None:
            self.transport.loseConnection()

    def _failed(self, failure: Failure) -> None:
        self.log.failure("the upstream connection to {u} failed; dropping it", failure,
                         u=self.upstream.display)
        self.reason = f"internal error: {failure.getErrorMessage()}"
        if self.transport is not None:
            self.transport.abortConnection()

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._flush_call):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._flush_call = None


def _orphan(dlv: Any) -> None:
    """A delivery on a link no channel serves: a message for a client that is gone
    (its detach not yet out) is Released, so the core keeps it for the session
    (settling it with no outcome would lose it); an outcome of ours is settled."""
    if lib.pn_link_is_receiver(delivery_link(dlv)) and not delivery_settled(dlv):
        delivery_update(dlv, _RELEASED)
    delivery_settle(dlv)


def _remote_condition(link: Any) -> Any:
    return lib.pn_link_remote_condition(link._impl)


def _conn_condition(pconn: Any) -> Any:
    return lib.pn_connection_remote_condition(pconn._impl)

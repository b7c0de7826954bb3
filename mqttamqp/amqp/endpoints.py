"""The sessions and links of one AMQP connection as the peer begins, attaches,
detaches and ends them.

What it owns: what each endpoint event means (``_on_event``: a session begun is
begun, a link attached goes to ``attach``, a detach or an end ends our side of it),
the bounds on links (``--amqp-max-links`` per connection and
``--amqp-max-links-total`` in all: beyond either, the attach is refused with
``amqp:resource-limit-exceeded`` and the connection stays, counted, log lines limited
per cause; both count every link proton holds, refused ones too, until the peer
detaches it, and a peer that holds refused links past a margin is closed) and on bytes of
unfinished messages (``--amqp-max-held-bytes``), transport errors, the links'
shared registers (control outlets, will links), and the one place where the end of
a connection ends its links: a brute end (wills fire) unless the peer closed
cleanly.  A link closed at both ends is freed (proton would keep it until the
connection ends).

What it must not do: pump the engine (``pump``), authenticate or open the
connection (``listener``), or decide what an address means (``attach``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from proton import Endpoint, Event, Link
from twisted.python.failure import Failure

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp.attach import RESOURCE_LIMIT, attach, refuse_link
from mqttamqp.amqp.incoming import IncomingLink
from mqttamqp.amqp.links import BrokerLink, ControlOutlet, OutgoingLink
from mqttamqp.amqp.pump import ConnectionState, EnginePump
from mqttamqp.amqp.services import SessionRequests, WillServiceLink
from mqttamqp.amqp.transactions import hold_outcome
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.transactions import Transaction
from mqttamqp.net.rawproton import EV_LINK_FLOW, EV_TRANSPORT, describe, event_link, event_type, lib

__all__ = ["SessionsAndLinks", "LinkRegisters", "refused_bound",
           "refusal_margin", "transport_error_cause"]

_E = Event
_CLOSED = ConnectionState.CLOSED   # (an Enum member read from its class costs a hook)
_LINK_REMOTE_DETACH: int = _E.LINK_REMOTE_DETACH.number


class LinkRegisters(Protocol):
    """What every connection of a listener shares about links (``AMQPFactory``)."""

    links_held: int
    control_outlets: dict[str, list[ControlOutlet]]
    will_links: dict[str, BrokerLink]
    refusal_log: LogLimiter    # log lines of refused links, per condition (``attach``)
    log_limit: LogLimiter      # log lines per cause a minute

    def hold_links(self, delta: int) -> None: ...

    def links_full(self) -> None: ...


class SessionsAndLinks(EnginePump):
    """A connection's endpoints: the ``LinkHost`` its links know."""

    def __init__(self, broker: Broker, clock: Clock, idle_timeout: float,
                 meter: DeliveryMeter, registers: LinkRegisters, serial: int) -> None:
        super().__init__(broker, clock, idle_timeout, meter)
        self.registers = registers
        self.serial = serial
        self.identity = Identity("")          # who opened it (``listener``)
        self.held_bytes = 0     # unfinished incoming messages (--amqp-max-held-bytes)
        # Links the peer attached and has not detached (any kind, refused ones too:
        # proton keeps each until then); counted, not listed (a count costs nothing
        # per link).  The registers keep the total of all connections.
        self.links_held = 0
        # Messages of links already gone (``forget_link``), for the console.
        self._gone_in = self._gone_out = 0
        self.requests = SessionRequests(self)
        # The connection's publish budget (None: not limited), shared by its senders.
        self.publish_rate = self.broker.gate.publish_rate()
        # Open AMQP transactions by txn-id (``transactions``); made when a
        # coordinator attaches.
        self.txns: dict[bytes, Transaction] | None = None
        self._peer_closed = False           # the peer sent close (a clean end unless error)
        self._lost_reason = ""
        # Links refused for --amqp-max-links, not yet detached by the peer: when each
        # was refused, oldest first (made on the first; ``_refuse_over_limit``).
        self._over_limit: dict[Any, float] | None = None

    def _on_event(self, event: Any) -> None:
        """Any event but a delivery's (``_pump``)."""
        etype = event_type(event)
        if etype == EV_LINK_FLOW:
            link = self.links.get(event_link(event))
            if link is not None and not link.closed:
                link.flowed()
                link.on_flow()
        elif etype != EV_TRANSPORT:
            handler = self._handlers.get(etype)
            if handler is not None:
                # (the raw event: ``Event.wrap`` makes a wrapper of the link, session,
                # connection and transport for every event, which a link's attach
                # need not pay for)
                handler(self, event)

    def forget_link(self, link: BrokerLink) -> None:
        if self.links.pop(link.impl, None) is not None:
            if link.role == "sender":
                self._gone_out += link.delivered
            else:
                self._gone_in += link.delivered

    def transactional_outcome(self, link: OutgoingLink, dlv: Any) -> None:
        hold_outcome(link, dlv)

    def send_control(self, client_id: str, data: bytes) -> bool:
        outlets = self.registers.control_outlets.get(client_id)
        if not outlets:
            return False
        outlets[-1].send(data)
        return True

    def register_control(self, outlet: ControlOutlet) -> None:
        self.registers.control_outlets.setdefault(outlet.client_id, []).append(outlet)

    def unregister_control(self, outlet: ControlOutlet) -> None:
        outlets = self.registers.control_outlets.get(outlet.client_id)
        if outlets and outlet in outlets:
            outlets.remove(outlet)
            if not outlets:
                del self.registers.control_outlets[outlet.client_id]

    def claim_will(self, link: BrokerLink) -> None:
        self.registers.will_links[link.name] = link

    def holds_will(self, client_id: str) -> bool:
        """Whether this connection holds ``client_id``'s will-service link (checked
        at its attach: ``gate.may_use_session``)."""
        link = self.registers.will_links.get(client_id)
        return link is not None and link.host is self and not link.closed

    def release_will(self, link: BrokerLink) -> bool:
        if self.registers.will_links.get(link.name) is link:
            del self.registers.will_links[link.name]
            return True
        return False

    @property
    def log_limit(self) -> LogLimiter:
        """Log lines limited per cause, one a minute (shared by the listener)."""
        log: LogLimiter = self.registers.log_limit
        return log

    @property
    def refusal_log(self) -> LogLimiter:
        """Log lines of refused links, limited per condition (``attach``)."""
        log: LogLimiter = self.registers.refusal_log
        return log

    def _end_links(self, brute: bool, reason: str) -> None:
        """The one place where a connection's end reaches its links (and wills)."""
        links = list(self.links.values())
        self.links.clear()
        # Receivers first (nothing more goes into a closing connection), will links last.
        links.sort(key=lambda link: (isinstance(link, IncomingLink),
                                     isinstance(link, WillServiceLink)))
        for link in links:
            try:
                link.end(brute, reason)
            except Exception:
                self.log.failure("ending link {n}", Failure(), n=link.name)
        self.requests.ended()

    # -- events -------------------------------------------------------------------------

    def _on_connection_remote_close(self, event: Any) -> None:
        pconn = self.pconn
        condition = describe(lib.pn_connection_remote_condition(pconn._impl))
        self._peer_closed = condition is None
        reason = ("connection closed by the peer" if condition is None else
                  f"connection closed by the peer with {condition}")
        self._lost_reason = reason
        self._end_links(brute=condition is not None, reason=reason)
        if not (pconn.state & Endpoint.LOCAL_CLOSED):
            pconn.close()

    def _on_session_remote_open(self, event: Any) -> None:
        lib.pn_session_open(lib.pn_event_session(event))

    def _on_session_remote_close(self, event: Any) -> None:
        if self.state is _CLOSED:
            return   # (the connection's end ends everything)
        simpl = lib.pn_event_session(event)
        # Its links still attached are gone with it (those detached were counted
        # out; one detached without closing stays remotely active until freed).
        gone = 0
        active = Endpoint.REMOTE_ACTIVE
        freeing = self._free_links
        plink = lib.pn_link_head(self.pconn._impl, active)
        while plink:
            if lib.pn_link_session(plink) == simpl and plink not in freeing:
                gone += 1
                if self._over_limit:
                    self._over_limit.pop(plink, None)
            plink = lib.pn_link_next(plink, active)
        self._hold_links(-gone)
        condition = describe(lib.pn_session_remote_condition(simpl))
        reason = ("session ended by the peer" if condition is None else
                  f"session ended by the peer with {condition}")
        for impl, link in list(self.links.items()):
            if lib.pn_link_session(impl) == simpl:
                del self.links[impl]
                link.end(condition is not None, reason)
                if not (lib.pn_link_state(impl) & Endpoint.LOCAL_CLOSED):
                    lib.pn_link_close(impl)
        if not (lib.pn_session_state(simpl) & Endpoint.LOCAL_CLOSED):
            lib.pn_session_close(simpl)
        # (frees the links it still has, ours and refused ones)
        self._free_sessions.append(simpl)

    def _on_link_remote_open(self, event: Any) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        plink = Link.wrap(event_link(event))  # type: ignore[no-untyped-call]
        # Refused links count too: proton keeps each until the peer detaches it.
        self._hold_links(1)
        limits = self.limits
        if self.links_held > limits.amqp_max_links:
            # Only this link is refused: the connection may carry many clients (a
            # gateway's), whose links keep working.
            self.meter.limit_hit("amqp_links")
            over = self._over_limit
            if over is None:
                over = self._over_limit = {}
            now = self.clock.seconds()
            if (len(over) >= refused_bound(limits)
                    or (over and now - next(iter(over.values()))
                        > limits.amqp_refused_link_grace)):
                # Refused links are held until the peer detaches them.  A burst of
                # attaches in one read is refused link by link (the peer has not read
                # the refusals yet); a peer that keeps refused links attached past
                # --amqp-refused-link-grace, or holds more than ``refused_bound``, is closed, or
                # it could hold links without bound.
                self.meter.limit_hit("amqp_refused_links")
                held = self.registers.log_limit.allow("amqp-refused-links")
                if held is not None:
                    self.log.warn("AMQP connection of {c} ({peer}) keeps {n} links "
                                  "refused for --amqp-max-links attached (at most {b}, "
                                  "for {g:g} s); closing it{more}",
                                  c=self.container_id or "?", peer=self.peer, n=len(over),
                                  b=refused_bound(limits), g=limits.amqp_refused_link_grace,
                                  more=f" ({held} more closed so since the last such "
                                  "line)" if held else "")
                self._too_many_links(f"more than {limits.amqp_max_links} links on one "
                                     "connection, and refused ones not detached")
                return
            over[plink._impl] = now
            held = self.registers.log_limit.allow("amqp-max-links")
            if held is not None:
                self.log.warn("AMQP connection of {c} ({peer}) attached more than {n} "
                              "links (--amqp-max-links): the attach is refused with "
                              "amqp:resource-limit-exceeded and the connection stays{more}",
                              c=self.container_id or "?", peer=self.peer,
                              n=limits.amqp_max_links,
                              more=f" ({held} more refused for this cause since the last "
                              "such line)" if held else "")
            refuse_link(self, plink, RESOURCE_LIMIT,
                        f"more than {limits.amqp_max_links} links attached on this "
                        "connection (--amqp-max-links)", logged=False)
            return
        total = self.registers.links_held
        if total > limits.amqp_max_links_total:
            self.meter.limit_hit("amqp_links_total")
            self.registers.links_full()
            if total > refusal_margin(limits):
                # Refused links are held until their peers detach them (a
                # well-behaved peer does at once, even one that sent a burst of
                # attaches): past this margin this peer is closed, not refused.
                self._too_many_links(f"more than {limits.amqp_max_links_total} links "
                                     "attached in all, and refused ones not detached")
                return
            refuse_link(self, plink, RESOURCE_LIMIT,
                        f"more than {limits.amqp_max_links_total} links attached to this "
                        "broker in all (--amqp-max-links-total)", logged=False)
            return
        attach(self, plink)

    def _too_many_links(self, description: str) -> None:
        self._lost_reason = "too many links"
        self._end_links(brute=True, reason="too many links")
        self._close_engine(RESOURCE_LIMIT, description)

    def _hold_links(self, delta: int) -> None:
        """Links held by this connection changed by ``delta`` (and so the total)."""
        if delta:
            self.links_held += delta
            self.registers.hold_links(delta)

    def _on_link_remote_close(self, event: Any) -> None:
        if self.state is _CLOSED:
            return   # (the connection's end ends everything)
        impl = event_link(event)
        self._hold_links(-1)
        if self._over_limit:
            self._over_limit.pop(impl, None)
        link = self.links.pop(impl, None)
        condition = describe(lib.pn_link_remote_condition(impl))
        if link is not None:
            reason = ("detached by the peer" if condition is None else
                      f"detached by the peer with {condition}")
            link.end(condition is not None, reason)
        if not (lib.pn_link_state(impl) & Endpoint.LOCAL_CLOSED):
            if event_type(event) == _LINK_REMOTE_DETACH:
                lib.pn_link_detach(impl)
            else:
                lib.pn_link_close(impl)
        # Closed (or detached) at both ends: a new attach of its name is a new link.
        self._free_links.append(impl)

    def hold(self, delta: int) -> None:
        self.held_bytes += delta
        limit = self.limits.amqp_max_held_bytes
        if delta > 0 and self.held_bytes > limit and self.state is not ConnectionState.CLOSED:
            self.meter.limit_hit("amqp_held_bytes")
            self.log.warn("AMQP connection of {c} ({peer}) has more than {n} bytes of "
                          "unfinished messages (--amqp-max-held-bytes); closing it",
                          c=self.container_id or "?", peer=self.peer, n=limit)
            self._lost_reason = "too many bytes held"
            self._end_links(brute=True, reason="too many bytes held")
            self._close_engine("amqp:resource-limit-exceeded",
                               f"more than {limit} bytes of unfinished messages on one "
                               "connection")

    def _on_transport_error(self, event: Any) -> None:
        # (proton's own text may quote the peer's bytes: "link name already
        # attached: <them>"; ``describe`` escapes what is not UTF-8)
        what = describe(lib.pn_transport_condition(self.ptrans._impl))
        if what is not None:
            # One line per connection: the disconnect's own (idle time-out), or
            # this one (a limit, a protocol error), never both.
            if what.startswith("amqp:resource-limit-exceeded"):
                self._lost_reason = f"idle time-out ({what.partition(': ')[2]})"
            elif "channel_max" in what:
                self.meter.limit_hit("amqp_sessions")
                self._lost_reason = (f"too many sessions (more than "
                                     f"{self.limits.amqp_max_sessions}, --amqp-max-sessions)")
                self.log.warn("AMQP connection of {c} ({peer}) began more than {n} sessions "
                              "(--amqp-max-sessions); closing it",
                              c=self.container_id or "?", peer=self.peer,
                              n=self.limits.amqp_max_sessions)
            else:
                self._lost_reason = f"transport error {what}"
                # (one line per error condition a minute: a peer that keeps sending
                # the same bad frames cannot flood the log)
                held = self.registers.log_limit.allow(transport_error_cause(what))
                if held is not None:
                    self.log.info("AMQP connection of {c} ({peer}): {what}; closing{more}",
                                  c=self.container_id or "?", peer=self.peer, what=what,
                                  more=f" ({held} more closed for this cause since the "
                                  "last such line)" if held else "")


    _handlers: ClassVar[dict[int, Callable[[Any, Any], None]]] = {
        _E.CONNECTION_REMOTE_CLOSE.number: _on_connection_remote_close,
        _E.SESSION_REMOTE_OPEN.number: _on_session_remote_open,
        _E.SESSION_REMOTE_CLOSE.number: _on_session_remote_close,
        _E.LINK_REMOTE_OPEN.number: _on_link_remote_open,
        _E.LINK_REMOTE_CLOSE.number: _on_link_remote_close,
        _E.LINK_REMOTE_DETACH.number: _on_link_remote_close,
        _E.TRANSPORT_ERROR.number: _on_transport_error,
    }
    """What each event but a delivery's and a flow means (the connection's own open
    is the listener's)."""


def refused_bound(limits: Limits) -> int:
    """The most links one connection may hold refused for ``--amqp-max-links`` and not
    yet detached (as many as the limit, at least 64: a burst of attaches in one read
    is refused link by link); an attach beyond closes the connection."""
    return max(64, limits.amqp_max_links)


def refusal_margin(limits: Limits) -> int:
    """The most links held in all, refused ones not yet detached by their peers
    included (``--amqp-max-links-total`` and half as much again, at least one
    connection's worth); an attach beyond closes its connection."""
    total = limits.amqp_max_links_total
    return total + max(limits.amqp_max_links, total // 2)


def transport_error_cause(what: str) -> str:
    """The log limiter's key for a transport error ``name: description``: its
    condition name (``amqp:invalid-field``), so that each kind keeps its own line."""
    return "transport error " + what.partition(": ")[0]


"""AMQP links as the broker sees them: the base of every attached link, what it
needs from its connection, and the links the broker sends on.

What it owns: ``BrokerLink`` (one attached link: its address, its end, its console
view), ``LinkHost`` (what a link needs from its connection, ``endpoints``), and
``OutgoingLink`` (a proton sender: the peer receives): transfers, credit, the
bounded wait of what was sent without credit, and the peer's outcomes.  The links
of each kind are in their own modules: ``subscribers`` (a topic filter's or a
client id's session delivered to the peer), ``incoming`` (a link the peer sends
on: credit, answers), ``publisher`` (publishing to topics), ``queuelinks`` and
``services``; ``ControlOutlet`` (``$mqtt.to.<id>.control``) carries the
subscription service's replies.

What it must not do: pump the engine or write to the socket (the connection
does), or hold routing rules (the core does).  Proton never sends without credit:
a delivery made while the peer gave none waits inside the engine, and the bounds
here keep that wait finite.

A link is held for as long as the peer keeps it attached, thousands per broker
(``--amqp-max-links-total``), so it is small: slotted classes, no per-link
closures, and what only some links use (unsettled deliveries, packet ids sent)
made on first use (``bench/linkmem.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from proton import Delivery, Link
from twisted.logger import Logger

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.core.auth import Identity, PublishLimiter
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.connections import LinkInfo
from mqttamqp.core.clock import Clock
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.transactions import Transaction
from mqttamqp.native import mypyc_attr
from mqttamqp.net.rawproton import (
    close_with,
    condition,
    delivery_remote,
    delivery_remote_state,
    delivery_settle,
    delivery_settled,
    disposition_is_failed,
    from_buffer,
    lib,
    link_advance,
    link_credit,
    link_queued,
    link_send,
    new_delivery,
    packet_id_tag,
    tag_blocks,
)

__all__ = [
    "LinkHost", "BrokerLink", "OutgoingLink", "ControlOutlet", "settle_mode_name",
    "rcv_mode_name", "ACCEPTED", "REJECTED", "RELEASED", "MODIFIED", "DECODE_ERROR",
    "INVALID_FIELD", "UNAUTHORIZED", "PRECONDITION_FAILED", "NOT_ALLOWED", "TRANSACTIONAL",
    "DEFAULT_OUTCOME", "NO_OUTCOME",
]

ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED
RELEASED = Delivery.RELEASED
MODIFIED = Delivery.MODIFIED
_TERMINAL = (ACCEPTED, REJECTED, RELEASED, MODIFIED)
# What a delivery the peer settles without an outcome counts as on the gateway
# contract's ``$mqtt.to.<id>.publish`` (with delivery-failed; ``SessionOutlet``).
DEFAULT_OUTCOME = MODIFIED
# The ``reason`` of ``OutgoingLink.outcome`` for a delivery settled without an outcome.
NO_OUTCOME = "settled without an outcome"
# transactional-state (AMQP 1.0 part 4): a transfer or outcome under a transaction
# (``transactions``)
TRANSACTIONAL = 0x34

DECODE_ERROR = "amqp:decode-error"
INVALID_FIELD = "amqp:invalid-field"
UNAUTHORIZED = "amqp:unauthorized-access"
PRECONDITION_FAILED = "amqp:precondition-failed"
NOT_ALLOWED = "amqp:not-allowed"


def settle_mode_name(mode: int) -> str:
    return {Link.SND_UNSETTLED: "unsettled", Link.SND_SETTLED: "settled"}.get(mode, "mixed")


def rcv_mode_name(mode: int) -> str:
    return "second" if mode == Link.RCV_SECOND else "first"


class LinkHost(Protocol):
    """What a link needs from its AMQP connection (``endpoints.SessionsAndLinks``)."""

    broker: Broker
    limits: Limits
    identity: Identity
    container_id: str
    serial: int
    peer: str
    publish_rate: PublishLimiter | None
    write_blocked: bool      # the socket's buffer is full (until it drains)
    pumping: bool            # inside the engine's pump: its output is written after
    input_pushes: int        # input handed to the engine so far (``Transport.push`` calls)
    meter: DeliveryMeter     # the core's counters, written the adapters' way
    clock: Clock
    # The connection's open AMQP transactions by txn-id (``transactions``); None
    # until a coordinator attaches (a transfer's state is not looked at before).
    txns: dict[bytes, Transaction] | None

    @property
    def log_limit(self) -> LogLimiter:
        """Log lines limited per cause, one a minute (shared by the listener)."""

    def schedule_flush(self) -> None: ...

    def transactional_outcome(self, link: OutgoingLink, dlv: Any) -> None:
        """The peer's outcome on ``dlv`` is under a transaction (``transactions``)."""

    def after(self, fn: Callable[[], None]) -> None: ...

    def forget_link(self, link: BrokerLink) -> None: ...

    def send_control(self, client_id: str, data: bytes) -> bool: ...

    def register_control(self, outlet: ControlOutlet) -> None: ...

    def unregister_control(self, outlet: ControlOutlet) -> None: ...

    def claim_will(self, link: BrokerLink) -> None: ...

    def holds_will(self, client_id: str) -> bool: ...

    def hold(self, delta: int) -> None:
        """Bytes of unfinished incoming messages changed by ``delta``."""

    def release_will(self, link: BrokerLink) -> bool: ...


@mypyc_attr(allow_interpreted_subclasses=True)   # (services' links are not compiled)
class BrokerLink:
    """One attached link and what it is for."""

    __slots__ = (
        "_partial",
        "address",
        "broker",
        "closed",
        "delivered",
        "host",
        "impl",
        "name",
        "plink",
    )
    # ClassVar: Twisted's descriptor binds it to the link (compiled, a plain
    # ``log = Logger()`` in a native class would be each instance's own, unbound)
    log: ClassVar[Logger] = Logger()
    role = ""                            # "sender" or "receiver", from the broker's side

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        self.host = host
        self.plink = plink
        self.impl: Any = plink._impl     # raw pointer for the per-message path (rawproton)
        self.address = address
        self.name: str = plink.name
        self.broker = host.broker
        self.closed = False
        self.delivered = 0
        self._partial = 0   # bytes of an unfinished incoming message (IncomingLink)

    def start(self) -> None:
        """Called once the attach has been answered."""

    def on_delivery(self, dlv: Any) -> None:
        """A delivery event on this link: the per-message path (a raw pointer)."""

    def on_flow(self) -> None:
        """The peer's flow frame on this link."""

    def flowed(self) -> None:
        """The peer's flow frame came (before ``on_flow``): an outgoing link reads
        its credit again."""

    def end(self, brute: bool, reason: str) -> None:
        """The link is gone (detach, end, close or lost connection); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._partial:
            self.host.hold(-self._partial)
            self._partial = 0
        self.ended(brute, reason)

    def ended(self, brute: bool, reason: str) -> None:
        pass

    def detach(self, condition: str, description: str) -> None:
        """Broker-initiated detach with an error condition."""
        self.end(True, description)
        self.host.forget_link(self)
        try:
            impl = self.impl
            close_with(impl, lib.pn_link_condition(impl), lib.pn_link_close, condition,
                       description)
        finally:
            self.host.schedule_flush()

    def info(self) -> LinkInfo:
        plink = self.plink
        credit = unsettled = 0
        try:
            credit, unsettled = plink.credit, plink.unsettled
        except Exception:  # a freed link: report zeros rather than fail the console
            pass
        return LinkInfo(
            name=self.name, role=self.role, address=self.address,
            snd_settle_mode=settle_mode_name(plink.snd_settle_mode),
            rcv_settle_mode=rcv_mode_name(plink.rcv_settle_mode),
            credit=credit, unsettled=unsettled, delivered=self.delivered)


# -- broker → peer ---------------------------------------------------------------------


class OutgoingLink(BrokerLink):
    __slots__ = ("_awaiting", "_credit", "_credit_input", "_over_credit_bytes", "_tag", "mixed",
                 "presettled")
    role = "sender"
    # What a delivery settled without an outcome counts as (AMQP 1.0 §3.5.3): 0, no
    # state, consumed (Accepted); ``SessionOutlet`` has ``DEFAULT_OUTCOME``.
    default_outcome: ClassVar[int] = 0

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        super().__init__(host, plink, address)
        mode = plink.snd_settle_mode
        self.presettled = mode == Link.SND_SETTLED
        self.mixed = mode == Link.SND_MIXED
        self._tag = 0             # the last delivery tag number made (``next_tag``)
        self._over_credit_bytes = 0
        # The peer's credit as read from proton (at its last flow, ``flowed``, or by
        # ``transfer``), less the transfers since.  Proton's own count changes by a
        # transfer, ``drained`` (which zeroes it here too) and a flow frame, which it
        # applies when it reads the frame (``Transport.push``), before the pump reaches
        # the flow event: a read with this connection's publishes and then a flow that
        # lowers this link's credit routes those publishes here first.  So the count is
        # trusted only while no input came since it was read (``_credit_input``, the
        # host's ``input_pushes`` then); else, or once it runs out, proton is asked.
        self._credit = 0
        self._credit_input = -1
        # Unsettled deliveries whose outcome matters, by their (live) pointer: a packet
        # id, or its complement (< 0) for a PUBREL.  Cheaper than reading tags back.
        # Made on the first (a receiver of QoS 0 or pre-settled only never needs it).
        self._awaiting: dict[Any, int] | None = None

    def next_tag(self) -> int:
        self._tag += 1
        return self._tag

    def transfer(self, tag: Any, data: bytes, settled: bool, key: int | None = None,
                 published_at: float = 0.0) -> None:
        """Hand one delivery to the engine; ``tag``: its delivery tag (bytes), a packet
        id whose decimal digits are the tag, or a ready one (``rawproton.SETTLED_TAG``,
        for a delivery settled now); ``published_at``: a message's receipt
        time (sampled by the meter), 0 for a pubrel or a control reply."""
        impl = self.impl
        host = self.host
        credit = self._credit - 1
        if credit < 0 or self._credit_input != host.input_pushes:
            # (the count ran out, or input came since it was read: proton's, exact)
            self._credit_input = host.input_pushes
            credit = link_credit(impl) - 1
            if credit < 0:
                credit = 0
                # Waits inside the engine until the peer grants credit.
                if link_queued(impl) == 0:
                    self._over_credit_bytes = 0
                self._over_credit_bytes += len(data)
        self._credit = credit
        # (``rawproton``, inline: this is every message's path; a packet id's tag is
        # made once, ``packet_id_tag``)
        if tag.__class__ is int:
            block = tag_blocks[tag >> 10]
            ctag = packet_id_tag(tag) if block is None else block[tag & 1023]
        elif tag.__class__ is bytes:
            ctag = (len(tag), from_buffer(tag))
        else:
            ctag = tag   # (ready: ``SETTLED_TAG``)
        dlv = new_delivery(impl, ctag)
        link_send(impl, data, len(data))
        link_advance(impl)
        if settled:
            delivery_settle(dlv)
        elif key is not None:
            awaiting = self._awaiting
            if awaiting is None:
                awaiting = self._awaiting = {}
            awaiting[dlv] = key
        self.delivered += 1
        host.meter.transferred(published_at)   # (bytes are counted per socket write)
        if not host.pumping:   # (else written when the pump ends: a call less)
            host.schedule_flush()

    @property
    def credit_room(self) -> bool:
        """The peer's credit covers one more message (beyond those waiting for it):
        the core feeds retained messages, and shared groups their QoS 0 ones, only
        then (``Session.has_room``)."""
        impl = self.impl
        return bool(link_credit(impl) > link_queued(impl))

    def over_credit_full(self) -> bool:
        """Too much is already waiting for credit: a QoS 0 message is dropped."""
        impl = self.impl
        return (link_credit(impl) <= 0 and link_queued(impl) > 0
                and self._over_credit_bytes > self.host.limits.congested_qos0_bytes)

    def flowed(self) -> None:
        self._credit = link_credit(self.impl)
        self._credit_input = self.host.input_pushes

    def drained(self) -> None:
        """Answer the peer's drain: the credit left is given back (zero from here)."""
        self.plink.drained()
        self._credit = 0
        self.host.schedule_flush()

    def on_flow(self) -> None:
        plink = self.plink
        # (proton writes the drained flow after what is queued: no need to wait)
        if plink.drain_mode and plink.credit > 0 and self.idle():
            self.drained()

    def idle(self) -> bool:
        """Nothing more to send right now (used to answer a drain)."""
        return True

    def on_writable(self) -> None:
        """The socket buffer drained."""

    def on_blocked(self) -> None:
        """The socket's buffer filled or drained (``host.write_blocked`` changed)."""

    def on_delivery(self, dlv: Any) -> None:
        """A raw delivery of ours was updated by the peer (its outcome)."""
        state = delivery_remote_state(dlv)
        if state not in _TERMINAL:
            if state == TRANSACTIONAL:
                self.host.transactional_outcome(self, dlv)   # (applied at commit)
                return
            if not delivery_settled(dlv):
                return  # non-terminal (e.g. Received): wait for the outcome
            # Settled without an outcome: the source's default outcome applies (AMQP
            # 1.0 §3.5.3, source.default-outcome): consumed (no state) on most links,
            # modified(delivery-failed) on the contract's ``.publish`` (docs/amqp.md,
            # "Settlement without an outcome"); counted (looping peers show).
            self.broker.stats.settled_without_outcome += 1
            state = self.default_outcome
            failed = state == MODIFIED
            reason: str | None = NO_OUTCOME
        else:
            failed = state == MODIFIED and bool(
                disposition_is_failed(delivery_remote(dlv)))
            reason = _rejected_reason(dlv) if state == REJECTED else None
        awaiting = self._awaiting
        key = awaiting.pop(dlv, None) if awaiting else None
        delivery_settle(dlv)  # its address may be reused from here on
        if key is not None:
            self.outcome(key, state, failed, reason)

    def outcome(self, key: int, state: int, failed: bool, reason: str | None = None) -> None:
        """The outcome of the delivery sent with ``key`` (``reason``: Rejected's
        error description, if it gave one; ``NO_OUTCOME`` (this very object): the
        peer settled without one, ``state`` is ``default_outcome``)."""

    def claim(self, dlv: Any) -> int | None:
        """The key of ``dlv``, no longer awaited (a transaction holds its outcome)."""
        awaiting = self._awaiting
        return awaiting.pop(dlv, None) if awaiting else None

    def delivery_of(self, key: int) -> tuple[Session, int] | None:
        """The core session and packet id of the delivery sent with ``key`` (None:
        not a session's delivery, or the link holds no session now)."""
        return None

    def unclaim(self, dlv: Any, key: int) -> None:
        """``dlv`` awaits its outcome again (its transaction refused it)."""
        if self._awaiting is None:
            self._awaiting = {}
        self._awaiting[dlv] = key


def _rejected_reason(dlv: Any) -> str | None:
    """The error description of the peer's Rejected outcome on ``dlv`` (a durable
    queue dead-letters with it), bytes that are not UTF-8 escaped; None if it gave
    none."""
    both = condition(lib.pn_disposition_condition(delivery_remote(dlv)))
    if both is None:
        return None
    name, description = both
    return description or name or None


class ControlOutlet(OutgoingLink):
    """A receiver on ``$mqtt.to.<id>.control``: replies of the subscription service."""

    __slots__ = ("client_id",)

    def __init__(self, host: LinkHost, plink: Any, address: str, client_id: str) -> None:
        super().__init__(host, plink, address)
        self.client_id = client_id

    def start(self) -> None:
        self.host.register_control(self)

    def send(self, data: bytes) -> None:
        self.transfer(b"c%d" % self.next_tag(), data, self.presettled)

    def ended(self, brute: bool, reason: str) -> None:
        self.host.unregister_control(self)

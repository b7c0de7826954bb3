"""A session: one client id's subscriptions, outbound queue, in-flight window and
inbound QoS 2 ids — the same model whether an MQTT connection or an AMQP receiver
is attached.

The session decides what to send and when (window, order, redelivery with DUP,
bounds and drops) and describes each durable change as a store operation it
returns; it never talks to storage or sockets itself.  Delivery goes through the
attached ``ClientLink``.  Its in-flight window and the answers to its deliveries
are in ``window.InflightWindow``; its entries and stand-ins in ``entries``.

Durability rule: a QoS 2 entry queued for a persistent session is *held* until
the commit that stores it has happened, then sent.  So a subscriber never sees a
QoS 2 message the broker could forget in a crash, and the message keeps its packet
id (allocated at enqueue and stored with it) across a restart.  QoS 1 entries go
at once: a crash before their commit also loses the publisher's PUBACK, so the
publisher resends and the subscriber may see a (permitted) duplicate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, MutableSet
from enum import Enum
from typing import Final

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import (
    DeleteInboundQos2,
    DeleteQueued,
    Op,
    PutInboundQos2,
    QueuedState,
    StoredQueued,
)
from mqttamqp.core.sessions.entries import (
    NATIVE_CALLS,
    NEVER,
    NO_EXPIRED,
    NO_IDS,
    NO_INFLIGHT,
    NO_OPS,
    NO_OPTIONS,
    NO_QUEUE,
    NO_SUBSCRIPTION_IDS,
    NO_SUBSCRIPTIONS,
    ClientLink,
    DeliveryReceipt,
    EntryQueue,
    NativeLink,
    OutEntry,
)
from mqttamqp.core.sessions.extras import BacklogBound, Extras, SessionExtras
from mqttamqp.core.sessions.window import InflightWindow
from mqttamqp.core.topics import is_sys_topic
from mqttamqp.native import mypyc_attr

__all__ = ["BacklogBound", "Session", "SessionState", "SessionStateError",
           "NO_LOCAL", "RETAIN_AS_PUBLISHED", "RETAIN_HANDLING"]


# MQTT 5 subscription options as ``Session.sub_options`` packs them: the options
# byte's bits above QoS, and the subscription identifier from bit 8 on.
NO_LOCAL: Final = 0x04
RETAIN_AS_PUBLISHED: Final = 0x08
RETAIN_HANDLING: Final = 0x30

_SENT: Final = QueuedState.SENT


class SessionState(Enum):
    """The session's lifecycle; every transition is in ``_TRANSITIONS``.

    ``Session.connection`` (who holds it) and ``Session.link`` (where deliveries
    go) follow from it: no holder while OFFLINE, a holder but no link while
    CONNECTING, both ONLINE.
    """

    OFFLINE = "offline"        # nothing attached (a persistent session waits here)
    CONNECTING = "connecting"  # claimed by a connection that has not had CONNACK yet
    ONLINE = "online"          # delivering to its holder

    # Members are singletons compared by identity: hashed by identity in C, as
    # ``mqtt.connection.ConnectionState`` is (``Enum.__hash__`` is a Python call,
    # two a connect in ``_enter``'s table lookups).
    __hash__ = object.__hash__


# (event, from state) -> to state.  Anything else is a bug in the caller.
_TRANSITIONS: dict[tuple[str, SessionState], SessionState] = {
    ("claim", SessionState.OFFLINE): SessionState.CONNECTING,
    ("attach", SessionState.OFFLINE): SessionState.ONLINE,   # claim and attach at once
    ("attach", SessionState.CONNECTING): SessionState.ONLINE,
    ("detach", SessionState.OFFLINE): SessionState.OFFLINE,
    ("detach", SessionState.CONNECTING): SessionState.OFFLINE,
    ("detach", SessionState.ONLINE): SessionState.OFFLINE,
}


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
class SessionStateError(RuntimeError):
    """A lifecycle event that is not allowed in the session's state."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Session(InflightWindow, SessionExtras):
    # Slots: one session per client, online or not (an instance dict of these
    # ~30 attributes cost ~50 bytes more per session).
    # What most sessions never set is not a slot of its own: the kinds of drops and
    # the MQTT 5 expiry interval (``_extras``, made when one is set), and the
    # creation time (never read: it is the first ``last_seen``).
    __slots__ = (
        "_extras", "_holder", "_state",
        "client_id", "expired_ops", "inbound_qos2", "last_seen", "limits", "link",
        "owner", "persistent", "protocol", "sub_options", "subscriptions",
    )

    def __init__(self, client_id: str, persistent: bool, limits: Limits,
                 created: float = 0.0) -> None:
        self.client_id = client_id
        # Of ``dropped``, QoS 0 for a link over its backlog bound and AMQP Rejected,
        # the three counts as they were when the session last changed protocol, and
        # the expiry interval: None until one is set (``extras.SessionExtras``).
        self._extras: Extras | None = None
        self.persistent = persistent
        self.limits = limits
        self.last_seen = created
        # filter -> QoS (``set_subscription`` adds)
        self.subscriptions: dict[str, int] = NO_SUBSCRIPTIONS
        # MQTT 5: filter -> its options and subscription identifier (packed, see
        # NO_LOCAL); only filters that have any.  Empty for every other client,
        # so routing looks no further.
        self.sub_options: dict[str, int] = NO_OPTIONS   # (set with ``set_options``)
        self._state = SessionState.OFFLINE
        self._holder: ClientLink | None = None
        self.protocol = ""                    # "mqtt3.1", "mqtt3.1.1" or "amqp" while online
        # The user that created it (None: anonymous); with verified users, only that
        # user may take it over or act on it (``ClientGate.may_claim``).
        self.owner: str | None = None
        # Where deliveries go: the holder while ONLINE, else None.  Set only by
        # ``_enter`` (a plain attribute: it is read for every delivery).
        self.link: ClientLink | None = None
        # packet id -> entry, in send order
        self.inflight: dict[int, OutEntry] = NO_INFLIGHT
        self.queue: deque[OutEntry] = NO_QUEUE
        self.inbound_qos2: MutableSet[int] = NO_IDS
        self.queued_bytes = 0
        self.stalled = False  # see over_high_water
        # MQTT 5: the client's receive maximum (its session expiry interval:
        # ``expiry``, one of the ``_extras``; so is ``backlog_bound``).
        self.window, self.queue_prefetch = limits.max_inflight, 0
        self.expired_ops: list[Op] = NO_EXPIRED   # see purge_expired
        self.dropped = 0
        self.delivered = 0
        self.queue_waiting = None   # (``InflightWindow.queue_waiting``)
        self._next_seq = 1
        self._next_pid = 1
        self._pids: MutableSet[int] = NO_IDS

    # -- lifecycle ------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def connection(self) -> ClientLink | None:
        """The connection (MQTT) or link (AMQP) that holds the session, if any."""
        return self._holder

    @property
    def online(self) -> bool:
        return self._state is SessionState.ONLINE

    def _enter(self, event: str, holder: ClientLink | None) -> None:
        new = _TRANSITIONS.get((event, self._state))
        if new is None:
            raise SessionStateError(
                f"session {self.client_id!r}: {event} is not allowed while {self._state.value}")
        self._state = new
        self._holder = holder
        self.link = holder if new is SessionState.ONLINE else None

    def drop_congested(self, topic: str) -> None:
        """A QoS 0 copy on ``topic`` dropped at its connection's bound.  The broker's
        own ``$SYS`` messages are not counted: they are not traffic (neither
        received nor sent: ``BrokerStats.own_messages``)."""
        if not is_sys_topic(topic):
            self.dropped += 1
            self.dropped_congested += 1

    def set_subscription(self, topic_filter: str, qos: int) -> None:
        """Subscribe ``topic_filter`` at ``qos`` (the session's first makes its dict)."""
        if self.subscriptions is NO_SUBSCRIPTIONS:
            self.subscriptions = {}
        self.subscriptions[topic_filter] = qos

    def set_options(self, topic_filter: str, packed: int) -> None:
        """MQTT 5 options of ``topic_filter`` (see ``sub_options``; 0: none)."""
        if packed:
            if self.sub_options is NO_OPTIONS:
                self.sub_options = {}
            self.sub_options[topic_filter] = packed
        else:
            self.sub_options.pop(topic_filter, None)

    def claim(self, connection: ClientLink) -> None:
        """A connection claims the session; nothing is delivered until ``attach``."""
        self._enter("claim", connection)

    # -- inspection -------------------------------------------------------------

    @property
    def has_queued(self) -> bool:
        """Messages wait to be sent (beyond the in-flight window or the link's room)."""
        return bool(self.queue)

    def entries(self) -> Iterator[OutEntry]:
        yield from self.inflight.values()
        yield from self.queue

    def delivery_failures(self, packet_id: int) -> int:
        """Failed delivery attempts of the in-flight ``packet_id`` (AMQP delivery-count)."""
        entry = self.inflight.get(packet_id)
        return entry.failures if entry is not None else 0

    def awaiting_release(self, packet_id: int) -> bool | None:
        """True if the in-flight ``packet_id`` is a QoS 2 delivery already released
        (PUBREC seen), False if in flight otherwise, None if not in flight."""
        entry = self.inflight.get(packet_id)
        if entry is None:
            return None
        return entry.state == QueuedState.RELEASED

    def over_high_water(self) -> bool:
        """Queue past half its bound while online: publishers should slow down. Not
        while ``stalled``: a subscriber that made no progress during a whole pause does
        not hold publishers back (its queue drops at its bound) until it acknowledges
        something again.  A ``backlog_bound`` holds them, offline too, while ``over``."""
        return (self.link is not None and not self.stalled and (
            len(self.queue) * 2 > self.limits.max_queued_messages
            or self.queued_bytes * 2 > self.limits.max_queued_bytes
            or self.link.congested)) or (
            self._extras is not None   # (no ``backlog_bound`` call for most sessions)
            and self.backlog_bound is not None and self.backlog_bound.over(self))

    def has_room(self, qos: int) -> bool:
        """Could a message of ``qos`` be sent now, without a backlog growing here?
        Online, and for QoS 1/2 what is in flight and queued below the in-flight
        window (and the queue below its high-water mark); for QoS 0 a link that is
        not congested (and for AMQP, credit left).  Shared groups give messages
        only to members with room, and retained messages are fed to a new
        subscriber as it has room."""
        link = self.link
        if link is None:
            return False
        if not qos:
            # (an AMQP link also needs the peer's credit: ``credit_room``)
            return not link.congested and getattr(link, "credit_room", True)
        limits = self.limits
        return (len(self.inflight) + len(self.queue) < self.window
                and len(self.queue) * 2 <= limits.max_queued_messages
                and self.queued_bytes * 2 <= limits.max_queued_bytes)

    def holds(self, entry: OutEntry) -> bool:
        """Is ``entry`` still this session's (in flight or queued)?"""
        if self.inflight.get(entry.packet_id) is entry:
            return True
        return any(queued is entry for queued in self.queue)

    # -- restoring ------------------------------------------------------------

    def restore(self, queue: Iterable[tuple[int, StoredQueued]],
                inbound_qos2: Iterable[int]) -> None:
        """Rebuild from storage; restored entries may have been sent: DUP on redelivery."""
        entries = list(queue)
        if entries:
            self.queue = deque(self.queue)
            # Stored ids first, so an entry without one cannot be given an id in use.
            self._pids = set(self._pids)
            self._pids.update(stored.packet_id for _, stored in entries if stored.packet_id)
        for seq, stored in entries:
            pid = stored.packet_id or self._allocate_pid()
            msg = stored.message
            state = (QueuedState.RELEASED if stored.state == QueuedState.RELEASED
                     else QueuedState.QUEUED)
            entry = OutEntry(seq, msg, stored.qos, msg.retain, pid, state, dup=True)
            self.queue.append(entry)
            self.queued_bytes += len(msg.payload)
            self._next_seq = max(self._next_seq, seq + 1)
        ids = set(inbound_qos2)
        if ids:
            self.inbound_qos2 = set(self.inbound_qos2) | ids

    # -- outbound -------------------------------------------------------------

    def enqueue(self, message: Message, qos: int, retain: bool) -> list[Op]:
        """Take a message for delivery at ``qos``; returns the durable ops it needs."""
        entry = self.deliver(message, qos, retain)
        if self.expired_ops:
            ops = self.take_expired_ops()
            if entry is not None and self.persistent:
                ops.append(entry.put_op(self.client_id))
            return ops
        if entry is None or not self.persistent:
            return NO_OPS
        return [entry.put_op(self.client_id)]

    def deliver(self, message: Message, qos: int, retain: bool,
                subscription_ids: tuple[int, ...] = NO_SUBSCRIPTION_IDS,
                gated: bool = False, receipt: DeliveryReceipt | None = None
                ) -> OutEntry | None:
        """Take a message for delivery at ``qos`` (with the MQTT 5 identifiers of the
        filters it matched): QoS 0 goes out at once (or is dropped); QoS 1/2 goes
        straight into the window when nothing waits, the window has room, the link is
        online and not congested, and the entry is not gated, held (a persistent
        session's QoS 2) or carrying MQTT 5 properties; else it is queued and sent as
        the window allows.  Returns the entry (None for
        QoS 0 or a drop); a persistent session's entry must be stored
        (``OutEntry.put_op``).  A ``gated`` entry is not sent (nor anything queued
        behind it) until ``ungate``.  A durable queue's ``receipt``: the queue's
        to store, never held for a commit here."""
        link = self.link
        if qos == 0:
            if link is None:
                return None  # QoS 0 is not queued for offline sessions
            # (``congested`` by name: a queue link's is a property, credit included)
            if link.congested and link.backlog_bytes > self.limits.congested_qos0_bytes:
                self.drop_congested(message.topic)
                return None
            if NATIVE_CALLS and isinstance(link, NativeLink):   # (native, not by name)
                native: NativeLink = link
                native.send_publish(message, 0, None, False, retain, subscription_ids)
            elif subscription_ids:
                link.send_publish(message, 0, None, False, retain, subscription_ids)
            else:
                link.send_publish(message, 0, None, False, retain)
            self.delivered += 1
            return None
        size = len(message.payload)
        if ((len(self.queue) >= self.limits.max_queued_messages
                or self.queued_bytes + size > self.limits.max_queued_bytes)
                and self._would_wait(gated)
                and not (getattr(self.queue, "next_expiry", NEVER) <= message.timestamp
                         and purge_expired(self, message.timestamp, size))):
            self.dropped += receipt is None   # (a durable queue's stays in its queue)
            return None
        # QoS 2 to a persistent session waits for its commit, so its packet id is
        # stored before the client can see it (exactly once across a crash).  QoS 1
        # may go at once: if the commit is lost, so is the publisher's PUBACK, and
        # its resend is a permitted duplicate.
        if len(self._pids) >= 65535:  # every packet id is in use: a hard limit
            self.dropped += receipt is None   # (as above)
            return None
        seq = self._next_seq
        self._next_seq = seq + 1
        held = self.persistent and qos == 2 and receipt is None
        props = message.props
        if (link is not None and not self.queue and not held and not gated and props is None
                and len(self.inflight) < self.window and not link.congested):
            # Nothing waits and the window has room: straight into it (``pump``'s
            # lines for one entry, without the queue's append and pop or the call).
            pids = self._pids
            packet_id = self._next_pid
            if pids is NO_IDS or packet_id in pids:
                packet_id = self._allocate_pid()
            else:   # (``_allocate_pid``'s usual case, without the call: the next is free)
                self._next_pid = packet_id % 65535 + 1
                pids.add(packet_id)
            entry = OutEntry(seq, message, qos, retain, packet_id, _SENT, True)
            if receipt is not None:
                entry.receipt = receipt
            inflight = self.inflight
            if inflight is NO_INFLIGHT:
                inflight = self.inflight = {}
            inflight[packet_id] = entry
            if subscription_ids:
                entry.subscription_ids = subscription_ids
            if NATIVE_CALLS and isinstance(link, NativeLink):   # (as for QoS 0)
                native = link
                native.send_publish(message, qos, packet_id, False, retain, subscription_ids)
            elif subscription_ids:
                link.send_publish(message, qos, packet_id, False, retain, subscription_ids)
            else:
                link.send_publish(message, qos, packet_id, False, retain)
            return entry
        entry = OutEntry(seq, message, qos, retain, self._allocate_pid(), held=held)
        if receipt is not None:
            entry.receipt = receipt
        if subscription_ids:
            entry.subscription_ids = subscription_ids
        if gated:
            entry.gated = True
        queue = self.queue
        if queue is NO_QUEUE:
            self.queue = queue = deque()
        if props is not None and props.expiry_interval is not None:
            if type(queue) is not EntryQueue:
                self.queue = queue = EntryQueue(queue)
            queue.next_expiry = min(queue.next_expiry,
                                    message.timestamp + props.expiry_interval)
        queue.append(entry)
        self.queued_bytes += size
        self.pump()
        return entry

    def take_expired_ops(self) -> list[Op]:
        ops, self.expired_ops = self.expired_ops, NO_EXPIRED
        return ops if ops is not NO_EXPIRED else []

    def release_held(self, upto_seq: int) -> None:
        """The commit holding entries up to ``upto_seq`` is durable: they may go."""
        for entry in self.queue:
            if entry.seq > upto_seq:
                break
            entry.held = False
        self.pump()

    def ungate(self, entry: OutEntry) -> None:
        """``entry``'s gate opened: it (and what waits behind it) may go."""
        entry.gated = False
        self.pump()

    def take_back(self, entry: OutEntry) -> list[Op]:
        """Remove ``entry`` (queued or in flight) to give it to another member of its
        shared group; returns the op that forgets it here."""
        if self.inflight.get(entry.packet_id) is entry:
            del self.inflight[entry.packet_id]
        else:
            try:
                self.queue.remove(entry)
            except ValueError:
                return NO_OPS
            self.queued_bytes -= len(entry.message.payload)
        self._pids.discard(entry.packet_id)
        if self._keeps(entry):
            return [DeleteQueued(self.client_id, entry.seq)]
        return NO_OPS

    def withdraw(self, entry: OutEntry) -> None:
        """Take back a queued ``entry`` that must never be sent (its publish failed to
        commit: the publisher got no PUBREC and sends it again)."""
        try:
            self.queue.remove(entry)
        except ValueError:
            return  # already gone (the session was cleared)
        self.queued_bytes -= len(entry.message.payload)
        self._pids.discard(entry.packet_id)
        self.pump()

    # -- attach / detach ------------------------------------------------------

    def attach(self, link: ClientLink) -> None:
        """Start delivering to ``link`` (the holder, or a newcomer claiming it at
        once): in-flight first (DUP / PUBREL), then the queue."""
        if self._state is SessionState.CONNECTING and link is not self._holder:
            raise SessionStateError(
                f"session {self.client_id!r} is held by another connection")
        self._enter("attach", link)
        # Everything in flight on the old connection goes back to the queue head in
        # its original order and is sent again.
        if self.inflight:
            if self.queue is NO_QUEUE:
                self.queue = deque()
            for entry in reversed(list(self.inflight.values())):
                entry.dup = True
                self.queue.appendleft(entry)
                self.queued_bytes += len(entry.message.payload)
            self.inflight.clear()
        if self.queue:   # (``pump`` sends nothing from an empty queue)
            self.pump()

    def detach(self) -> None:
        self._enter("detach", None)

    # -- inbound QoS 2 --------------------------------------------------------

    def inbound_seen(self, packet_id: int) -> bool:
        return packet_id in self.inbound_qos2

    def inbound_add(self, packet_id: int) -> list[Op]:
        if self.inbound_qos2 is NO_IDS:
            self.inbound_qos2 = set()
        self.inbound_qos2.add(packet_id)
        if self.persistent:
            return [PutInboundQos2(self.client_id, packet_id)]
        return NO_OPS

    def inbound_release(self, packet_id: int) -> list[Op]:
        if packet_id not in self.inbound_qos2:
            return NO_OPS
        self.inbound_qos2.discard(packet_id)
        if self.persistent:
            return [DeleteInboundQos2(self.client_id, packet_id)]
        return NO_OPS

    def clear_messages(self) -> None:
        self.queue.clear()
        self.inflight.clear()
        self._pids.clear()
        self.queued_bytes = 0
        self.inbound_qos2.clear()


def purge_expired(session: Session, now: float, size: int) -> bool:
    """At the queue bound, once the earliest expiry has passed: drop the queued
    messages not yet sent whose MQTT 5 expiry interval has run out (counted;
    their deletions wait in ``expired_ops`` for the caller's commit).  One whose
    onward delivery started (sent before: ``dup``; a QoS 2 one owed its PUBREL)
    stays [MQTT-3.3.2-5]: its packet id is the client's.  True if that made room."""
    limits = session.limits
    keep: list[OutEntry] = []
    queue = session.queue
    next_expiry = NEVER
    for entry in queue:
        props = entry.message.props
        if (props is None or props.expiry_interval is None or entry.dup
                or entry.state == QueuedState.RELEASED):
            keep.append(entry)
        elif not entry.message.expired(now):
            keep.append(entry)
            next_expiry = min(next_expiry, entry.message.timestamp + props.expiry_interval)
        else:
            session.queued_bytes -= len(entry.message.payload)
            session._pids.discard(entry.packet_id)
            session.dropped += 1
            if session.persistent:
                if session.expired_ops is NO_EXPIRED:
                    session.expired_ops = []
                session.expired_ops.append(DeleteQueued(session.client_id, entry.seq))
    if type(queue) is EntryQueue:
        queue.next_expiry = next_expiry
    if len(keep) != len(queue):
        queue.clear()
        queue.extend(keep)
    return (len(keep) < limits.max_queued_messages
            and session.queued_bytes + size <= limits.max_queued_bytes)

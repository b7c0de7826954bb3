"""A session: one client id's subscriptions, outbound queue, in-flight window and
inbound QoS 2 ids — the same model whether an MQTT connection or an AMQP receiver
is attached.

The session decides what to send and when (window, order, redelivery with DUP,
bounds and drops) and describes each durable change as a store operation it
returns; it never talks to storage or sockets itself.  Delivery goes through the
attached ``ClientLink``.

Durability rule: a QoS 2 entry queued for a persistent session is *held* until
the commit that stores it has happened, then sent.  So a subscriber never sees a
QoS 2 message the broker could forget in a crash, and the message keeps its packet
id (allocated at enqueue and stored with it) across a restart.  QoS 1 entries go
at once: a crash before their commit also loses the publisher's PUBACK, so the
publisher resends and the subscriber may see a (permitted) duplicate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Protocol, cast

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import (
    DeleteInboundQos2,
    DeleteQueued,
    Op,
    PutInboundQos2,
    PutQueued,
    QueuedState,
    StoredQueued,
)
from mqttamqp.core.topics import is_sys_topic

if TYPE_CHECKING:
    from mqttamqp.core.routing.shared import SharedGroup

__all__ = ["ClientLink", "OutEntry", "Session", "SessionState", "SessionStateError",
           "NO_LOCAL", "RETAIN_AS_PUBLISHED", "RETAIN_HANDLING"]

# MQTT 5 subscription options as ``Session.sub_options`` packs them: the options
# byte's bits above QoS, and the subscription identifier from bit 8 on.
NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08
RETAIN_HANDLING = 0x30

_NO_OPS: list[Op] = []


class _NoEntries(tuple):  # type: ignore[type-arg]
    """Every session's queue until its first entry (an empty deque is 760 bytes, a
    session each; most sessions of idle clients never queue anything).  Reads
    work; what would add swaps in a deque first."""

    __slots__ = ()

    def remove(self, entry: object) -> None:
        raise ValueError("not queued")

    def clear(self) -> None:
        pass


class _NoIds(frozenset):  # type: ignore[type-arg]
    """An empty id set shared until the first id (an empty set is 216 bytes)."""

    __slots__ = ()

    def discard(self, item: object) -> None:
        pass

    def clear(self) -> None:
        pass


class _EmptyMap(dict):  # type: ignore[type-arg]
    """A session's in-flight window until its first QoS 1/2 delivery, and its
    subscriptions until its first (an empty dict is 64 bytes a session; idle
    clients have neither).  ``pump`` and ``set_subscription`` swap in a dict
    before they add; anything else that adds fails at once."""

    __slots__ = ()

    def __setitem__(self, key: object, value: object) -> None:
        raise TypeError("a shared empty stand-in is read-only")

    # (dict's own setdefault and update would bypass __setitem__)
    def setdefault(self, key: object, default: object = None) -> object:
        raise TypeError("a shared empty stand-in is read-only")

    def update(self, *args: object, **kw: object) -> None:
        raise TypeError("a shared empty stand-in is read-only")


# Shared empty stand-ins, replaced on first use (read-only until then):
_NO_OPTIONS: dict[str, int] = {}
_NO_EXPIRED: list[Op] = []
_NO_QUEUE = cast("deque[OutEntry]", _NoEntries())
_NO_IDS = cast("set[int]", _NoIds())
_NO_INFLIGHT = cast("dict[int, OutEntry]", _EmptyMap())
_NO_SUBSCRIPTIONS = cast("dict[str, int]", _EmptyMap())


class ClientLink(Protocol):
    """What a session needs from whatever is attached to it (MQTT or AMQP)."""

    @property
    def congested(self) -> bool:
        """True while the peer cannot take more (full socket buffer, no credit)."""

    @property
    def backlog_bytes(self) -> int:
        """Bytes written since the link became congested (0 when it is not)."""

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool) -> None:
        ...

    def send_pubrel(self, packet_id: int) -> None:
        ...

    def close(self, reason: str) -> None:
        """Broker-initiated close; the link must not call back into the broker."""


class SessionState(Enum):
    """The session's lifecycle; every transition is in ``_TRANSITIONS``.

    ``Session.connection`` (who holds it) and ``Session.link`` (where deliveries
    go) follow from it: no holder while OFFLINE, a holder but no link while
    CONNECTING, both ONLINE.
    """

    OFFLINE = "offline"        # nothing attached (a persistent session waits here)
    CONNECTING = "connecting"  # claimed by a connection that has not had CONNACK yet
    ONLINE = "online"          # delivering to its holder


# (event, from state) -> to state.  Anything else is a bug in the caller.
_TRANSITIONS: dict[tuple[str, SessionState], SessionState] = {
    ("claim", SessionState.OFFLINE): SessionState.CONNECTING,
    ("attach", SessionState.OFFLINE): SessionState.ONLINE,   # claim and attach at once
    ("attach", SessionState.CONNECTING): SessionState.ONLINE,
    ("detach", SessionState.OFFLINE): SessionState.OFFLINE,
    ("detach", SessionState.CONNECTING): SessionState.OFFLINE,
    ("detach", SessionState.ONLINE): SessionState.OFFLINE,
}


class SessionStateError(RuntimeError):
    """A lifecycle event that is not allowed in the session's state."""


class DeliveryReceipt(Protocol):
    """A durable queue's handle on one of its deliveries (``OutEntry.receipt``).

    The session tells it when the client acknowledged the delivery (PUBACK, PUBCOMP,
    AMQP Accepted); the broker tells it the other AMQP outcomes.  The queue keeps
    the message durably, so a session never stores nor holds an entry that has a
    receipt, and the queue never touches the entry's fields."""

    def acknowledged(self) -> None:
        """The client acknowledged the delivery (the session calls it once)."""

    def settled(self, session: Session, entry: OutEntry, outcome: str, failed: bool,
                reason: str | None) -> None:
        """An AMQP outcome other than Accepted: ``released``, ``modified`` (``failed``:
        delivery-failed) or ``rejected`` (with ``reason``)."""


class OutEntry:
    """One outbound QoS 1/2 message of a session, queued or in flight."""

    __slots__ = ("dup", "failures", "gated", "held", "message", "on_done", "packet_id",
                 "qos", "receipt", "retain", "seq", "share", "state")

    def __init__(self, seq: int, message: Message, qos: int, retain: bool,
                 packet_id: int, state: str = QueuedState.QUEUED,
                 dup: bool = False, held: bool = False) -> None:
        self.seq = seq
        self.message = message
        self.qos = qos
        self.retain = retain
        self.state = state
        self.packet_id = packet_id
        self.dup = dup
        self.held = held     # waits for the commit that stores it
        self.gated = False   # waits for its publisher's PUBREC (``Router``'s gate)
        # Failed delivery attempts (AMQP Modified with delivery-failed): an AMQP
        # receiver sees them in delivery-count; Released does not count (§3.4.4).
        self.failures = 0
        # Called once when the client has acknowledged it (see Broker.publish).
        self.on_done: Callable[[], None] | None = None
        # The shared subscription group it came through (it may move to another
        # member when this one goes away: ``Router.member_left``).
        self.share: SharedGroup[Session] | None = None
        # A durable queue's delivery: the queue's receipt for it.  The queue holds
        # it durably, so the session never stores it (``core.queues``).
        self.receipt: DeliveryReceipt | None = None

    def stored(self) -> StoredQueued:
        return StoredQueued(self.message.with_retain(self.retain), self.qos, self.state,
                            self.packet_id)

    def put_op(self, client_id: str) -> PutQueued:
        """The store operation that records this entry for session ``client_id``."""
        return PutQueued(client_id, self.seq, self.stored())


class Session:
    # Slots: one session per client, online or not (an instance dict of these
    # ~30 attributes cost ~50 bytes more per session).
    __slots__ = (
        "_holder", "_may_expire", "_next_pid", "_next_seq", "_pids", "_state",
        "client_id", "created", "delivered", "drop_offset", "dropped",
        "dropped_congested", "dropped_rejected", "expired_ops", "expiry",
        "inbound_qos2", "inflight", "last_seen", "limits", "link", "owner",
        "persistent", "protocol", "queue", "queued_bytes", "stalled", "sub_options",
        "subscriptions", "window",
    )

    def __init__(self, client_id: str, persistent: bool, limits: Limits,
                 created: float = 0.0) -> None:
        self.client_id = client_id
        self.persistent = persistent
        self.limits = limits
        self.created = created
        self.last_seen = created
        # filter -> QoS (``set_subscription`` adds)
        self.subscriptions: dict[str, int] = _NO_SUBSCRIPTIONS
        # MQTT 5: filter -> its options and subscription identifier (packed, see
        # NO_LOCAL); only filters that have any.  Empty for every other client,
        # so routing looks no further.
        self.sub_options: dict[str, int] = _NO_OPTIONS   # (set with ``set_options``)
        self._state = SessionState.OFFLINE
        self._holder: ClientLink | None = None
        self.protocol = ""                    # "mqtt3.1", "mqtt3.1.1" or "amqp" while online
        # The user that created it (None: anonymous); with verified users, only that
        # user may take it over or act on it (``Broker.may_claim``).
        self.owner: str | None = None
        # Where deliveries go: the holder while ONLINE, else None.  Set only by
        # ``_enter`` (a plain attribute: it is read for every delivery).
        self.link: ClientLink | None = None
        # packet id -> entry, in send order
        self.inflight: dict[int, OutEntry] = _NO_INFLIGHT
        self.queue: deque[OutEntry] = _NO_QUEUE
        self.inbound_qos2: set[int] = _NO_IDS
        self.queued_bytes = 0
        self.stalled = False  # see over_high_water
        # MQTT 5: seconds the session outlives its connection (None: the 3.1.1
        # rules and --session-expiry), and the client's receive maximum.
        self.expiry: float | None = None
        self.window = limits.max_inflight
        self.expired_ops: list[Op] = _NO_EXPIRED   # see _purge_expired
        # Queued entries that may carry an expiry (an upper bound: entries that
        # left the queue are only forgotten at the next purge); 0: no scan.
        self._may_expire = 0
        self.dropped = 0
        self.dropped_congested = 0   # of which QoS 0 for a link over its backlog bound
        self.dropped_rejected = 0    # of which AMQP Rejected (``Broker.rejected``)
        # The three counts above as they were when the session last changed protocol
        # (what is already labelled with its former protocol in the metrics).
        self.drop_offset: tuple[int, int, int] = (0, 0, 0)
        self.delivered = 0
        self._next_seq = 1
        self._next_pid = 1
        self._pids: set[int] = _NO_IDS

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
        if self.subscriptions is _NO_SUBSCRIPTIONS:
            self.subscriptions = {}
        self.subscriptions[topic_filter] = qos

    def set_options(self, topic_filter: str, packed: int) -> None:
        """MQTT 5 options of ``topic_filter`` (see ``sub_options``; 0: none)."""
        if packed:
            if self.sub_options is _NO_OPTIONS:
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
        """Queue past half its bound while online: publishers should slow down.

        Not while ``stalled``: a subscriber that made no progress during a whole
        pause does not hold publishers back (its queue drops at its bound instead)
        until it acknowledges something again.
        """
        return self.link is not None and not self.stalled and (
            len(self.queue) * 2 > self.limits.max_queued_messages
            or self.queued_bytes * 2 > self.limits.max_queued_bytes
            or self.link.congested)

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

    # -- packet ids -----------------------------------------------------------

    def _allocate_pid(self) -> int:
        if len(self._pids) >= 65535:
            raise RuntimeError("no free packet id")
        pid = self._next_pid
        while pid in self._pids:
            pid = pid % 65535 + 1
        self._next_pid = pid % 65535 + 1
        if self._pids is _NO_IDS:
            self._pids = set()
        self._pids.add(pid)
        return pid

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
            return _NO_OPS
        return [entry.put_op(self.client_id)]

    def deliver(self, message: Message, qos: int, retain: bool,
                gated: bool = False, receipt: DeliveryReceipt | None = None
                ) -> OutEntry | None:
        """Take a message for delivery at ``qos``: QoS 0 goes out at once (or is
        dropped); QoS 1/2 is queued and sent as the window allows.  Returns the
        queued entry (None for QoS 0 or a drop); a persistent session's entry must
        be stored (``OutEntry.put_op``).  A ``gated`` entry is not sent (nor anything
        queued behind it) until ``ungate``.  An entry with a durable queue's
        ``receipt`` is the queue's to store: never held for a commit here."""
        link = self.link
        if qos == 0:
            if link is None:
                return None  # QoS 0 is not queued for offline sessions
            if link.congested and link.backlog_bytes > self.limits.congested_qos0_bytes:
                self.drop_congested(message.topic)
                return None
            link.send_publish(message, 0, None, False, retain)
            self.delivered += 1
            return None
        size = len(message.payload)
        if ((len(self.queue) >= self.limits.max_queued_messages
                or self.queued_bytes + size > self.limits.max_queued_bytes)
                and not (self._may_expire and self._purge_expired(message.timestamp, size))):
            self.dropped += 1
            return None
        # QoS 2 to a persistent session waits for its commit, so its packet id is
        # stored before the client can see it (exactly once across a crash).  QoS 1
        # may go at once: if the commit is lost, so is the publisher's PUBACK, and
        # its resend is a permitted duplicate.
        if len(self._pids) >= 65535:  # every packet id is in use: a hard limit
            self.dropped += 1
            return None
        seq = self._next_seq
        self._next_seq += 1
        entry = OutEntry(seq, message, qos, retain, self._allocate_pid(),
                         held=self.persistent and qos == 2 and receipt is None)
        if receipt is not None:
            entry.receipt = receipt
        if message.props is not None and message.props.expiry_interval is not None:
            self._may_expire += 1
        if gated:
            entry.gated = True
        if self.queue is _NO_QUEUE:
            self.queue = deque()
        self.queue.append(entry)
        self.queued_bytes += size
        self.pump()
        return entry

    def _purge_expired(self, now: float, size: int) -> bool:
        """At the queue bound: drop the queued (not in-flight) messages whose MQTT 5
        expiry interval has run out (counted; their deletions wait in
        ``expired_ops`` for the caller's commit).  True if that made room."""
        limits = self.limits
        keep: list[OutEntry] = []
        may_expire = 0
        for entry in self.queue:
            props = entry.message.props
            if props is None or props.expiry_interval is None:
                keep.append(entry)
            elif not entry.message.expired(now):
                keep.append(entry)
                may_expire += 1
            else:
                self.queued_bytes -= len(entry.message.payload)
                self._pids.discard(entry.packet_id)
                self.dropped += 1
                if self.persistent:
                    if self.expired_ops is _NO_EXPIRED:
                        self.expired_ops = []
                    self.expired_ops.append(DeleteQueued(self.client_id, entry.seq))
        self._may_expire = may_expire
        if len(keep) != len(self.queue):
            self.queue.clear()
            self.queue.extend(keep)
        return (len(keep) < limits.max_queued_messages
                and self.queued_bytes + size <= limits.max_queued_bytes)

    def take_expired_ops(self) -> list[Op]:
        ops, self.expired_ops = self.expired_ops, _NO_EXPIRED
        return ops if ops is not _NO_EXPIRED else []

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

    def _keeps(self, entry: OutEntry) -> bool:
        """Is ``entry`` stored with this session?  Only a persistent session's, and
        never a durable queue's delivery (the queue keeps that one)."""
        return self.persistent and entry.receipt is None

    def take_back(self, entry: OutEntry) -> list[Op]:
        """Remove ``entry`` (queued or in flight) to give it to another member of its
        shared group; returns the op that forgets it here."""
        if self.inflight.get(entry.packet_id) is entry:
            del self.inflight[entry.packet_id]
        else:
            try:
                self.queue.remove(entry)
            except ValueError:
                return _NO_OPS
            self.queued_bytes -= len(entry.message.payload)
        self._pids.discard(entry.packet_id)
        if self._keeps(entry):
            return [DeleteQueued(self.client_id, entry.seq)]
        return _NO_OPS

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

    def pump(self) -> None:
        """Send queued entries while the window and the link allow, in order."""
        link = self.link
        if link is None:
            return
        queue = self.queue
        inflight = self.inflight
        window = self.window
        while queue and len(inflight) < window and not link.congested:
            entry = queue[0]
            if entry.held or entry.gated:
                break
            queue.popleft()
            self.queued_bytes -= len(entry.message.payload)
            if inflight is _NO_INFLIGHT:
                inflight = self.inflight = {}
            inflight[entry.packet_id] = entry
            if entry.state == QueuedState.RELEASED:
                link.send_pubrel(entry.packet_id)
            else:
                entry.state = QueuedState.SENT
                link.send_publish(entry.message, entry.qos, entry.packet_id, entry.dup,
                                  entry.retain)
                entry.dup = True  # any later send of it is a redelivery

    def ack_problem(self, kind: str, packet_id: int) -> str | None:
        """Why an MQTT acknowledgement (``kind``: PUBACK, PUBREC or PUBCOMP) does not
        fit the QoS flow of the in-flight ``packet_id`` — a protocol violation — or
        None.  An id that is not in flight is not one (a late duplicate: ignored)."""
        entry = self.inflight.get(packet_id)
        if entry is None:
            return None
        if kind == "PUBACK":
            if entry.qos == 1:
                return None
            stage = "after PUBREL" if entry.state == QueuedState.RELEASED else "before PUBREC"
            return f"PUBACK for packet id {packet_id}, a QoS 2 message in flight ({stage})"
        if entry.qos != 2:
            return f"{kind} for packet id {packet_id}, a QoS 1 message in flight"
        if kind == "PUBCOMP" and entry.state != QueuedState.RELEASED:
            return f"PUBCOMP for packet id {packet_id} before PUBREC"
        return None

    def acknowledge(self, packet_id: int) -> list[Op]:
        """PUBACK from the client (or Accepted on an AMQP delivery of QoS 1)."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 1:
            return _NO_OPS
        return self._finish(entry)

    def received(self, packet_id: int) -> list[Op]:
        """PUBREC: the client has the QoS 2 message; answer PUBREL and remember it.

        Once PUBREL is out the PUBLISH must never be sent again, so for a persistent
        session PUBREL waits until the RELEASED state is durable: the entry is held
        and ``pubrel_durable`` sends it after the commit.
        """
        entry = self.inflight.get(packet_id)
        link = self.link
        if entry is None or entry.qos != 2:
            if link is not None:  # unknown id: let the client finish its flow
                link.send_pubrel(packet_id)
            return _NO_OPS
        if entry.state == QueuedState.RELEASED:
            if link is not None and not entry.held:  # a repeated PUBREC
                link.send_pubrel(packet_id)
            return _NO_OPS
        entry.state = QueuedState.RELEASED
        if not self._keeps(entry):
            # (a durable queue's delivery is the queue's to keep, not the session's)
            if link is not None:
                link.send_pubrel(packet_id)
            return _NO_OPS
        entry.held = True
        return [entry.put_op(self.client_id)]

    def pubrel_durable(self, packet_id: int) -> None:
        """The RELEASED state of ``packet_id`` is committed: its PUBREL may go."""
        entry = self.inflight.get(packet_id)
        if entry is not None:
            if entry.held:
                entry.held = False
                if self.link is not None:
                    self.link.send_pubrel(packet_id)
            return
        for queued in self.queue:  # moved back to the queue by a reconnect
            if queued.packet_id == packet_id:
                queued.held = False
                break
        self.pump()

    def completed(self, packet_id: int) -> list[Op]:
        """PUBCOMP: the QoS 2 exchange is over."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            return _NO_OPS
        return self._finish(entry)

    def mark_released(self, packet_id: int) -> list[Op]:
        """AMQP_PUBREL on ``$mqtt.<id>.pubrel``: the PUBREC state change of ``received``
        without sending the release; the caller sends it after the commit."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 2 or entry.state == QueuedState.RELEASED:
            return _NO_OPS
        entry.state = QueuedState.RELEASED
        if self._keeps(entry):
            return [entry.put_op(self.client_id)]
        return _NO_OPS

    def redeliver(self, packet_id: int, increment: bool) -> None:
        """AMQP Released/Modified: put the entry back at the head, to be sent again."""
        entry = self.inflight.pop(packet_id, None)
        if entry is None:
            return
        entry.state = QueuedState.QUEUED
        entry.dup = entry.dup or increment
        if increment:
            entry.failures += 1
        if self.queue is _NO_QUEUE:
            self.queue = deque()
        self.queue.appendleft(entry)
        self.queued_bytes += len(entry.message.payload)
        self.pump()

    def _finish(self, entry: OutEntry) -> list[Op]:
        del self.inflight[entry.packet_id]
        self._pids.discard(entry.packet_id)
        self.delivered += 1
        self.stalled = False
        done = entry.on_done
        if done is not None:
            entry.on_done = None
            done()
        receipt = entry.receipt
        if receipt is not None:
            receipt.acknowledged()
        self.pump()
        if self._keeps(entry):
            return [DeleteQueued(self.client_id, entry.seq)]
        return _NO_OPS

    def drop(self, packet_id: int) -> list[Op]:
        """Remove an in-flight entry without delivery (AMQP Rejected); counted."""
        entry = self.inflight.get(packet_id)
        if entry is None:
            return _NO_OPS
        self.dropped += 1
        self.delivered -= 1
        return self._finish(entry)

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
            if self.queue is _NO_QUEUE:
                self.queue = deque()
            for entry in reversed(list(self.inflight.values())):
                entry.dup = True
                self.queue.appendleft(entry)
                self.queued_bytes += len(entry.message.payload)
            self.inflight.clear()
        self.pump()

    def detach(self) -> None:
        self._enter("detach", None)

    # -- inbound QoS 2 --------------------------------------------------------

    def inbound_seen(self, packet_id: int) -> bool:
        return packet_id in self.inbound_qos2

    def inbound_add(self, packet_id: int) -> list[Op]:
        if self.inbound_qos2 is _NO_IDS:
            self.inbound_qos2 = set()
        self.inbound_qos2.add(packet_id)
        if self.persistent:
            return [PutInboundQos2(self.client_id, packet_id)]
        return _NO_OPS

    def inbound_release(self, packet_id: int) -> list[Op]:
        if packet_id not in self.inbound_qos2:
            return _NO_OPS
        self.inbound_qos2.discard(packet_id)
        if self.persistent:
            return [DeleteInboundQos2(self.client_id, packet_id)]
        return _NO_OPS

    def clear_messages(self) -> None:
        self.queue.clear()
        self.inflight.clear()
        self._pids.clear()
        self.queued_bytes = 0
        self.inbound_qos2.clear()

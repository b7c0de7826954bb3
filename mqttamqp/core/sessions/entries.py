"""What a session is made of, apart from the session itself: its outbound entries
(``OutEntry``), what it needs of whatever is attached to it (``ClientLink``), of the
shared group an entry came through (``Share``), and the shared empty stand-ins a
session holds until it first queues, sends or subscribes (most idle clients never
do: an empty deque, set or dict per session would cost hundreds of bytes each).

What it must not do: decide anything (``session.Session`` and its in-flight window,
``window.InflightWindow``, do).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, MutableSet
from typing import Final, Protocol, cast

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, PutQueued, QueuedState, StoredQueued
from mqttamqp.native import build, mypyc_attr, trait

__all__ = ["ClientLink", "NativeLink", "DeliveryReceipt", "EntryQueue", "OutEntry", "Share",
           "NO_OPS", "NEVER", "NO_OPTIONS", "NO_EXPIRED", "NO_QUEUE", "NO_IDS", "NO_INFLIGHT",
           "NO_SUBSCRIPTIONS", "NO_SUBSCRIPTION_IDS", "NATIVE_CALLS"]


class Share(Protocol):
    """The shared subscription group an entry came through, as a session carries it
    (``routing.shared.SharedGroup``: the router reads it back; sessions only keep it)."""

    @property
    def key(self) -> str: ...


class ClientLink(Protocol):
    """What a session needs from whatever is attached to it (MQTT or AMQP)."""

    @property
    def congested(self) -> bool:
        """True while the peer cannot take more (full socket buffer, no credit)."""

    @property
    def backlog_bytes(self) -> int:
        """Bytes written since the link became congested (0 when it is not)."""

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        """Send one delivery.  ``subscription_ids``: the MQTT 5 subscription
        identifiers of the filters it matched, found by the router when it routed
        the message (passed only when there are some: a link that has no use for
        them may leave the parameter out, but sessions move between protocols, so
        every link takes it)."""

    def send_pubrel(self, packet_id: int) -> None:
        ...

    def close(self, reason: str) -> None:
        """Broker-initiated close; the link must not call back into the broker."""


#: The compiled build calls a ``NativeLink``'s ``send_publish`` natively
#: (``Session.deliver``, ``InflightWindow.pump``); the pure build skips the
#: ``isinstance`` that costs it more than the call saves.
NATIVE_CALLS: Final[bool] = build() == "compiled"


@trait
@mypyc_attr(allow_interpreted_subclasses=True)
class NativeLink:
    """A ``ClientLink`` compiled with the core (MQTT's ``mqtt.protocol.MQTTProtocol``,
    AMQP 1.0's ``amqp.subscribers._SessionLink``): in the compiled build
    ``Session.deliver`` calls its ``send_publish`` through mypyc's vtable, where a
    call through the ``ClientLink`` protocol is a lookup by name and the method's
    argument parsing (~330 instructions a delivery).  A link that is not one (AMQP
    0.9.1, the gateway, the console's tail) is called as before.  In pure Python a
    mixin without slots or state.  ``congested`` is not part of it: the core reads it
    by name, because a subclass may make it a property (a durable queue's AMQP link
    counts its credit: ``amqp.queuelinks.QueueSubscription``), which a native read of
    the attribute would bypass."""

    __slots__ = ()

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        raise NotImplementedError


class DeliveryReceipt(Protocol):
    """A durable queue's handle on one of its deliveries (``OutEntry.receipt``).

    The session tells it when the client acknowledged the delivery (PUBACK, PUBCOMP,
    AMQP Accepted); the broker tells it the other AMQP outcomes.  The queue keeps
    the message durably, so a session never stores nor holds an entry that has a
    receipt, and the queue never touches the entry's fields."""

    def acknowledged(self) -> None:
        """The client acknowledged the delivery (the session calls it once)."""

    def settled(self, entry: OutEntry, outcome: str, failed: bool,
                reason: str | None) -> None:
        """An AMQP outcome other than Accepted on ``entry``, this receipt's delivery:
        ``released``, ``modified`` (``failed``: delivery-failed) or ``rejected``
        (with ``reason``)."""


class OutEntry:
    """One outbound QoS 1/2 message of a session, queued or in flight."""

    __slots__ = ("dup", "failures", "gated", "held", "message", "on_done", "packet_id",
                 "qos", "receipt", "retain", "seq", "share", "state", "subscription_ids")

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
        # member when this one goes away: ``SharedGroups.member_left``).
        self.share: Share | None = None
        # A durable queue's delivery: the queue's receipt for it.  The queue holds
        # it durably, so the session never stores it (``core.queues``).
        self.receipt: DeliveryReceipt | None = None
        # MQTT 5: the subscription identifiers of the filters it matched, found when
        # it was routed, and stored with it (``stored``): every send of it, before or
        # after a restart, carries these (MQTT 5 §3.3.4).
        self.subscription_ids: tuple[int, ...] = ()

    def stored(self) -> StoredQueued:
        return StoredQueued(self.message.with_retain(self.retain), self.qos, self.state,
                            self.packet_id, self.subscription_ids)

    def put_op(self, client_id: str, first: bool = False, online: bool = False
               ) -> PutQueued:
        """The store operation that records this entry for session ``client_id``
        (``first``: the entry was just made, ``PutQueued.first``; ``online``: and sent
        at once to an online subscriber, ``PutQueued.online``)."""
        # (``stored`` inlined: one per QoS 1/2 delivery to a persistent session)
        message = self.message
        if message.retain != self.retain:
            message = message.with_retain(self.retain)
        return PutQueued(client_id, self.seq, StoredQueued(
            message, self.qos, self.state, self.packet_id, self.subscription_ids), first, online)


NO_OPS: Final[list[Op]] = []
# A delivery without MQTT 5 subscription identifiers (every MQTT 3.1.1 and AMQP one).
NO_SUBSCRIPTION_IDS: Final[tuple[int, ...]] = ()


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
class EntryQueue(deque["OutEntry"]):
    """A session's queue once a message with an MQTT 5 message expiry was queued in
    it (AMQP 1.0 ``ttl`` and 0.9.1 ``expiration`` too), with the earliest moment one
    of its not yet sent entries expires (``next_expiry``): the queue bound purges
    expired entries only once it has passed, rather than scanning at every drop.  A
    session that never queued such a message keeps a plain ``deque``: the
    specialised calls of C methods (``append``, ``popleft``) take a slower path on a
    subclass, about 28 ns a QoS 1/2 delivery; nor does the session keep a slot for
    it (it is 240 bytes, pymalloc's 240-byte class)."""

    __slots__ = ("next_expiry",)

    def __init__(self, entries: Iterable[OutEntry] = ()) -> None:
        super().__init__(entries)
        self.next_expiry = NEVER


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
class NoEntries(tuple):  # type: ignore[type-arg]
    """Every session's queue until its first entry (an empty deque is 760 bytes, a
    session each; most sessions of idle clients never queue anything).  Reads
    work; what would add swaps in a deque first."""

    __slots__ = ()

    def remove(self, entry: object) -> None:
        raise ValueError("not queued")

    def clear(self) -> None:
        pass


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
class NoIds(frozenset):  # type: ignore[type-arg]
    """An empty id set shared until the first id (an empty set is 216 bytes)."""

    __slots__ = ()

    def discard(self, item: object) -> None:
        pass

    def clear(self) -> None:
        pass


class EmptyMap(dict):  # type: ignore[type-arg]
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


NEVER: Final = float("inf")   # (``EntryQueue.next_expiry`` with nothing to expire)

# Shared empty stand-ins, replaced on first use (read-only until then):
NO_OPTIONS: Final[dict[str, int]] = {}
NO_EXPIRED: Final[list[Op]] = []
NO_QUEUE: Final = cast("deque[OutEntry]", NoEntries())
# (``NO_IDS`` is typed a ``MutableSet``, not a ``set``: a build compiled with mypyc
# checks that a value typed ``set`` is one; the frozenset is not)
NO_IDS: Final = cast("MutableSet[int]", NoIds())
NO_INFLIGHT: Final = cast("dict[int, OutEntry]", EmptyMap())
NO_SUBSCRIPTIONS: Final = cast("dict[str, int]", EmptyMap())

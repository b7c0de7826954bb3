"""The contract between the in-memory core and durable storage.

The core holds authoritative state in memory and describes every durable change as
a small immutable *operation*.  A ``StateStore`` applies batches of operations in
order and fires the returned Deferred (on the reactor thread) once the commit that
holds them is durable.  Acknowledgements that promise durability are sent from that
callback.  At start-up ``load()`` returns a ``Snapshot`` that rebuilds the core.

This module must not import ZODB or run Twisted (``Deferred`` appears in the
contract's types only); ``mqttamqp.store`` implements it, and the tests' stores
are in ``tests/support/fakes.py``.

The operations built per message or delivery (queued entries, retained messages,
inbound QoS 2 ids, queue messages, trims, done offsets, group states) and on the
connect path (sessions, subscriptions, wills) are ``@final_record``: native classes
in the compiled build (``mqttamqp.records``).  The cold ones (bans, the creation
and deletion of queues and groups, exchanges, bindings, queue arguments) are
``@record``: interpreted dataclasses there, read by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Final, Protocol

from mqttamqp.core.message import Message, WillMessage
from mqttamqp.records import final_record, record

if TYPE_CHECKING:  # the contract names Twisted's Deferred; nothing here runs Twisted
    from twisted.internet.defer import Deferred

__all__ = [
    "PutRetained", "DeleteRetained", "ClearRetained", "PutWill", "DeleteWill",
    "PutSession", "DeleteSession", "PutSubscription", "DeleteSubscription",
    "PutQueued", "DeleteQueued", "PutInboundQos2", "DeleteInboundQos2", "PutBan",
    "DeleteBan", "PutQueue", "DeleteQueue", "PutQueueMessage", "DeleteQueueMessage",
    "TrimQueue", "QueueDone", "PutQueueGroup", "DeleteQueueGroup", "QueueGroupRecord",
    "QueueRecord", "PutExchange", "DeleteExchange", "PutBinding", "DeleteBinding",
    "PutQueueArguments", "Op",
    "QueuedState", "StoredQueued", "SessionRecord", "Snapshot", "StateStore",
]


class QueuedState:
    """Where an outbound QoS 1/2 message of a persistent session stands."""

    QUEUED: Final = "queued"      # not yet sent on the current connection
    SENT: Final = "sent"          # PUBLISH sent, waiting for PUBACK / PUBREC
    RELEASED: Final = "released"  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP


@final_record
class StoredQueued:
    message: Final[Message]
    qos: Final[int]  # delivery QoS (min(publish, granted))
    state: Final[str]
    packet_id: Final[int | None]
    # MQTT 5: the subscription identifiers found when it was routed (MQTT 5 §3.3.4:
    # those of the subscriptions it was published as a result of), so a redelivery
    # carries the same ones whether or not the broker restarted.  None: a record
    # stored before they were kept (found again from the subscriptions at restore).
    subscription_ids: Final[tuple[int, ...] | None]

    def __init__(self, message: Message, qos: int, state: str = QueuedState.QUEUED,
                 packet_id: int | None = None,
                 subscription_ids: tuple[int, ...] | None = ()) -> None:
        self.message = message
        self.qos = qos
        self.state = state
        self.packet_id = packet_id
        self.subscription_ids = subscription_ids


@final_record
class PutRetained:
    message: Final[Message]

    def __init__(self, message: Message) -> None:
        self.message = message


@final_record
class DeleteRetained:
    topic: Final[str]

    def __init__(self, topic: str) -> None:
        self.topic = topic


@record
class ClearRetained:
    """Delete every retained message (used by the console's delete-all)."""


@final_record
class PutWill:
    will: Final[WillMessage]

    def __init__(self, will: WillMessage) -> None:
        self.will = will


@final_record
class DeleteWill:
    owner: Final[str]

    def __init__(self, owner: str) -> None:
        self.owner = owner


@final_record
class PutSession:
    """Create the persistent session if missing and record when it was last seen
    (and, when given, the user that owns it)."""

    client_id: Final[str]
    last_seen: Final[float]
    owner: Final[str | None]
    expiry: Final[float | None]  # MQTT 5 session expiry interval (None: --session-expiry)

    def __init__(self, client_id: str, last_seen: float, owner: str | None = None,
                 expiry: float | None = None) -> None:
        self.client_id = client_id
        self.last_seen = last_seen
        self.owner = owner
        self.expiry = expiry


@final_record
class DeleteSession:
    client_id: Final[str]

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id


@final_record
class PutSubscription:
    client_id: Final[str]
    topic_filter: Final[str]
    qos: Final[int]

    def __init__(self, client_id: str, topic_filter: str, qos: int) -> None:
        self.client_id = client_id
        self.topic_filter = topic_filter
        self.qos = qos


@final_record
class DeleteSubscription:
    client_id: Final[str]
    topic_filter: Final[str]

    def __init__(self, client_id: str, topic_filter: str) -> None:
        self.client_id = client_id
        self.topic_filter = topic_filter


@final_record
class PutQueued:
    """Insert or replace the queue entry ``seq`` of a persistent session.

    ``first``: the entry's first put (its ``seq`` is new, so nothing of it was
    stored before): a ``DeleteQueued`` of it in the same commit has nothing to
    remove either, and the writer skips both.  ``online``: a first put of a QoS 1
    entry sent at once to its online subscriber, whose acknowledgement usually comes
    within milliseconds, and of a publish that stores nothing else (no will, packet
    id or retained message; not in a transaction, not gated): the writer may hold it
    over ``store.applying.HOLD_ROUNDS`` commits (``split_held``: its submit and
    every later one wait whole for a later commit), and what waits on its commit
    (the publisher's PUBACK, unless every delivery was acknowledged first) waits
    until it is written or its delete cancels it.  Neither is part of the op's
    equality.
    """

    client_id: Final[str]
    seq: Final[int]
    entry: Final[StoredQueued]
    first: Final[bool]
    online: Final[bool]
    _uncompared: ClassVar[tuple[str, ...]] = ("first", "online")

    def __init__(self, client_id: str, seq: int, entry: StoredQueued, first: bool = False,
                 online: bool = False) -> None:
        self.client_id = client_id
        self.seq = seq
        self.entry = entry
        self.first = first
        self.online = online


@final_record
class DeleteQueued:
    client_id: Final[str]
    seq: Final[int]

    def __init__(self, client_id: str, seq: int) -> None:
        self.client_id = client_id
        self.seq = seq


@final_record
class PutInboundQos2:
    client_id: Final[str]
    packet_id: Final[int]

    def __init__(self, client_id: str, packet_id: int) -> None:
        self.client_id = client_id
        self.packet_id = packet_id


@final_record
class DeleteInboundQos2:
    client_id: Final[str]
    packet_id: Final[int]

    def __init__(self, client_id: str, packet_id: int) -> None:
        self.client_id = client_id
        self.packet_id = packet_id


@record
class PutBan:
    """A ban (``mqttamqp.security.bans``): who may not connect, until when, and why."""

    kind: str  # "client_id", "user" or "address"
    value: str
    until: float | None  # None: for good
    reason: str
    created: float
    by: str  # the console user who set it


@record
class DeleteBan:
    kind: str
    value: str


# -- durable queues (``mqttamqp.core.queues.manager``) -------------------------------------


@record
class PutQueue:
    """Create queue ``name`` if missing; set its retention (max age seconds, max
    bytes, max messages; None: no bound of that kind) and, as a fourth field when
    it has them, its priority levels (``Retention.as_tuple``)."""

    name: str
    retention: tuple[float | int | None, ...]


@record
class DeleteQueue:
    name: str


@final_record
class PutQueueMessage:
    queue: Final[str]
    offset: Final[int]
    message: Final[Message]

    def __init__(self, queue: str, offset: int, message: Message) -> None:
        self.queue = queue
        self.offset = offset
        self.message = message


@final_record
class DeleteQueueMessage:
    queue: Final[str]
    offset: Final[int]

    def __init__(self, queue: str, offset: int) -> None:
        self.queue = queue
        self.offset = offset


@final_record
class TrimQueue:
    """Delete every message of ``queue`` below ``upto`` (which becomes its head)."""

    queue: Final[str]
    upto: Final[int]

    def __init__(self, queue: str, upto: int) -> None:
        self.queue = queue
        self.upto = upto


@final_record
class QueueDone:
    """``offsets`` of ``queue`` are done for classic group ``group`` (acknowledged,
    dead-lettered, or not for it); the store advances the group's floor over them."""

    queue: Final[str]
    group: Final[str]
    offsets: Final[tuple[int, ...]]

    def __init__(self, queue: str, group: str, offsets: tuple[int, ...]) -> None:
        self.queue = queue
        self.group = group
        self.offsets = offsets


@final_record
class QueueGroupRecord:
    """A consumer group's durable state but its done offsets (``QueueDone``).

    Classic: offsets below ``floor`` are done, ``done`` those done above it (filled
    by ``load()``; a store takes the highest floor it was given or derived),
    ``counts`` deliveries made (only counts above 1), ``watermark`` an offset at or
    above every dispatched one; a priority queue's group also ``levels``, (level,
    offset) pairs each at or above every offset of that level dispatched (a level
    hands out in offset order: below its mark, every offset of it may have gone
    out, above none; () for a group without levels or a record from before them).
    Stream: ``cursor``, the next offset to read.
    ``members``: client id -> granted QoS | 4 if it acknowledges explicitly, for
    persistent sessions (they are members again when they come back)."""

    name: Final[str]
    filter: Final[str]
    mode: Final[str]
    floor: Final[int]
    watermark: Final[int]
    done: Final[tuple[int, ...]]
    counts: Final[tuple[tuple[int, int], ...]]
    members: Final[tuple[tuple[str, int], ...]]
    cursor: Final[int]
    levels: Final[tuple[tuple[int, int], ...]]

    def __init__(self, name: str, filter: str, mode: str, floor: int, watermark: int,
                 done: tuple[int, ...] = (), counts: tuple[tuple[int, int], ...] = (),
                 members: tuple[tuple[str, int], ...] = (), cursor: int = 0,
                 levels: tuple[tuple[int, int], ...] = ()) -> None:
        self.name = name
        self.filter = filter
        self.mode = mode
        self.floor = floor
        self.watermark = watermark
        self.done = done
        self.counts = counts
        self.members = members
        self.cursor = cursor
        self.levels = levels


@final_record
class PutQueueGroup:
    queue: Final[str]
    group: Final[str]
    state: Final[QueueGroupRecord]

    def __init__(self, queue: str, group: str, state: QueueGroupRecord) -> None:
        self.queue = queue
        self.group = group
        self.state = state


@record
class DeleteQueueGroup:
    queue: str
    group: str


# -- AMQP 0.9.1's model (``mqttamqp.core.exchanges``) ----------------------------------
# Arguments are field tables frozen to sorted (key, value) pairs of primitives
# (``exchanges.queuedecl.freeze``).


@record
class PutExchange:
    """A durable exchange as declared (created or replaced)."""

    name: str
    kind: str
    auto_delete: bool = False
    internal: bool = False
    arguments: tuple[tuple[str, object], ...] = ()


@record
class DeleteExchange:
    name: str


@record
class _Binding:
    """A binding between two durable ends: ``source`` exchange to ``destination``
    (a queue, or an exchange when ``to_exchange``)."""

    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: tuple[tuple[str, object], ...] = ()


@record
class PutBinding(_Binding):
    """Store the binding (``_Binding``'s fields)."""


@record
class DeleteBinding(_Binding):
    """Delete the binding (``_Binding``'s fields; not a ``PutBinding``: the stores
    dispatch on the class)."""


@record
class PutQueueArguments:
    """What AMQP 0.9.1 declared durable queue ``name`` with (its arguments); the
    queue is created if missing (as ``PutQueue`` does)."""

    name: str
    arguments: tuple[tuple[str, object], ...] = ()


Op = (
    PutRetained | DeleteRetained | ClearRetained | PutWill | DeleteWill | PutSession
    | DeleteSession | PutSubscription | DeleteSubscription | PutQueued | DeleteQueued
    | PutInboundQos2 | DeleteInboundQos2 | PutBan | DeleteBan
    | PutQueue | DeleteQueue | PutQueueMessage | DeleteQueueMessage | TrimQueue
    | QueueDone | PutQueueGroup | DeleteQueueGroup
    | PutExchange | DeleteExchange | PutBinding | DeleteBinding | PutQueueArguments
)


@dataclass
class SessionRecord:
    client_id: str
    last_seen: float = 0.0
    subscriptions: dict[str, int] = field(default_factory=dict)
    queue: list[tuple[int, StoredQueued]] = field(default_factory=list)  # ascending seq
    inbound_qos2: set[int] = field(default_factory=set)
    owner: str | None = None
    expiry: float | None = None


@dataclass
class QueueRecord:
    name: str
    retention: tuple[float | int | None, ...] | None = None
    head: int = 0
    messages: list[tuple[int, Message]] = field(default_factory=list)  # ascending offset
    next_offset: int = 0   # at least this (messages deleted at the end leave no trace)
    groups: dict[str, QueueGroupRecord] = field(default_factory=dict)
    # Messages loaded without their body (over the queue memory budget): offset ->
    # (payload bytes, body bytes); ``messages`` holds them with an empty payload
    # and no AMQP form, and ``StateStore.read_queue_messages`` reads them whole.
    evicted: dict[int, tuple[int, int]] = field(default_factory=dict)
    # AMQP 0.9.1 declared it with these arguments (None: not declared by 0.9.1).
    arguments: tuple[tuple[str, object], ...] | None = None


@dataclass
class Snapshot:
    retained: dict[str, Message] = field(default_factory=dict)
    wills: dict[str, WillMessage] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    bans: list[PutBan] = field(default_factory=list)
    queues: list[QueueRecord] = field(default_factory=list)
    exchanges: list[PutExchange] = field(default_factory=list)
    bindings: list[PutBinding] = field(default_factory=list)


class StateStore(Protocol):
    def load(self) -> Snapshot:
        """Read the whole durable state (called once, before serving).  A store may
        leave queue bodies past a memory budget in storage (``QueueRecord.evicted``)."""

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        """Apply ``ops`` in order after everything submitted before; fire when durable."""

    def read_queue_messages(self, name: str, offsets: Sequence[int]
                            ) -> Deferred[list[tuple[int, Message]]]:
        """The stored messages of queue ``name`` at ``offsets`` (those it has), in
        ascending offset, as of everything committed so far; read off the reactor
        thread, fired on it.  (The queue memory budget reads evicted bodies back.)"""

    def pack(self) -> Deferred[None]:
        """Reclaim space from old revisions, off the reactor thread."""

    def close(self) -> None:
        """Flush what was submitted and close the storage."""

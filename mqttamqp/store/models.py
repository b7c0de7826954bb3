"""The on-disk model of the ZODB store: persistent classes and record codecs.

This module owns the layout of the ZODB root and the exact shape of every stored
record.  Messages, wills and queue entries are stored as plain tuples of primitives
(str, bytes, int, float, bool, None), never as pickles of our dataclasses, so that
renaming or moving ``mqttamqp.core`` classes can never make an old file unreadable.
The only classes of ours that are pickled are ``PersistentSession``, ``QueueTree``
and ``RetainedTree``; their module path and names are part of the file format and
must not change.

Records sit inline in BTree buckets, so every change rewrites the whole bucket it
lies in.  ``QueueTree`` and ``RetainedTree`` are plain BTrees with small buckets
(4-8 entries instead of 30-60/15-30): with 1 KB payloads a single queue append
writes about 8 KB instead of about 46 KB, and pickling (which costs per contained
object) is that much cheaper too.

Root layout (``SCHEMA_VERSION`` 1)::

    root["schema_version"] -> int
    root["retained"]       -> RetainedTree (OOBTree) topic -> message record
    root["wills"]          -> OOBTree   owner     -> will record
    root["sessions"]       -> OOBTree   client_id -> PersistentSession
    root["bans"]           -> OOBTree   (kind, value) -> ban record (added later in
                              schema 1: created on open when missing, old files load)
    root["queues"]         -> OOBTree   name -> PersistentQueue (added later in schema
                              1, like "bans")
    root["exchanges"]      -> OOBTree   name -> exchange record (AMQP 0.9.1's durable
                              exchanges; added later in schema 1, like "bans")
    root["bindings"]       -> OOBTree   binding key -> binding record (between durable
                              ends; likewise)
    PersistentSession.queue -> QueueTree (LOBTree) seq -> queued record
    PersistentQueue.log    -> QueueTree offset -> message record
    PersistentQueue.groups -> OOBTree group id -> group record
    PersistentQueue.done   -> OOBTree group id -> LLTreeSet of offsets done above
                              the group's floor

    message record: (topic, payload, qos, retain, publisher, timestamp, dup)
                    + (native, amqp_only) for a retained message from an AMQP sender
                    + (MQTT 5 properties or None) + (AMQP 0.9.1 basic properties)
                    + (the publisher's priority: 12 fields, only when it gave one
                    and the record is a durable queue's or retained; a record
                    without it takes it from its native header or 0.9.1
                    properties, as it was stored before the twelfth field)
    will record:    (owner, topic, payload, qos, retain, origin, created)
    queued record:  (message record, qos, state, packet_id, subscription ids)
                    (4 fields: stored before the MQTT 5 identifiers were kept)
    ban record:     (kind, value, until or None, reason, created, by)
    group record:   (name, filter, mode, floor, watermark, done, counts, members, cursor)
                    (tuples of ints / (int, int) / (str, int) pairs)
                    + (levels: (level, watermark) pairs) for a priority queue's group
                    that has dispatched (9 fields otherwise, and before them)
    exchange record: (name, kind, auto_delete, internal, arguments)
    binding key:    (source, destination, to_exchange, routing_key, repr(arguments))
    binding record: (source, destination, to_exchange, routing_key, arguments)
    arguments:      AMQP 0.9.1 field tables as sorted (key, value) pairs of primitives
                    and nested tuples (``core.exchanges.queuedecl.freeze``)
    PersistentQueue.arguments: what 0.9.1 declared the queue with (None: not)

This module must not open databases, start threads or talk to the reactor; it only
defines data and pure conversions.  ``zodbstore`` does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from BTrees.IIBTree import IITreeSet
from BTrees.LLBTree import LLTreeSet
from BTrees.LOBTree import LOBTree
from BTrees.OOBTree import OOBTree
from persistent import Persistent

from mqttamqp.core.message import Message, MessageProperties, WillMessage, body_size, stub
from mqttamqp.core.persistence import (
    DeleteBinding,
    PutBan,
    PutBinding,
    PutExchange,
    QueueGroupRecord,
    QueueRecord,
    SessionRecord,
    Snapshot,
    StoredQueued,
)
from mqttamqp.store import prefetch

__all__ = [
    "root_to_snapshot",
    "exchange_to_record", "record_to_exchange", "binding_key", "binding_to_record",
    "record_to_binding",
    "SCHEMA_VERSION",
    "BanRecord",
    "MessageRecord",
    "PersistentQueue",
    "PersistentSession",
    "QueueTree",
    "QueuedRecord",
    "RetainedTree",
    "SchemaError",
    "WillRecord",
    "ban_to_record",
    "init_root",
    "message_to_record",
    "queued_to_record",
    "advance_floor",
    "group_to_record",
    "new_done_set",
    "queue_to_record",
    "record_to_ban",
    "record_to_group",
    "record_to_message",
    "record_to_queued",
    "record_to_will",
    "session_to_record",
    "will_to_record",
]

SCHEMA_VERSION = 1

# Plain tuples (no classes of ours in the file): 7 fields, 9 with the AMQP form,
# 10 with MQTT 5 properties; a will has 7, or 9 with properties and delay.
MessageRecord = tuple[Any, ...]
WillRecord = tuple[Any, ...]
# A queued record: (message, qos, state, packet id, subscription ids); 4 fields in a
# record stored before the MQTT 5 subscription identifiers were kept.
QueuedRecord = tuple[Any, ...]


class QueueTree(LOBTree):  # type: ignore[misc]
    """A session queue: seq -> queued record, in small buckets (see module doc)."""

    max_leaf_size = 8
    max_internal_size = 64


class RetainedTree(OOBTree):  # type: ignore[misc]
    """Retained messages: topic -> message record, in small buckets."""

    max_leaf_size = 8
    max_internal_size = 64


class SchemaError(RuntimeError):
    """The file was written by a newer (or unknown) schema version."""


class PersistentSession(Persistent):  # type: ignore[misc]
    """A persistent MQTT session: the only pickled class of ours.

    Attributes (add new ones only with a class-level default, so old pickles load):
    ``client_id`` str, ``last_seen`` float, ``subscriptions`` OOBTree filter -> qos,
    ``queue`` QueueTree seq -> queued record, ``inbound_qos2`` IITreeSet of packet ids,
    ``owner`` str or None (the user that created it).
    """

    client_id: str
    last_seen: float = 0.0
    owner: str | None = None      # the user that created it (None: anonymous)
    expiry: float | None = None     # MQTT 5 session expiry interval (added later)
    subscriptions: Any
    queue: Any
    inbound_qos2: Any

    def __init__(self, client_id: str, last_seen: float = 0.0) -> None:
        self.client_id = client_id
        self.last_seen = last_seen
        self.subscriptions = OOBTree()
        self.queue = QueueTree()
        self.inbound_qos2 = IITreeSet()


class PersistentQueue(Persistent):  # type: ignore[misc]
    """A durable queue (``mqttamqp.core.queues.manager``): pickled, so its module path and
    name are part of the file format.  ``retention`` (max age, max bytes, max
    messages, and a fourth, max priority, only for a queue with levels: three
    fields were stored before priorities and still read), ``head`` (every offset
    below it was deleted), ``log`` QueueTree offset -> message record, ``groups``
    OOBTree group id -> group record, ``done`` OOBTree group id -> LLTreeSet of the
    offsets done above that group's floor."""

    name: str
    retention: Any = None
    head: int = 0
    tail: int = 0      # above every offset deleted one by one (DeleteQueueMessage)
    log: Any
    groups: Any
    done: Any
    arguments: Any = None   # AMQP 0.9.1's declared arguments (None: not declared so)

    def __init__(self, name: str) -> None:
        self.name = name
        self.log = QueueTree()
        self.groups = OOBTree()
        self.done = OOBTree()


def init_root(root: Any) -> bool:
    """Create missing root entries; return True if anything was written.

    Raises ``SchemaError`` for a file of a newer schema than this code knows.
    """
    version = root.get("schema_version")
    if version is not None and (not isinstance(version, int) or version > SCHEMA_VERSION):
        raise SchemaError(
            f"store schema version {version!r} is newer than supported {SCHEMA_VERSION}"
        )
    changed = False
    for key, factory in (("retained", RetainedTree), ("wills", OOBTree), ("sessions", OOBTree),
                         ("bans", OOBTree), ("queues", OOBTree), ("exchanges", OOBTree),
                         ("bindings", OOBTree)):
        if key not in root:
            root[key] = factory()
            changed = True
    if version != SCHEMA_VERSION:
        root["schema_version"] = SCHEMA_VERSION
        changed = True
    return changed


def _bytes(payload: Any) -> bytes:
    return payload if type(payload) is bytes else bytes(payload)


def _props_to_record(p: MessageProperties) -> tuple[Any, ...]:
    return (p.payload_format, p.expiry_interval, p.content_type, p.response_topic,
            p.correlation_data, tuple((str(k), str(v)) for k, v in p.user_properties))


def _record_to_props(r: Any) -> MessageProperties:
    payload_format, expiry, content_type, response_topic, correlation, users = r
    return MessageProperties(payload_format, expiry, content_type, response_topic,
                             correlation, tuple((k, v) for k, v in users))


def message_to_record(m: Message, native: bool = True) -> MessageRecord:
    record: MessageRecord = (
        str(m.topic), _bytes(m.payload), int(m.qos), bool(m.retain),
        None if m.publisher is None else str(m.publisher), float(m.timestamp), bool(m.dup),
    )
    keep_native = native and m.native is not None
    # (a session's queued record, ``native`` False, keeps no priority: only a
    # durable queue's order needs it, and persistent MQTT sessions' records stay
    # 7 fields)
    priority = m.priority if native else None
    if (not keep_native and m.props is None and m.amqp091 is None
            and priority is None):
        return record
    # A message from an AMQP sender also keeps its AMQP form (a retained message is
    # sent to AMQP receivers as it was sent, after a restart too).
    record = (*record, _bytes(m.native) if keep_native and m.native is not None else None,
              bool(m.amqp_only) if keep_native else False)
    props = None if m.props is None else _props_to_record(m.props)
    if priority is not None:
        # The publisher's priority: a twelfth field (a priority queue's order is
        # rebuilt from it at a restart).
        return (*record, props, None if m.amqp091 is None else _bytes(m.amqp091),
                int(priority))
    if m.amqp091 is None:
        if props is None:
            return record
        # MQTT 5 properties ride as a tenth field (older records have 7 or 9).
        return (*record, props)
    # An AMQP 0.9.1 publisher's basic properties as sent: an eleventh.
    return (*record, props, _bytes(m.amqp091))


def record_to_message(r: Any) -> Message:
    if len(r) == 7:
        topic, payload, qos, retain, publisher, timestamp, dup = r
        return Message(topic, payload, qos, retain, publisher, timestamp, dup)
    if len(r) == 9:
        topic, payload, qos, retain, publisher, timestamp, dup, native, amqp_only = r
        return Message(topic, payload, qos, retain, publisher, timestamp, dup, native,
                       amqp_only, priority=_stored_priority(native, None))
    if len(r) == 10:
        topic, payload, qos, retain, publisher, timestamp, dup, native, amqp_only, props = r
        return Message(topic, payload, qos, retain, publisher, timestamp, dup, native,
                       amqp_only, _record_to_props(props),
                       priority=_stored_priority(native, None))
    (topic, payload, qos, retain, publisher, timestamp, dup, native, amqp_only, props,
     amqp091) = r[:11]
    return Message(topic, payload, qos, retain, publisher, timestamp, dup, native, amqp_only,
                   None if props is None else _record_to_props(props), amqp091,
                   r[11] if len(r) > 11 else _stored_priority(native, amqp091))


# AMQP 0.9.1 basic properties' flags before priority, and priority's own.
_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS, _DELIVERY_MODE, _PRIORITY = (
    0x8000, 0x4000, 0x2000, 0x1000, 0x0800)


def _stored_priority(native: bytes | None, amqp091: bytes | None) -> int | None:
    """The publisher's priority of a record stored without the twelfth field: the
    AMQP 1.0 header's as kept in the native form's first bytes (flag 2 or 3, then
    the priority), or the 0.9.1 basic property ``priority`` in the property
    section as sent (after the exchange and routing key of ``Message.amqp091``).
    None when neither says (or cannot be read: a record is never refused for it)."""
    try:
        if native and native[0] & 2:
            return int(native[1])
        if amqp091:
            at = 1 + amqp091[0]               # (the exchange)
            at += 1 + amqp091[at]             # (the routing key)
            flags = int.from_bytes(amqp091[at:at + 2], "big")
            if not flags & _PRIORITY:
                return None
            at += 2
            for bit in (_CONTENT_TYPE, _CONTENT_ENCODING):
                if flags & bit:
                    at += 1 + amqp091[at]
            if flags & _HEADERS:
                at += 4 + int.from_bytes(amqp091[at:at + 4], "big")
            if flags & _DELIVERY_MODE:
                at += 1
            return int(amqp091[at])
    except IndexError:
        return None
    return None


def will_to_record(w: WillMessage) -> WillRecord:
    record: WillRecord = (
        str(w.owner), str(w.topic), _bytes(w.payload), int(w.qos), bool(w.retain),
        str(w.origin), float(w.created),
    )
    if w.props is None and not w.delay:
        return record
    return (*record, None if w.props is None else _props_to_record(w.props), float(w.delay))


def record_to_will(r: Any) -> WillMessage:
    if len(r) == 7:
        owner, topic, payload, qos, retain, origin, created = r
        return WillMessage(owner, topic, payload, qos, retain, origin, created)
    owner, topic, payload, qos, retain, origin, created, props, delay = r
    return WillMessage(owner, topic, payload, qos, retain, origin, created,
                       None if props is None else _record_to_props(props), delay)


def queued_to_record(q: StoredQueued) -> QueuedRecord:
    return (
        # Queued for a client id's session: MQTT, or an FE over AMQP, which both
        # take the MQTT payload.
        message_to_record(q.message, native=False), int(q.qos), str(q.state),
        None if q.packet_id is None else int(q.packet_id),
        # (always written, () for none: a 4-field record is an older one, whose
        # identifiers the restore finds again from the subscriptions)
        () if q.subscription_ids is None else tuple(q.subscription_ids),
    )


def record_to_queued(r: Any) -> StoredQueued:
    if len(r) == 4:
        message, qos, state, packet_id = r
        return StoredQueued(record_to_message(message), qos, state, packet_id, None)
    message, qos, state, packet_id, ids = r[:5]
    return StoredQueued(record_to_message(message), qos, state, packet_id, tuple(ids))


BanRecord = tuple[str, str, float | None, str, float, str]


def ban_to_record(b: PutBan) -> BanRecord:
    return (str(b.kind), str(b.value), None if b.until is None else float(b.until),
            str(b.reason), float(b.created), str(b.by))


def record_to_ban(r: Any) -> PutBan:
    kind, value, until, reason, created, by = r
    return PutBan(kind, value, until, reason, created, by)


def session_to_record(s: PersistentSession) -> SessionRecord:
    """Copy a persistent session into plain objects (queue in ascending seq)."""
    return SessionRecord(
        client_id=s.client_id,
        last_seen=s.last_seen,
        subscriptions={str(f): int(q) for f, q in s.subscriptions.items()},
        queue=sorted(
            ((int(seq), record_to_queued(r)) for seq, r in s.queue.items()),
            key=lambda item: item[0],
        ),
        inbound_qos2={int(p) for p in s.inbound_qos2},
        owner=s.owner,
        expiry=s.expiry,
    )


def group_to_record(g: QueueGroupRecord) -> tuple[Any, ...]:
    return (str(g.name), str(g.filter), str(g.mode), int(g.floor), int(g.watermark),
            tuple(int(o) for o in g.done), tuple((int(o), int(c)) for o, c in g.counts),
            tuple((str(c), int(q)) for c, q in g.members), int(g.cursor),
            *((tuple((int(lv), int(m)) for lv, m in g.levels),) if g.levels else ()))


def record_to_group(r: Any, done: Any = ()) -> QueueGroupRecord:
    name, topic_filter, mode, floor, watermark, _, counts, members, cursor = r[:9]
    return QueueGroupRecord(name, topic_filter, mode, floor, watermark,
                            tuple(int(o) for o in done),
                            tuple((o, c) for o, c in counts),
                            tuple((m, q) for m, q in members), cursor,
                            tuple((lv, m) for lv, m in r[9]) if len(r) > 9 else ())


def queue_to_record(q: PersistentQueue, body_budget: int | None = None,
                    every: Callable[[], None] | None = None) -> QueueRecord:
    """Copy a persistent queue into plain objects (messages in ascending offset).

    With ``body_budget`` only the first messages whose bodies (payload and AMQP
    form) fit in it keep them; the others come without (``QueueRecord.evicted``).
    ``every`` is called every 1,000 messages (the store frees its cache there)."""
    messages: list[tuple[int, Message]] = []
    evicted: dict[int, tuple[int, int]] = {}
    used = 0
    full = False   # (the head keeps its bodies: consumers read from there)
    for n, (o, r) in enumerate(q.log.items(), 1):
        message = record_to_message(r)
        offset = int(o)
        if body_budget is not None:
            body = body_size(message)
            if full or used + body > body_budget:
                full = True
                evicted[offset] = (len(message.payload), body)
                message = stub(message)
            else:
                used += body
        messages.append((offset, message))
        if every is not None and n % 1000 == 0:
            every()
    return QueueRecord(
        name=q.name,
        retention=None if q.retention is None else tuple(q.retention),
        head=int(q.head),
        next_offset=int(q.tail),
        messages=messages,
        groups={str(k): record_to_group(r, q.done.get(k, ())) for k, r in q.groups.items()},
        evicted=evicted,
        arguments=None if q.arguments is None else tuple(q.arguments),
    )


def exchange_to_record(e: PutExchange) -> tuple[Any, ...]:
    return (e.name, e.kind, bool(e.auto_delete), bool(e.internal), tuple(e.arguments))


def record_to_exchange(r: Any) -> PutExchange:
    name, kind, auto_delete, internal, arguments = r
    return PutExchange(name, kind, auto_delete, internal, tuple(arguments))


def binding_key(b: PutBinding | DeleteBinding) -> tuple[Any, ...]:
    # (arguments as text: mixed value types would not order in a BTree key)
    return (b.source, b.destination, bool(b.to_exchange), b.routing_key,
            repr(tuple(b.arguments)))


def binding_to_record(b: PutBinding) -> tuple[Any, ...]:
    return (b.source, b.destination, bool(b.to_exchange), b.routing_key,
            tuple(b.arguments))


def record_to_binding(r: Any) -> PutBinding:
    source, destination, to_exchange, routing_key, arguments = r
    return PutBinding(source, destination, to_exchange, routing_key, tuple(arguments))


def advance_floor(record: tuple[Any, ...], done: Any, floor: int) -> tuple[Any, ...]:
    """``record`` with its floor at least ``floor`` and moved over ``done`` (an
    LLTreeSet, from which everything below the new floor is removed)."""
    floor = max(int(record[3]), int(floor))
    if len(done):
        for offset in list(done.keys(max=floor, excludemax=True)):
            done.remove(offset)
        while floor in done:
            done.remove(floor)
            floor += 1
    if floor == record[3]:
        return record
    return (*record[:3], floor, *record[4:])


def new_done_set() -> Any:
    return LLTreeSet()


def root_to_snapshot(conn: Any, queue_body_budget: int) -> Snapshot:
    """The whole durable state under ``conn``'s root as plain objects (start-up):
    the big trees read in bulk (``prefetch``), and of each queue its head, its share
    of ``queue_body_budget`` (0: no budget), in memory; the cache is emptied as it
    goes, so RSS stays near the budget at start too."""
    root = conn.root()
    snapshot = Snapshot()
    for topic, record in prefetch.items(conn, root["retained"]):
        snapshot.retained[topic] = record_to_message(record)
    for owner, record in root["wills"].items():
        snapshot.wills[owner] = record_to_will(record)
    for client_id, session in prefetch.sessions(conn, root["sessions"]):
        snapshot.sessions[client_id] = session_to_record(session)
    snapshot.bans = [record_to_ban(r) for r in root["bans"].values()]
    snapshot.exchanges = [record_to_exchange(r) for r in root["exchanges"].values()]
    snapshot.bindings = [record_to_binding(r) for r in root["bindings"].values()]
    queues = root["queues"]
    share = queue_body_budget // max(1, len(queues)) if queue_body_budget > 0 else None
    snapshot.queues = [queue_to_record(q, share, conn.cacheMinimize)
                       for q in queues.values()]
    return snapshot

"""How each storage op changes the ZODB trees (``HANDLERS``: op type -> function),
and which puts a later op in the same commit makes pointless (``superseded_puts``).
The writer thread of ``zodbstore`` applies them inside its transaction; nothing
here opens, commits or reads a storage."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mqttamqp.core.persistence import (
    ClearRetained,
    DeleteBan,
    DeleteBinding,
    DeleteExchange,
    DeleteInboundQos2,
    DeleteQueue,
    DeleteQueued,
    DeleteQueueGroup,
    DeleteQueueMessage,
    DeleteRetained,
    DeleteSession,
    DeleteSubscription,
    DeleteWill,
    Op,
    PutBan,
    PutBinding,
    PutExchange,
    PutInboundQos2,
    PutQueue,
    PutQueueArguments,
    PutQueued,
    PutQueueGroup,
    PutQueueMessage,
    PutRetained,
    PutSession,
    PutSubscription,
    PutWill,
    QueueDone,
    TrimQueue,
)
from mqttamqp.store.models import (
    PersistentQueue,
    PersistentSession,
    advance_floor,
    ban_to_record,
    binding_key,
    binding_to_record,
    exchange_to_record,
    group_to_record,
    message_to_record,
    new_done_set,
    queued_to_record,
    will_to_record,
)

__all__ = ["HANDLERS", "HOLD_GATHER", "HOLD_ROUNDS", "Trees", "age_held",
           "gather_window", "split_held", "superseded_puts"]


class Trees:
    """The root's BTrees, fetched once per commit attempt."""

    __slots__ = ("bans", "bindings", "deleted", "exchanges", "queues", "retained",
                 "sessions", "wills")

    def __init__(self, root: Any) -> None:
        self.bans: Any = root["bans"]
        self.exchanges: Any = root["exchanges"]
        self.bindings: Any = root["bindings"]
        self.queues: Any = root["queues"]
        self.retained: Any = root["retained"]
        self.wills: Any = root["wills"]
        self.sessions: Any = root["sessions"]
        # Sessions removed by DeleteSession earlier in the current submit: later
        # session ops of the same submit do not resurrect them implicitly.
        self.deleted: set[str] = set()


def _session_for_put(t: Trees, client_id: str) -> PersistentSession | None:
    session: PersistentSession | None = t.sessions.get(client_id)
    if session is None and client_id not in t.deleted:
        session = PersistentSession(client_id)
        t.sessions[client_id] = session
    return session


def _put_retained(t: Trees, op: PutRetained) -> None:
    t.retained[op.message.topic] = message_to_record(op.message)


def _delete_retained(t: Trees, op: DeleteRetained) -> None:
    t.retained.pop(op.topic, None)


def _clear_retained(t: Trees, op: ClearRetained) -> None:
    if len(t.retained):
        t.retained.clear()


def _put_will(t: Trees, op: PutWill) -> None:
    t.wills[op.will.owner] = will_to_record(op.will)


def _delete_will(t: Trees, op: DeleteWill) -> None:
    t.wills.pop(op.owner, None)


def _put_session(t: Trees, op: PutSession) -> None:
    t.deleted.discard(op.client_id)
    session = _session_for_put(t, op.client_id)
    assert session is not None
    if session.last_seen != op.last_seen:
        session.last_seen = float(op.last_seen)
    if op.owner is not None and session.owner != op.owner:
        session.owner = op.owner
    if session.expiry != op.expiry:
        session.expiry = None if op.expiry is None else float(op.expiry)


def _delete_session(t: Trees, op: DeleteSession) -> None:
    t.sessions.pop(op.client_id, None)
    t.deleted.add(op.client_id)


def _put_subscription(t: Trees, op: PutSubscription) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.subscriptions[op.topic_filter] = int(op.qos)


def _delete_subscription(t: Trees, op: DeleteSubscription) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.subscriptions.pop(op.topic_filter, None)


def _put_queued(t: Trees, op: PutQueued) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.queue[int(op.seq)] = queued_to_record(op.entry)


# How much longer the writer gathers when only acknowledgements wait on the commit.
HOLD_GATHER = 2.5
# The most commits a put for an online subscriber is held over (then it is written):
# each is a wait of up to 5 ms for what waits behind it (a stalled subscriber's
# publisher, an acknowledgement submitted after it).
HOLD_ROUNDS = 2


def gather_window(pending: Iterable[tuple[Sequence[Op], object]], window: float) -> float:
    """How long the writer gathers before it commits what is ``pending``: 0 when no
    put there (``PutQueued``, ``PutQueueMessage``: what an acknowledgement or a
    trim usually cancels within a millisecond) waits for it;
    ``window`` × ``HOLD_GATHER`` when all of it is puts for online subscribers
    (``PutQueued.online``) and queue entries' deletes, whose submitters wait on
    nothing but what their subscriber's acknowledgements release as well (a steady
    durable QoS 1 flow: fewer commit rounds, fewer puts held and looked at twice);
    ``window`` otherwise."""
    puts = False
    acks_only = True
    for ops, _ in pending:
        if not ops:
            acks_only = False     # (a barrier: its waiter waits for this commit)
        for op in ops:
            kind = type(op)
            if kind is PutQueued:
                puts = True
                if not op.online:  # type: ignore[union-attr]
                    acks_only = False
            elif kind is not DeleteQueued:
                if kind is PutQueueMessage:
                    puts = True
                acks_only = False
            if puts and not acks_only:
                return window
    if not puts:
        return 0.0
    return window * HOLD_GATHER if acks_only else window


def superseded_puts(group: Sequence[tuple[Sequence[Op], object]],
                    held: dict[int, list[Op]] | None = None) -> set[int]:
    """ids of PutQueued ops whose entry a later DeleteQueued, or a later PutQueued of
    the same entry, in the same commit replaces (and of PutQueueMessage ops a later
    TrimQueue or DeleteQueue removes).

    ``held`` (when given) receives, by the index of their submit in the group, the
    first puts of entries for online subscribers (``PutQueued.online``), in order,
    that nothing in the group replaced: the writer may hold them over to a later
    commit (``age_held``, ``split_held``), where the subscriber's acknowledgement
    usually cancels them.  Not those of a client with a ``DeleteSession`` in the
    group (a put applied after it must not revive it).

    A subscriber that acknowledges within one commit window makes the queue write
    pointless: skipping it (and keeping the delete, which may remove a record from
    an earlier commit, unless the entry's first put is in this commit:
    ``PutQueued.first``) leaves the same state with far fewer bucket writes.  A put
    followed by another put of the same entry (its state changed) is written once,
    as the last one.
    """
    # (session, seq) -> the id of the entry's last PutQueued not yet superseded:
    # one int per put, no list (this runs on the writer thread for every op).
    pending: dict[tuple[str, int], int] = {}
    # Entries whose first put is in this commit: nothing of them is stored yet, so
    # their delete is skipped too while that put is pending.
    fresh: set[tuple[str, int]] = set()
    # Durable queues likewise: a message consumed by every group before the commit
    # is trimmed in it (queue -> [(offset, id of its PutQueueMessage)]).
    appended: dict[str, list[tuple[int, int]]] = {}
    skip: set[int] = set()
    # (session, seq) -> an online entry's first put and its submit's index, when
    # ``held`` is asked for
    online: dict[tuple[str, int], tuple[Any, int]] = {}
    deleted: set[str] = set()
    holding = held is not None
    for index, (ops, _) in enumerate(group):
        for op in ops:
            kind = type(op)
            # (the session queue's ops first: a durable QoS 1 message has two)
            if kind is PutQueued:
                key = (op.client_id, op.seq)  # type: ignore[union-attr]
                earlier = pending.get(key)
                if earlier is not None:
                    skip.add(earlier)
                elif op.first:  # type: ignore[union-attr]
                    fresh.add(key)
                    if holding and op.online:  # type: ignore[union-attr]
                        online[key] = (op, index)
                pending[key] = id(op)
            elif kind is DeleteQueued:
                key = (op.client_id, op.seq)  # type: ignore[union-attr]
                put = pending.pop(key, None)
                if put is not None:
                    skip.add(put)
                    if key in fresh:   # (a later put of the key is not a first one)
                        fresh.discard(key)
                        skip.add(id(op))
            elif kind is PutQueueMessage:
                appended.setdefault(op.queue, []).append(  # type: ignore[union-attr]
                    (op.offset, id(op)))  # type: ignore[union-attr]
            elif kind is TrimQueue:
                appends = appended.get(op.queue)  # type: ignore[union-attr]
                if appends:
                    upto = op.upto  # type: ignore[union-attr]
                    skip.update(i for o, i in appends if o < upto)
                    appended[op.queue] = [  # type: ignore[union-attr]
                        a for a in appends if a[0] >= upto]
            elif kind is DeleteQueue:
                skip.update(i for _, i in appended.pop(op.name, ()))  # type: ignore[union-attr]
            elif kind is DeleteSession:
                client = op.client_id  # type: ignore[union-attr]
                deleted.add(client)
                for key in [k for k in pending if k[0] == client]:
                    del pending[key]
                    fresh.discard(key)
    if online:
        assert held is not None
        for key, (op, index) in online.items():
            if pending.get(key) == id(op) and key[0] not in deleted:
                puts = held.get(index)
                if puts is None:
                    held[index] = [op]
                else:
                    puts.append(op)
    return skip


def age_held(held: dict[int, list[Op]], rounds: dict[int, int]) -> dict[int, int]:
    """Take out of ``held`` the puts already held over ``HOLD_ROUNDS`` commits; return
    how many commits each put given has been a candidate, this one counted (by id:
    ``rounds`` for the next commit).  A put taken out keeps its count: a put held
    before it may still keep its submit from this commit (``split_held``), and it
    must not start again next time (review probe: two puts kept each other held
    for ever)."""
    aged: dict[int, int] = {}
    for index in list(held):
        keep = []
        for op in held[index]:
            n = aged[id(op)] = rounds.get(id(op), 0) + 1
            if n <= HOLD_ROUNDS:
                keep.append(op)
        if keep:
            held[index] = keep
        else:
            del held[index]
    return aged


def split_held(group: list[tuple[tuple[Op, ...], Any]], held: dict[int, list[Op]]
               ) -> tuple[list[tuple[tuple[Op, ...], Any]], list[tuple[tuple[Op, ...], Any]]]:
    """The group split before the first submit holding a put (a put sent at once to
    an online subscriber that nothing in the group cancelled, ``superseded_puts``;
    held over at most ``HOLD_ROUNDS`` commits, ``age_held``): the submits before it,
    which this commit writes, and the rest, whole, for the next commit.  Most held
    puts are cancelled there by their subscriber's acknowledgement, and neither they
    nor their deletes are ever written.  A submit is never split (its ops are
    durable together, and a waiter that fails holds nothing that was stored: the core
    undoes such a submit in memory), what is stored is always the state after a
    prefix of the submits (a ``kill -9`` between the two commits leaves no later op
    without an earlier one), and waiters fire in the order of their submits (an
    empty submit is a barrier for everything before it; a fence fails what is still
    queued at once).  (Review h-rev-hold, session 19.)"""
    if not held:
        return group, []
    first = min(held)
    return group[:first], group[first:]


def _delete_queued(t: Trees, op: DeleteQueued) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.queue.pop(int(op.seq), None)


def _put_inbound_qos2(t: Trees, op: PutInboundQos2) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.inbound_qos2.add(int(op.packet_id))


def _delete_inbound_qos2(t: Trees, op: DeleteInboundQos2) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.inbound_qos2.discard(int(op.packet_id))


def _put_ban(t: Trees, op: PutBan) -> None:
    t.bans[(op.kind, op.value)] = ban_to_record(op)


def _delete_ban(t: Trees, op: DeleteBan) -> None:
    t.bans.pop((op.kind, op.value), None)


def _queue_for_put(t: Trees, name: str) -> PersistentQueue:
    queue: PersistentQueue | None = t.queues.get(name)
    if queue is None:
        queue = PersistentQueue(name)
        t.queues[name] = queue
    return queue


def _put_queue(t: Trees, op: PutQueue) -> None:
    queue = _queue_for_put(t, op.name)
    retention = tuple(op.retention)
    if queue.retention != retention:
        queue.retention = retention


def _delete_queue(t: Trees, op: DeleteQueue) -> None:
    t.queues.pop(op.name, None)


def _put_queue_message(t: Trees, op: PutQueueMessage) -> None:
    # (queue messages keep their AMQP form: native receivers get them as sent)
    _queue_for_put(t, op.queue).log[int(op.offset)] = message_to_record(op.message)


def _delete_queue_message(t: Trees, op: DeleteQueueMessage) -> None:
    queue = t.queues.get(op.queue)
    if queue is not None:
        queue.log.pop(int(op.offset), None)
        if op.offset >= queue.tail:   # (its offset is never given out again)
            queue.tail = int(op.offset) + 1


def _trim_queue(t: Trees, op: TrimQueue) -> None:
    queue = t.queues.get(op.queue)
    if queue is None or op.upto <= queue.head:
        return
    upto = int(op.upto)
    log = queue.log
    for offset in list(log.keys(max=upto, excludemax=True)):
        del log[offset]
    queue.head = upto
    # (done offsets below the head are of no use any more: the floors move up)
    for key, record in list(queue.groups.items()):
        if record[2] == "classic" and record[3] < upto:
            queue.groups[key] = advance_floor(record, _done_set(queue, key), upto)


def _done_set(queue: PersistentQueue, key: str) -> Any:
    done = queue.done.get(key)
    if done is None:
        done = queue.done[key] = new_done_set()
    return done


def _queue_done(t: Trees, op: QueueDone) -> None:
    queue = t.queues.get(op.queue)
    record = queue.groups.get(op.group) if queue is not None else None
    if queue is None or record is None:
        return
    floor = record[3]
    done = _done_set(queue, op.group)
    for offset in op.offsets:
        if offset >= floor:
            done.add(int(offset))
    if floor in done:
        queue.groups[op.group] = advance_floor(record, done, floor)


def _put_queue_group(t: Trees, op: PutQueueGroup) -> None:
    queue = _queue_for_put(t, op.queue)
    record = group_to_record(op.state)
    old = queue.groups.get(op.group)
    if old is not None:
        # A snapshot taken before a later one may be committed after it: the
        # dispatch watermark and the delivery counts only ever grow.
        counts = dict(old[6])
        for offset, count in record[6]:
            counts[offset] = max(count, counts.get(offset, 0))
        record = (*record[:4], max(record[4], old[4]), record[5],
                  tuple(sorted(counts.items())), *record[7:])
        if len(old) > 9 and len(record) > 9:   # (so do a priority group's per level)
            marks = dict(old[9])
            for level, mark in record[9]:
                marks[level] = max(mark, marks.get(level, 0))
            record = (*record[:9], tuple(sorted(marks.items())))
    done = _done_set(queue, op.group)
    done.update(int(o) for o in op.state.done)
    record = advance_floor(record, done, record[3] if old is None else max(record[3], old[3]))
    floor = record[3]
    if any(o < floor or o in done for o, _ in record[6]):
        # (counts of finished messages are of no use: kept, they would only grow)
        record = (*record[:6], tuple((o, c) for o, c in record[6]
                                     if o >= floor and o not in done), *record[7:])
    queue.groups[op.group] = record


def _delete_queue_group(t: Trees, op: DeleteQueueGroup) -> None:
    queue = t.queues.get(op.queue)
    if queue is not None:
        queue.groups.pop(op.group, None)
        queue.done.pop(op.group, None)


def _put_exchange(t: Trees, op: PutExchange) -> None:
    t.exchanges[op.name] = exchange_to_record(op)


def _delete_exchange(t: Trees, op: DeleteExchange) -> None:
    t.exchanges.pop(op.name, None)


def _put_binding(t: Trees, op: PutBinding) -> None:
    t.bindings[binding_key(op)] = binding_to_record(op)


def _delete_binding(t: Trees, op: DeleteBinding) -> None:
    t.bindings.pop(binding_key(op), None)


def _put_queue_arguments(t: Trees, op: PutQueueArguments) -> None:
    queue = _queue_for_put(t, op.name)
    arguments = tuple(op.arguments)
    if queue.arguments != arguments:
        queue.arguments = arguments


HANDLERS: dict[type, Callable[[Trees, Any], None]] = {
    PutExchange: _put_exchange,
    DeleteExchange: _delete_exchange,
    PutBinding: _put_binding,
    DeleteBinding: _delete_binding,
    PutQueueArguments: _put_queue_arguments,
    PutQueue: _put_queue,
    DeleteQueue: _delete_queue,
    PutQueueMessage: _put_queue_message,
    DeleteQueueMessage: _delete_queue_message,
    TrimQueue: _trim_queue,
    QueueDone: _queue_done,
    PutQueueGroup: _put_queue_group,
    DeleteQueueGroup: _delete_queue_group,
    PutBan: _put_ban,
    DeleteBan: _delete_ban,
    PutRetained: _put_retained,
    DeleteRetained: _delete_retained,
    ClearRetained: _clear_retained,
    PutWill: _put_will,
    DeleteWill: _delete_will,
    PutSession: _put_session,
    DeleteSession: _delete_session,
    PutSubscription: _put_subscription,
    DeleteSubscription: _delete_subscription,
    PutQueued: _put_queued,
    DeleteQueued: _delete_queued,
    PutInboundQos2: _put_inbound_qos2,
    DeleteInboundQos2: _delete_inbound_qos2,
}

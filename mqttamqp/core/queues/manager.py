"""Durable queues (seed 004): ``$queue/<name>/...`` beside the pub/sub router.

A publish to ``$queue/<name>/<routing key>`` appends the message to queue
``<name>``'s durable log at the next offset; the publisher's acknowledgement waits
for the commit that holds it.  Queue messages never enter the trie, and pub/sub
messages never enter a queue.

Consumer groups read a queue.  Each group receives every message whose routing key
matches the group's filter (groups fan out); within a group each message goes to
one member, round-robin over the members with credit.  A group is the pair (name,
filter): ``$queue/jobs/#`` and ``$queue/jobs/eu/#`` joined under the same name are
two groups.  Its id, which deliveries carry and acknowledgements name, is the name
for the filter ``#`` and ``<name>@<filter>`` otherwise.

Classic groups (the default) claim messages: a delivered message is *pending* on
its member until acknowledged; after the visibility timeout it is visible again,
after ``max_deliveries`` deliveries it is dead-lettered to ``$dlq/<name>`` (itself
a queue), a member that leaves gives its pending messages back at once, and an idle
member may take over messages pending on a member that has not acknowledged for
half the visibility timeout.  Stream groups read by cursor without claiming; the
cursor is stored every few seconds and on an explicit ``$ack`` (commit).

How acknowledgements reach a group depends on the member:

* ``explicit`` (MQTT 5): ``$queue/<name>/$ack|$nack|$reject`` with user properties
  ``message-id`` and ``group-id`` (``QueueManager.command``);
* transport (MQTT 3.x at QoS >= 1, AMQP unsettled): the PUBACK / PUBCOMP / Accepted
  of the delivery itself (the session entry's ``on_done``); AMQP's other outcomes
  come through ``QueueManager.settle``;
* on send (MQTT 3.x at QoS 0, AMQP pre-settled).

Durability: every change of a queue's durable state is an ``Op`` committed before
it is confirmed.  A group's state is stored whole (``QueueGroupRecord``: floor,
acknowledged offsets above it, delivery counts, members); the dispatch watermark
is stored ahead of the deliveries in steps, a delivery goes out only below a
watermark already durable, and after a restart every message below it that was
not acknowledged counts one more delivery (at-least-once: a
message whose acknowledgement was lost in a crash comes back with its count
raised).  Messages are dispatched only once their append is durable.

What this module must not do: touch sockets or storage (deliveries go through
``Session.deliver``; durable changes are returned or handed to ``CommitBatcher``),
or know protocols beyond the three acknowledgement modes above.
"""

from __future__ import annotations

import fnmatch
import heapq
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.commits import CommitBatcher, committed_or_early
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, MessageProperties, body_size, stub
from mqttamqp.core.persistence import (
    DeleteQueue,
    DeleteQueueGroup,
    DeleteQueueMessage,
    Op,
    PutQueue,
    PutQueueGroup,
    PutQueueMessage,
    QueueDone,
    QueueGroupRecord,
    QueueRecord,
    TrimQueue,
)
from mqttamqp.core.queues.budget import FreeSpace, StorageAlarm
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.topics import topic_matches, validate_topic_filter
from mqttamqp.records import record

__all__ = [
    "QUEUE_PREFIX", "DLQ_PREFIX", "ACK", "NACK", "REJECT", "CLASSIC", "STREAM",
    "Consumer", "is_queue_command", "QueueAddress", "QueueManager", "Retention", "Refusal",
    "is_queue_topic",
    "parse_queue_topic", "parse_queue_filter", "parse_stream_offset",
    "QueueView", "GroupView", "QueueMessageView", "default_group", "METADATA_KEYS",
    "DLQ_KEYS",
]

QUEUE_PREFIX = "$queue/"
DLQ_PREFIX = "$dlq/"
ACK, NACK, REJECT = "$ack", "$nack", "$reject"
ACTIONS = (ACK, NACK, REJECT)
CLASSIC, STREAM = "classic", "stream"

# MQTT 5 PUBACK reason codes a queue publish or acknowledgement may get.
UNSPECIFIED_ERROR = 0x80
TOPIC_NAME_INVALID = 0x90
QUOTA_EXCEEDED = 0x97

# The dispatch watermark is stored this many offsets ahead of the deliveries, and
# again when they come within half of it.  Deliveries past the stored one wait for
# its commit (an fsync), so a small step throttled the queue to a step per fsync;
# a large one only means that after a crash up to that many messages never
# delivered count a delivery (they may have been: at-least-once).
_WATERMARK_STEP = 4096
# Consumer groups one queue may have (each is stored, and holds the log).
MAX_GROUPS_PER_QUEUE = 256
# A stream group's cursor is stored at most this often (seconds) when it moves.
_CURSOR_EVERY = 5.0
# The memory budget of queue bodies (``--queue-memory-budget``): a read back from
# storage takes at most this many messages and bytes (at least one message), and
# the same ahead of each consuming group's cursor is never evicted, so that what
# was read back is not evicted again before it goes out.
_READ_MESSAGES = 64
_READ_BYTES = 4 << 20

# Reads a queue's messages back from storage (``StateStore.read_queue_messages``).
QueueReader = Callable[[str, Sequence[int]], "Deferred[list[tuple[int, Message]]]"]


def is_queue_topic(topic: str) -> bool:
    """A topic (or filter) of the queue namespaces, ``$queue/`` or ``$dlq/``."""
    return topic.startswith(QUEUE_PREFIX) or topic.startswith(DLQ_PREFIX)


def is_queue_command(topic: str) -> bool:
    """``$queue/.../$ack``, ``$nack`` or ``$reject`` (or the same under ``$dlq/``)."""
    return is_queue_topic(topic) and topic.rsplit("/", 1)[-1] in ACTIONS


@record
class QueueAddress:
    """A parsed queue topic: the queue's key (``name`` or ``$dlq/name``), what
    follows it (routing key of a publish, filter of a subscription) and, for
    ``$ack``/``$nack``/``$reject``, the action."""

    queue: str
    rest: str
    action: str | None = None

    @property
    def name(self) -> str:
        """The queue's name without the ``$dlq/`` namespace."""
        return self.queue[len(DLQ_PREFIX):] if self.queue.startswith(DLQ_PREFIX) else self.queue

    @property
    def dead_letter(self) -> bool:
        return self.queue.startswith(DLQ_PREFIX)


@record
class Refusal:
    """Why a queue publish or acknowledgement was refused (MQTT 5 reason code and
    string; AMQP Rejected's description)."""

    code: int
    reason: str


def _split(topic: str) -> tuple[str, str, str] | str:
    if topic.startswith(QUEUE_PREFIX):
        prefix, body = "", topic[len(QUEUE_PREFIX):]
    elif topic.startswith(DLQ_PREFIX):
        prefix, body = DLQ_PREFIX, topic[len(DLQ_PREFIX):]
    else:
        return "not a queue topic"
    name, _, rest = body.partition("/")
    if not name:
        return f"{topic!r} names no queue: use $queue/<name>/..."
    if "+" in name or "#" in name or name.startswith("$"):
        return f"a queue name may not hold + or # or start with $ ({name!r})"
    return prefix, name, rest


def parse_queue_topic(topic: str) -> QueueAddress | str:
    """A queue publish topic → its address, or why it is refused (a str)."""
    split = _split(topic)
    if isinstance(split, str):
        return split
    prefix, name, rest = split
    if "+" in rest or "#" in rest:
        return f"a queue publish topic may not hold wildcards ({topic!r})"
    last = rest.rsplit("/", 1)[-1] if rest else ""
    if last in ACTIONS:
        return QueueAddress(prefix + name, rest[: -len(last)].rstrip("/"), last)
    if prefix:
        return f"{topic!r}: messages reach a dead-letter queue only by dead-lettering"
    return QueueAddress(name, rest)


def parse_queue_filter(topic_filter: str) -> QueueAddress | str:
    """A queue subscription → its address (``rest`` the group's filter, ``#`` when
    none is given), or why it is refused."""
    split = _split(topic_filter)
    if isinstance(split, str):
        return split
    prefix, name, rest = split
    rest = rest or "#"
    problem = validate_topic_filter(rest)
    if problem is not None:
        return f"{topic_filter!r}: {problem}"
    return QueueAddress(prefix + name, rest)


def default_group(client_id: str) -> str:
    """The group of an MQTT 3.x consumer, as FluxMQ: its client id up to the first
    ``-`` (``worker-1`` and ``worker-2`` are group ``worker``)."""
    return client_id.split("-", 1)[0] or client_id


def parse_stream_offset(value: str | None) -> tuple[str, float] | str:
    """``stream-offset``: ``first``, ``last``, an offset (digits), or a timestamp
    (ISO 8601, or ``@`` and seconds since the epoch).  Returns ``(kind, value)``
    with kind ``first``/``last``/``offset``/``time``, or why it is refused."""
    if value is None or value == "" or value == "first":
        return ("first", 0.0)
    if value == "last":
        return ("last", 0.0)
    if value.isdigit():
        return ("offset", float(int(value)))
    try:
        if value.startswith("@"):
            return ("time", float(value[1:]))
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return (f"stream-offset {value!r}: use first, last, an offset, an ISO 8601 time "
                "or @<seconds since the epoch>")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ("time", moment.timestamp())


@record
class Consumer:
    """How a subscription joins a queue: its group (None: the client id up to its
    first ``-``), ``classic`` or ``stream`` mode, a stream's start
    (``parse_stream_offset``), and whether it acknowledges with
    ``$ack``/``$nack``/``$reject`` (None: if it speaks MQTT 5)."""

    group: str | None = None
    mode: str | None = None
    stream_offset: str | None = None
    explicit: bool | None = None


@record
class Retention:
    """How long a queue keeps messages (None: no bound of that kind)."""

    max_age: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None

    def as_tuple(self) -> tuple[float | None, int | None, int | None]:
        return (self.max_age, self.max_bytes, self.max_messages)


class _Member:
    __slots__ = ("explicit", "outstanding", "qos", "session")

    def __init__(self, session: Session, qos: int, explicit: bool) -> None:
        self.session = session
        self.qos = qos
        self.explicit = explicit     # acknowledges with $ack/$nack/$reject (MQTT 5)
        self.outstanding = 0         # deliveries not yet acknowledged (its credit use)


class _Pending:
    __slots__ = ("entry", "member", "since")

    def __init__(self, member: _Member, since: float, entry: OutEntry | None) -> None:
        self.member = member
        self.since = since
        self.entry = entry


class _Group:
    def __init__(self, queue: _Queue, name: str, topic_filter: str, mode: str) -> None:
        self.queue = queue
        self.name = name
        self.filter = topic_filter
        self.key = name if topic_filter == "#" else f"{name}@{topic_filter}"
        self.mode = mode
        self.members: list[_Member] = []
        # Persistent sessions that were members (they come back as members).
        self.stored_members: dict[str, int] = {}
        self._rr = 0
        # Classic: everything below ``floor`` is done; ``done`` holds the offsets
        # done above it; ``next`` is the next offset never dispatched.
        self.floor = queue.first
        self.next = queue.first
        self.done: set[int] = set()
        self.pending: dict[int, _Pending] = {}
        self.ready: list[int] = []            # a heap: offsets visible again
        self.counts: dict[int, int] = {}      # deliveries made so far, per offset
        # Offsets delivered and given back without counting it (Released): their
        # next delivery is not the first, though their count says 1.  (Not stored:
        # after a restart their count is raised anyway.)
        self.uncounted: set[int] = set()
        self.watermark = queue.first          # dispatch watermark (being) stored
        self.safe = queue.first               # the watermark known durable
        self.cursor_saved = queue.first       # stream: the stored cursor
        self.cursor_saved_at = 0.0
        self.redelivered = 0
        self.acked = 0

    def matches(self, message: Message) -> bool:
        if self.filter == "#":
            return True
        return topic_matches(self.filter, _routing_key(self.queue.name, message.topic))

    def record(self) -> QueueGroupRecord:
        # (``done`` goes to storage offset by offset: ``QueueDone``)
        return QueueGroupRecord(
            self.name, self.filter, self.mode, self.floor, self.watermark, (),
            tuple(sorted((o, c) for o, c in self.counts.items() if c > 1)),
            tuple(sorted(self.stored_members.items())),
            self.next if self.mode == STREAM else 0)

    def advance_floor(self) -> None:
        done = self.done
        floor = self.floor
        skip = self.queue.skip if self.queue.skip_starts else None
        while True:
            while floor in done:
                done.discard(floor)
                floor += 1
            if skip is not None:
                past = skip(floor)   # (offsets that never held a message)
                if past != floor:
                    floor = past
                    continue
            break
        self.floor = floor

    def lag(self) -> int:
        queue = self.queue
        return (max(0, queue.next_offset - self.next) + len(self.ready)
                - queue.skipped_between(self.next, queue.next_offset))


class _Queue:
    def __init__(self, name: str, retention: Retention, head: int = 0) -> None:
        self.name = name
        self.retention = retention
        self.log: dict[int, Message] = {}
        self.first = head          # lowest offset that may still be in the log
        self.next_offset = head
        self.committed = head      # offsets below this are durable: dispatchable
        self.bytes = 0
        self.groups: dict[str, _Group] = {}
        self.published = 0
        self.acked = 0
        self.dead = 0
        self.expired = 0
        # offset -> what its publisher waits for, while it may still fire early:
        # every classic group done with it before its commit (``_trim``).
        self.waiters: dict[int, Deferred[None]] = {}
        # Offsets below ``next_offset`` that hold no message and never will, as
        # sorted ranges [start, end): found at a restart (``QueueManager._skip``),
        # jumped over by floors and cursors, left out of lags.
        self.skip_starts: list[int] = []
        self.skip_ends: list[int] = []
        # Messages whose body is in storage only (``log`` holds a ``stub``): offset
        # -> (payload bytes, body bytes).  Only durable messages are evicted: below
        # ``durable`` and not in ``unstored`` (appends whose commit failed).
        self.evicted: dict[int, tuple[int, int]] = {}
        self.durable = head
        self.unstored: set[int] = set()
        self.reading = False       # a read back from storage is under way

    def skip(self, offset: int) -> int:
        """``offset``, or the end of the skipped range it is in."""
        starts = self.skip_starts
        if starts:
            i = bisect_right(starts, offset) - 1
            if i >= 0 and offset < self.skip_ends[i]:
                return self.skip_ends[i]
        return offset

    def skipped_between(self, low: int, high: int) -> int:
        """How many offsets in [low, high) are skipped."""
        n = 0
        for start, end in zip(self.skip_starts, self.skip_ends, strict=True):
            if start >= high:
                break
            if end > low:
                n += min(end, high) - max(start, low)
        return n

    def oldest(self) -> Message | None:
        log = self.log
        while self.first < self.next_offset and self.first not in log:
            self.first += 1
        return log.get(self.first)


def _routing_key(queue: str, topic: str) -> str:
    # (``$queue/<name>/<key>`` or ``$dlq/<name>/<key>``: the key after the name)
    _, _, rest = topic.partition(queue[len(DLQ_PREFIX):] + "/" if queue.startswith(DLQ_PREFIX)
                                 else queue + "/")
    return rest


@record
class GroupView:
    id: str
    name: str
    filter: str
    mode: str
    members: tuple[str, ...]
    cursor: int
    lag: int
    pending: int
    redeliveries: int
    acknowledged: int


@record
class QueueView:
    name: str
    depth: int
    bytes: int
    oldest_age: float | None
    published: int
    acknowledged: int
    dead_lettered: int
    expired: int
    dlq_depth: int
    retention: Retention
    groups: tuple[GroupView, ...]
    first: int
    next: int
    in_storage_only: int = 0    # messages whose body is not in memory (the budget)


@record
class QueueMessageView:
    offset: int
    topic: str
    payload: bytes
    timestamp: float
    qos: int
    publisher: str | None
    user_properties: tuple[tuple[str, str], ...]
    # The body is in storage only (``--queue-memory-budget``): ``payload`` is
    # empty, ``size`` is its length.
    in_storage_only: bool = False
    size: int = 0


@dataclass
class QueueStats:
    published: int = 0
    acked: int = 0
    nacked: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    redelivered: int = 0
    expired: int = 0
    refused: int = 0


class QueueManager:
    log = Logger(namespace="mqttamqp.core.queues.manager")

    def __init__(self, clock: Clock, commits: CommitBatcher, limits: Limits,
                 log_limit: LogLimiter, retention_rules: Sequence[tuple[str, Retention]] = ()
                 ) -> None:
        self.clock = clock
        self.commits = commits
        self.limits = limits
        self._log_limit = log_limit
        self.queues: dict[str, _Queue] = {}
        self.stats = QueueStats()
        # (pattern, retention) from --queues, first match wins; then the defaults.
        self.retention_rules = list(retention_rules) or [
            (pattern, Retention(age if age is not None else limits.queue_max_age or None,
                                size if size is not None else limits.queue_max_bytes or None,
                                count if count is not None
                                else limits.queue_max_messages or None))
            for pattern, age, size, count in limits.queue_rules]
        self._memberships: dict[Session, list[tuple[_Group, _Member]]] = {}
        # Queues appended to since the last ``_commit``, with their next offset.
        self._appended_to: dict[_Queue, int] = {}
        # Offsets finished (acknowledged, dead) not yet in a commit, per group.
        self._unsaved: dict[_Group, list[int]] = {}
        self._early: list[Deferred[None]] = []   # publishers' waiters to fire now
        self._parsed: dict[str, QueueAddress | str] = {}   # publish topics, parsed
        # Client ids that have (or had) a stored membership: only their sessions'
        # connects look through the groups (``session_online``, on every CONNECT).
        self._stored_clients: set[str] = set()
        self._flush_armed = False
        self._leaving: Session | None = None   # (no credit while it leaves)
        self._timer: DelayedCall | None = None  # the next ``tick``, while there is work
        self.stopped = False
        # Aggregate bounds.  Disk: every queue's stored payload bytes in all
        # (``total_bytes``) and the data directory's free space (``alarm``).  Memory:
        # the bodies held in memory (``resident``) against ``--queue-memory-budget``;
        # past it, durable bodies far from any consumer are evicted (only their
        # stub stays) and read back from storage (``_reader``) as consumers near.
        self.alarm = StorageAlarm(clock, limits.queue_max_total_bytes,
                                  limits.disk_free_limit)
        self.total_bytes = 0
        self.resident = 0
        self.budget = limits.queue_memory_budget
        self._reader: QueueReader | None = None
        self._appends: dict[_Queue, tuple[int, int]] = {}  # (first, upto) this commit
        # Body bytes appended and not committed yet (they cannot be evicted): past
        # ``_unstored_limit`` publishers to queues wait for the writer (``paused``),
        # so that what waits for a commit does not grow past the budget.
        self._append_bytes = 0            # since the last ``_commit``
        self.unstored_bytes = 0
        self._unstored_limit = (max(8 << 20, min(64 << 20, self.budget // 4))
                                if self.budget > 0 else 0)
        # After a pass that could not get under the budget (what consumers are about
        # to take is protected), the next waits until this much more is resident:
        # not a scan of every log per commit.
        self._evict_above = 0
        self.evictions = 0      # bodies evicted (counted once each time)
        self.read_backs = 0     # bodies read back from storage

    def attach_storage(self, reader: QueueReader | None,
                       free_space: FreeSpace | None = None) -> None:
        """How bodies are read back (None: they are never evicted) and how the data
        directory's free space is read (None: no free-disk watermark)."""
        self._reader = reader
        if free_space is not None:
            self.alarm = StorageAlarm(self.clock, self.limits.queue_max_total_bytes,
                                      self.limits.disk_free_limit, free_space)
            self.alarm.check_total(self.total_bytes)

    @property
    def blocked(self) -> bool:
        """Publishers to queues are blocked (the storage alarm is raised)."""
        return self.alarm.blocked

    @property
    def paused(self) -> bool:
        """Publishers to queues wait: blocked, or the writer is behind."""
        return self.alarm.paused

    @property
    def evicted_messages(self) -> int:
        return sum(len(q.evicted) for q in self.queues.values())

    # -- retention settings -------------------------------------------------------

    def default_retention(self, name: str) -> Retention:
        base = name[len(DLQ_PREFIX):] if name.startswith(DLQ_PREFIX) else name
        for pattern, retention in self.retention_rules:
            if fnmatch.fnmatchcase(base, pattern) or fnmatch.fnmatchcase(name, pattern):
                return retention
        limits = self.limits
        return Retention(limits.queue_max_age or None, limits.queue_max_bytes or None,
                         limits.queue_max_messages or None)

    # -- queues -------------------------------------------------------------------

    def _queue(self, name: str, ops: list[Op]) -> _Queue | None:
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        if len(self.queues) >= self.limits.queue_max_queues:
            return None
        queue = _Queue(name, self.default_retention(name))
        self.queues[name] = queue
        ops.append(PutQueue(name, queue.retention.as_tuple()))
        return queue

    def _refuse(self, cause: str, who: str, topic: str, reason: str,
                code: int = UNSPECIFIED_ERROR) -> Refusal:
        self.stats.refused += 1
        suppressed = self._log_limit.allow("queue:" + cause)
        if suppressed is not None:
            self.log.warn("{c}: {t!r} refused: {r} ({h} more refusals like it since the "
                          "last line)", c=who, t=topic, r=reason, h=suppressed)
        return Refusal(code, reason)

    def _commit(self, ops: Sequence[Op], background: str | None = None
                ) -> Deferred[None] | None:
        """Persist ``ops``; the queues appended to meanwhile dispatch their new
        messages once that commit is durable.  With ``background`` nobody waits."""
        if self._unsaved:
            ops = [*ops, *self._drain_done()]
        appended, self._appended_to = self._appended_to, {}
        stored, self._appends = self._appends, {}
        nbytes, self._append_bytes = self._append_bytes, 0
        d = self.commits.persist(ops)
        if d is not None and stored:
            d.addCallbacks(self._made_durable, self._not_durable,
                           callbackArgs=(stored, nbytes), errbackArgs=(stored, nbytes))
        elif nbytes:
            self._committed_bytes(nbytes)
        if self._early:
            early, self._early = self._early, []
            for waiter in early:      # (consumed before stored: see ``publish``)
                if not waiter.called:
                    waiter.callback(None)
        if d is None:
            return None
        for queue, upto in appended.items():
            d.addCallback(self._appended, queue, upto)
        if background is not None:
            self.commits.watch(d, background)
            return None
        return d

    def _committed_bytes(self, nbytes: int) -> None:
        self.unstored_bytes -= nbytes
        if self.unstored_bytes <= self._unstored_limit // 2:
            self.alarm.set_behind(False)

    def _made_durable(self, result: object, stored: dict[_Queue, tuple[int, int]],
                      nbytes: int) -> object:
        """Appends up to ``upto`` are durable: their bodies may be evicted."""
        for queue, (_, upto) in stored.items():
            if upto > queue.durable:
                queue.durable = upto
        self._committed_bytes(nbytes)
        if self.resident > self.budget > 0:
            if self.resident > self._evict_above:
                self._evict()
        else:
            self._evict_above = 0
        return result

    def _not_durable(self, failure: Failure, stored: dict[_Queue, tuple[int, int]],
                     nbytes: int) -> Failure:
        """Appends whose commit failed are in memory only: never evicted."""
        self._committed_bytes(nbytes)
        for queue, (first, upto) in stored.items():
            queue.unstored.update(o for o in range(first, upto) if o in queue.log)
        return failure

    def _drain_done(self) -> list[Op]:
        """The offsets finished since the last commit, one ``QueueDone`` per group,
        and the trims they allow (not an op per acknowledgement: with four
        consumers acknowledging, those were most of the queue path's cost)."""
        unsaved, self._unsaved = self._unsaved, {}
        ops: list[Op] = []
        queues: dict[str, _Queue] = {}
        for group, offsets in unsaved.items():
            queue = group.queue
            if self.queues.get(queue.name) is not queue:
                continue   # (deleted meanwhile)
            ops.append(QueueDone(queue.name, group.key, tuple(offsets)))
            queues[queue.name] = queue
            waiters = queue.waiters
            if waiters:
                classic = [g for g in queue.groups.values() if g.mode == CLASSIC]
                for offset in offsets:
                    if offset in waiters and all(
                            offset < g.floor or offset in g.done for g in classic):
                        self._early.append(waiters.pop(offset))
        for queue in queues.values():
            self._trim(queue, ops)
        return ops

    def _flush_done(self) -> None:
        self._flush_armed = False
        if self._unsaved:
            self._commit((), "recording queue acknowledgements")

    def _flush_soon(self) -> None:
        """Store what was finished at the end of the current batch (one socket
        read), or now outside one."""
        if self._flush_armed:
            return
        if self.commits.after_batch(self._flush_done):
            self._flush_armed = True
        else:
            self._flush_done()

    # -- publishing ---------------------------------------------------------------

    def publish(self, message: Message, publisher: str,
                extra_ops: Sequence[Op] = (), refuse_when_blocked: bool = False
                ) -> tuple[Deferred[None] | None, Refusal | None]:
        """Append ``message`` (topic ``$queue/<name>/...``) to its queue; the
        Deferred fires once the append is durable.  Acknowledgement topics are
        ``command``'s, not this.

        While the storage alarm is raised (``blocked``) the message is still
        appended (what a publisher sent before its protocol stopped reading it),
        unless ``refuse_when_blocked`` (an MQTT 5 QoS 1/2 publish: PUBACK/PUBREC
        0x97 tells it at once, where waiting would hold its connection)."""
        address = self._parsed.get(message.topic)
        if address is None:
            if len(self._parsed) >= 4096:
                self._parsed.clear()
            address = self._parsed[message.topic] = parse_queue_topic(message.topic)
        if isinstance(address, str):
            return (self._commit(extra_ops),
                    self._refuse("topic", publisher, message.topic, address,
                                 TOPIC_NAME_INVALID))
        if refuse_when_blocked and self.alarm.blocked:
            return (self._commit(extra_ops),
                    self._refuse("full", publisher, message.topic,
                                 f"durable queues full: {self.alarm.reason}",
                                 QUOTA_EXCEEDED))
        ops: list[Op] = list(extra_ops)
        queue = self._queue(address.queue, ops)
        if queue is None:
            return (self._commit(ops),
                    self._refuse("count", publisher, message.topic,
                                 f"too many queues (--queue-max-queues "
                                 f"{self.limits.queue_max_queues})", QUOTA_EXCEEDED))
        if message.retain or message.dup:
            message = replace(message, retain=False, dup=False)
        offset = self._append(queue, message, ops)
        if message.qos < 2:
            # (dispatched now, below: nothing to do when the commit comes)
            self._appended_to.pop(queue, None)
        d = self._commit(ops)
        if d is not None and message.qos and any(
                g.mode == CLASSIC for g in queue.groups.values()):
            # As for persistent sessions: the acknowledgement promises the message is
            # stored, or already consumed.  When every classic group is done with it
            # before the writer commits, it need not wait (``_trim``).
            if not self.commits.owned:
                d = committed_or_early(d, self.commits.log_failure)
            queue.waiters[offset] = d   # (until trimmed or forgotten: ``_trim``)
        if message.qos < 2 and queue.committed < queue.next_offset:
            # QoS 0/1 goes to consumers at once, as to subscribers: were the commit
            # lost, so would be the publisher's PUBACK, and its resend is a
            # permitted duplicate.  QoS 2 waits for its commit (``_appended``).
            queue.committed = queue.next_offset
            self._pump_queue(queue)
        return d, None

    def _append(self, queue: _Queue, message: Message, ops: list[Op]) -> int:
        offset = queue.next_offset
        queue.next_offset = offset + 1
        queue.log[offset] = message
        size = len(message.payload)
        queue.bytes += size
        self.total_bytes += size
        body = body_size(message)
        self.resident += body
        if self._unstored_limit:
            self._append_bytes += body
            self.unstored_bytes += body
            if self.unstored_bytes > self._unstored_limit:
                self.alarm.set_behind(True)
        stored = self._appends.get(queue)
        self._appends[queue] = (offset if stored is None else stored[0], offset + 1)
        queue.published += 1
        self.stats.published += 1
        ops.append(PutQueueMessage(queue.name, offset, message))
        self._appended_to[queue] = offset + 1
        if queue.retention.max_age is not None:
            self._arm()
        self._enforce_retention(queue, ops, message.timestamp)
        if self.alarm.max_total > 0:
            self.alarm.check_total(self.total_bytes)
        return offset

    def _remove(self, queue: _Queue, offset: int) -> Message | None:
        """Take ``offset`` out of ``queue``'s log and its bytes out of the counts."""
        message = queue.log.pop(offset, None)
        if message is None:
            return None
        sizes = queue.evicted.pop(offset, None) if queue.evicted else None
        if sizes is None:
            size = len(message.payload)
            self.resident -= body_size(message)
        else:
            size = sizes[0]
        queue.bytes -= size
        self.total_bytes -= size
        if queue.unstored:
            queue.unstored.discard(offset)
        return message

    def _removed(self) -> None:
        """Messages left the queues: the storage alarm may clear."""
        if self.alarm.blocked:
            self.alarm.check_total(self.total_bytes)

    def _appended(self, result: object, queue: _Queue, upto: int) -> object:
        if upto > queue.committed:
            queue.committed = upto
        if self.queues.get(queue.name) is queue:
            self._pump_queue(queue)
        return result

    # -- retention ----------------------------------------------------------------

    def _enforce_retention(self, queue: _Queue, ops: list[Op], now: float) -> None:
        r = queue.retention
        log = queue.log
        start = queue.first
        while log:
            message = queue.oldest()
            if message is None:
                break
            over = ((r.max_messages is not None and len(log) > r.max_messages)
                    or (r.max_bytes is not None and queue.bytes > r.max_bytes)
                    or (r.max_age is not None and message.timestamp + r.max_age <= now))
            if not over:
                break
            self._forget(queue, queue.first)
            queue.expired += 1
            self.stats.expired += 1
        if queue.first != start:
            ops.append(TrimQueue(queue.name, queue.first))

    def _forget(self, queue: _Queue, offset: int) -> None:
        message = self._remove(queue, offset)
        queue.waiters.pop(offset, None)   # (dropped, not consumed: never early)
        if message is None:
            return
        self._removed()
        for group in queue.groups.values():
            if group.mode != CLASSIC or offset < group.floor or offset in group.done:
                continue
            pending = group.pending.pop(offset, None)
            if pending is not None:
                pending.member.outstanding -= 1
                if pending.entry is not None:
                    pending.entry.on_done = None
                    pending.member.session.take_back(pending.entry)
            group.counts.pop(offset, None)
            group.uncounted.discard(offset)
            if offset < group.next:
                group.done.add(offset)
                group.advance_floor()
        if offset == queue.first:
            queue.oldest()

    # -- subscriptions ------------------------------------------------------------

    def subscribe(self, session: Session, topic_filter: str, qos: int, consumer: Consumer
                  ) -> tuple[Refusal | None, list[Op]]:
        """``session`` joins the group of ``topic_filter`` (``$queue/<name>[/<filter>]``
        or ``$dlq/...``) as ``consumer`` says.  Returns a refusal, or the durable ops."""
        group, mode, stream_offset = consumer.group, consumer.mode, consumer.stream_offset
        explicit = (consumer.explicit if consumer.explicit is not None
                    else session.protocol == "mqtt5")
        address = parse_queue_filter(topic_filter)
        who = session.client_id
        if isinstance(address, str):
            return self._refuse("filter", who, topic_filter, address), []
        mode = mode or CLASSIC
        if mode not in (CLASSIC, STREAM):
            return self._refuse("mode", who, topic_filter,
                                f"consumer-mode {mode!r}: use classic or stream"), []
        start = parse_stream_offset(stream_offset)
        if isinstance(start, str):
            return self._refuse("offset", who, topic_filter, start), []
        ops: list[Op] = []
        queue = self._queue(address.queue, ops)
        if queue is None:
            return self._refuse("count", who, topic_filter,
                                f"too many queues (--queue-max-queues "
                                f"{self.limits.queue_max_queues})", QUOTA_EXCEEDED), []
        name = group or default_group(session.client_id)
        key = name if address.rest == "#" else f"{name}@{address.rest}"
        g = queue.groups.get(key)
        if g is None and len(queue.groups) >= MAX_GROUPS_PER_QUEUE:
            return self._refuse("groups", who, topic_filter,
                                f"queue {queue.name!r} has {MAX_GROUPS_PER_QUEUE} consumer "
                                "groups already",
                                QUOTA_EXCEEDED), ops
        if g is None:
            g = _Group(queue, name, address.rest, mode)
            queue.groups[key] = g
            if mode == STREAM:
                self._position(g, start)
        elif g.mode != mode:
            return self._refuse("mode", who, topic_filter,
                                f"group {key!r} of queue {queue.name!r} is a {g.mode} group"
                                ), ops
        elif mode == STREAM and stream_offset:
            self._position(g, start)
        self._leave(session, g)   # (a repeated SUBSCRIBE replaces the membership)
        member = _Member(session, min(qos, 2), explicit)
        g.members.append(member)
        self._memberships.setdefault(session, []).append((g, member))
        if session.persistent:
            g.stored_members[session.client_id] = member.qos | (4 if explicit else 0)
            self._stored_clients.add(session.client_id)
        ops.append(PutQueueGroup(queue.name, g.key, g.record()))
        self._pump(g)
        return None, ops

    def _position(self, group: _Group, start: tuple[str, float]) -> None:
        queue = group.queue
        kind, value = start
        if kind == "first":
            queue.oldest()
            offset = queue.first
        elif kind == "last":
            offset = queue.next_offset
        elif kind == "offset":
            offset = min(max(int(value), queue.first), queue.next_offset)
        else:
            offset = queue.next_offset
            for o, message in queue.log.items():
                if message.timestamp >= value:
                    offset = o
                    break
        group.next = offset

    def unsubscribe(self, session: Session, topic_filter: str, group: str | None = None
                    ) -> list[Op]:
        address = parse_queue_filter(topic_filter)
        if isinstance(address, str):
            return []
        queue = self.queues.get(address.queue)
        if queue is None:
            return []
        ops: list[Op] = []
        for g in list(queue.groups.values()):
            if g.filter != address.rest or (group is not None and g.name != group):
                continue
            if self._leave(session, g) or session.client_id in g.stored_members:
                g.stored_members.pop(session.client_id, None)
                ops.append(PutQueueGroup(queue.name, g.key, g.record()))
        return ops

    def _leave(self, session: Session, group: _Group) -> bool:
        memberships = self._memberships.get(session)
        if not memberships:
            return False
        for index, (g, member) in enumerate(memberships):
            if g is group:
                del memberships[index]
                if not memberships:
                    del self._memberships[session]
                group.members.remove(member)
                self._give_back(group, member)
                return True
        return False

    def _give_back(self, group: _Group, member: _Member) -> None:
        """``member``'s pending messages go back to its group at once."""
        back = [o for o, p in group.pending.items() if p.member is member]
        for offset in back:
            pending = group.pending.pop(offset)
            if pending.entry is not None:
                pending.entry.on_done = None
                member.session.take_back(pending.entry)
            heapq.heappush(group.ready, offset)
        member.outstanding = 0
        if back:
            self._pump(group)

    def member_left(self, session: Session) -> None:
        """``session`` goes offline: its pending messages go back to their groups
        (a persistent session stays a member, with no credit while offline)."""
        memberships = self._memberships.get(session)
        if not memberships:
            return
        self._leaving = session
        try:
            for group, member in list(memberships):
                if session.persistent:
                    self._give_back(group, member)
                else:
                    self._leave(session, group)
        finally:
            self._leaving = None

    def forget_session(self, session: Session) -> list[Op]:
        """``session`` is gone for good: it leaves every group."""
        ops: list[Op] = []
        for group, _member in list(self._memberships.get(session, ())):
            self._leave(session, group)
            if group.stored_members.pop(session.client_id, None) is not None:
                ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))
        return ops

    def link_drained(self, session: Session) -> None:
        """``session`` can take more (online again, a link drained): feed it."""
        for group, _member in list(self._memberships.get(session, ())):
            self._pump(group)

    def session_online(self, session: Session) -> None:
        """``session`` is online: a persistent one that was a member before a restart
        takes up its memberships (stored with the group), then it is fed."""
        if (session.persistent and session not in self._memberships
                and session.client_id in self._stored_clients):
            self._member_returned(session)
        self.link_drained(session)

    def _member_returned(self, session: Session) -> None:
        for queue in self.queues.values():
            for g in queue.groups.values():
                stored = g.stored_members.get(session.client_id)
                if stored is None:
                    continue
                if any(m.session is session for m in g.members):
                    continue
                member = _Member(session, stored & 3, bool(stored & 4))
                g.members.append(member)
                self._memberships.setdefault(session, []).append((g, member))

    # -- dispatch -----------------------------------------------------------------

    def _pump_queue(self, queue: _Queue) -> None:
        for group in list(queue.groups.values()):
            self._pump(group)

    def _credit(self, member: _Member) -> bool:
        session = member.session
        link = session.link
        if link is None or link.congested or session is self._leaving:
            return False
        prefetch = min(self.limits.queue_prefetch, session.window) if member.qos else \
            self.limits.queue_prefetch
        return member.outstanding < prefetch and not session.has_queued

    def _next_member(self, group: _Group) -> _Member | None:
        members = group.members
        n = len(members)
        for i in range(n):
            member = members[(group._rr + i) % n]
            if self._credit(member):
                group._rr = (group._rr + i + 1) % n
                return member
        return None

    def _pump(self, group: _Group) -> None:
        """Hand out what the group may have, round-robin over members with credit."""
        queue = group.queue
        if not group.members or (not group.ready and group.next >= queue.committed):
            return   # (nothing to hand out: most acknowledgements end here)
        ops: list[Op] = []
        mark = None
        again = False
        evicted = queue.evicted
        while True:
            offset = self._next_offset(group, ops)
            if offset is None:
                break
            if evicted and offset in evicted:
                # (its body is in storage: read back, then this pump again)
                self._read_back(queue, offset)
                break
            if group.mode == CLASSIC and offset >= group.watermark - _WATERMARK_STEP // 2:
                # Store the watermark further ahead before deliveries reach it.
                group.watermark = mark = offset + _WATERMARK_STEP
                ops.append(PutQueueGroup(queue.name, group.key, group.record()))
            if group.mode == CLASSIC and offset >= group.safe:
                break   # (sent once the watermark above it is durable: ``_stored``)
            member = self._next_member(group)
            if member is None:
                break
            self._take(group, offset)
            again = self._deliver(group, member, offset, queue.log[offset], ops) or again
        if again:
            ops.append(PutQueueGroup(queue.name, group.key, group.record()))
        if mark is not None:
            d = self._commit(ops)
            if d is not None:
                d.addCallbacks(self._stored, self._not_stored, callbackArgs=(group, mark),
                               errbackArgs=(group, mark))
                self.commits.watch(d, "recording a queue's dispatch watermark")
        elif ops or self._unsaved:
            self._commit(ops, "recording a queue delivery")

    def _not_stored(self, failure: Failure, group: _Group, mark: int) -> Failure:
        """The commit failed: the next pump stores the watermark again (or the
        group would wait for ``mark`` for ever)."""
        if group.watermark == mark:
            group.watermark = group.safe
        return failure

    def _stored(self, result: object, group: _Group, mark: int) -> object:
        """The watermark ``mark`` is durable: deliveries below it may go out (a
        crash after one of them counts it one more delivery on restart)."""
        if mark > group.safe:
            group.safe = mark
            self._pump(group)
        return result

    def _next_offset(self, group: _Group, ops: list[Op]) -> int | None:
        """The next offset this group would hand out (not taken yet)."""
        queue = group.queue
        log = queue.log
        if group.mode == CLASSIC:
            ready = group.ready
            while ready:
                offset = ready[0]
                if offset in log and offset not in group.done:
                    return offset
                heapq.heappop(ready)
        limit = queue.committed
        skip = queue.skip if queue.skip_starts else None
        while group.next < limit:
            offset = group.next
            if skip is not None:
                past = skip(offset)
                if past != offset:
                    group.next = past
                    continue
            message = log.get(offset)
            if group.mode == STREAM:
                if message is not None and group.matches(message):
                    return offset
                group.next = offset + 1
                continue
            if offset in group.done:     # (after a restart: acknowledged before it)
                group.next = offset + 1
                continue
            if message is not None and group.matches(message):
                return offset
            group.next = offset + 1
            group.done.add(offset)       # (not for this group: done with it)
            group.advance_floor()
            ops.append(QueueDone(queue.name, group.key, (offset,)))
        return None

    def _take(self, group: _Group, offset: int) -> None:
        if group.ready and group.ready[0] == offset:
            heapq.heappop(group.ready)
        elif group.next == offset:
            group.next = offset + 1

    def _deliver(self, group: _Group, member: _Member, offset: int, message: Message,
                 ops: list[Op]) -> bool:
        """Hand ``offset`` to ``member``; True when it was a classic redelivery,
        whose raised count the caller stores with the group's record (rare, so
        at once: a crash after it must not bring the message back with a lower
        count than the client has seen)."""
        queue = group.queue
        count = group.counts.get(offset, 0) + 1
        again = False
        if group.mode == CLASSIC:
            group.counts[offset] = count
            if count > 1:
                again = True
                group.redelivered += 1
                self.stats.redelivered += 1
        session = member.session
        # (MQTT 3.x clients get no properties: no metadata to build for them)
        delivered = (_with_metadata(message, queue.name, group.key, offset, count,
                                    group.mode == STREAM or again
                                    or offset in group.uncounted)
                     if session.protocol in _METADATA_PROTOCOLS else message)
        entry = session.deliver(delivered, member.qos, False)
        if entry is not None and entry.held:
            # (a persistent session holds its QoS 2 entries until their own commit;
            # this one is the queue's, durable already)
            entry.held = False
            session.pump()
        member.outstanding += 1
        self._arm()
        if group.mode == STREAM:
            if entry is None:
                member.outstanding -= 1
            else:
                entry.on_done = _stream_done(self, group, member)
                entry.qref = (queue.name, group.key, offset)
            return again
        if entry is None and member.qos:
            # (refused by the session's bound: visible again at once)
            member.outstanding -= 1
            group.counts[offset] = count - 1
            heapq.heappush(group.ready, offset)
            return False
        if entry is None and not member.explicit:
            # QoS 0 without explicit acknowledgements: acknowledged on send.
            member.outstanding -= 1
            self._done(group, offset, ops)
            group.acked += 1
            queue.acked += 1
            self.stats.acked += 1
            return False   # (finished: no count to keep)
        group.pending[offset] = _Pending(member, self.clock.seconds(), entry)
        if entry is not None:
            entry.qref = (queue.name, group.key, offset)
            if not member.explicit:
                entry.on_done = _transport_ack(self, group, offset, member)
        return again

    # -- the memory budget ----------------------------------------------------------

    def _protected(self, queue: _Queue) -> set[int]:
        """Offsets of ``queue`` whose bodies stay in memory: pending deliveries
        (their sessions hold the body anyway) and, for each group with members,
        what it hands out next (up to a read-back's worth)."""
        keep: set[int] = set()
        log = queue.log
        evicted = queue.evicted
        for group in queue.groups.values():
            keep.update(group.pending)
            if not group.members:
                continue
            if group.ready:
                keep.update(group.ready[:_READ_MESSAGES])
            count = size = 0
            offset = group.next
            end = queue.next_offset
            while offset < end and count < _READ_MESSAGES and size < _READ_BYTES:
                message = log.get(offset)
                if message is not None:
                    keep.add(offset)
                    count += 1
                    sizes = evicted.get(offset)
                    size += sizes[1] if sizes is not None else body_size(message)
                offset += 1
        return keep

    def _evict(self) -> None:
        """Over the memory budget: drop durable bodies from memory, those farthest
        from any consumer first (queues nobody consumes, then each queue's newest
        messages), down to the budget less an eighth (so that eviction runs once
        per so many bytes appended, not once per message)."""
        if self._reader is None:
            return
        slack = min(self.budget // 8, 8 << 20)
        target = self.budget - slack
        queues = sorted(self.queues.values(),
                        key=lambda q: any(g.members for g in q.groups.values()))
        waiting = False    # bodies whose commit is still to come (evicted after it)
        for queue in queues:
            if self.resident <= target:
                break
            if len(queue.evicted) >= len(queue.log):
                continue
            keep = self._protected(queue)
            evicted = queue.evicted
            unstored = queue.unstored
            durable = queue.durable
            log = queue.log
            for offset in reversed(list(log)):
                if offset >= durable:
                    waiting = True
                    continue
                if offset in evicted or offset in keep or (unstored and offset in unstored):
                    continue
                message = log[offset]
                body = body_size(message)
                evicted[offset] = (len(message.payload), body)
                log[offset] = stub(message)
                self.resident -= body
                self.evictions += 1
                if self.resident <= target:
                    break
        self._evict_above = (self.resident + slack if self.resident > target and not waiting
                             else 0)

    def _read_back(self, queue: _Queue, offset: int) -> None:
        """Read the evicted bodies from ``offset`` on (a batch) back from storage;
        the queue's groups pump again once they are in memory."""
        if queue.reading or self._reader is None:
            return
        evicted = queue.evicted
        offsets: list[int] = []
        size = 0
        o = offset
        end = queue.next_offset
        while o < end and len(offsets) < _READ_MESSAGES and (not offsets or size < _READ_BYTES):
            sizes = evicted.get(o)
            if sizes is not None:
                offsets.append(o)
                size += sizes[1]
            o += 1
        queue.reading = True
        d = self._reader(queue.name, offsets)
        d.addCallbacks(self._read_done, self._read_failed, callbackArgs=(queue, offsets),
                       errbackArgs=(queue,))

    def _read_done(self, found: list[tuple[int, Message]], queue: _Queue,
                   asked: list[int]) -> None:
        queue.reading = False
        if self.queues.get(queue.name) is not queue:
            return   # (deleted meanwhile)
        self._restored(found, queue)
        evicted = queue.evicted
        missing = [o for o in asked if o in evicted]
        if missing:
            # Storage no longer has them (it never drops a message before memory
            # does): never wait for them; their consumers go on past them.
            self.log.error("queue {q!r}: {n} message(s) not found in storage on reading "
                           "them back (offsets {a} to {b}); they are dropped",
                           q=queue.name, n=len(missing), a=missing[0], b=missing[-1])
            for offset in missing:
                self._forget(queue, offset)
        self._pump_queue(queue)

    def _read_failed(self, failure: Failure, queue: _Queue) -> None:
        queue.reading = False
        suppressed = self._log_limit.allow("queue:read-back")
        if suppressed is not None:
            self.log.error("queue {q!r}: reading messages back from storage failed: {e} "
                           "(tried again as consumers ask; {h} more since the last line)",
                           q=queue.name, e=failure.getErrorMessage(), h=suppressed)
        if not self.stopped:
            # (again in a second: not at once, in a loop, against a failing store)
            self.clock.callLater(1.0, self._pump_queue, queue)

    # -- acknowledgements ---------------------------------------------------------

    def _done(self, group: _Group, offset: int, ops: list[Op]) -> None:
        """``offset`` is finished for ``group`` (acknowledged or dead-lettered)."""
        group.counts.pop(offset, None)
        group.uncounted.discard(offset)
        if offset >= group.floor:
            group.done.add(offset)
            group.advance_floor()
        # (stored by the next ``_commit``, whoever makes it: ``_drain_done``)
        unsaved = self._unsaved.get(group)
        if unsaved is None:
            self._unsaved[group] = [offset]
        else:
            unsaved.append(offset)

    def _trim(self, queue: _Queue, ops: list[Op]) -> None:
        """Classic mode: a message leaves the log once every classic group is done
        with it (stream groups do not hold messages: retention ends them)."""
        groups = queue.groups.values()
        floors = [g.floor for g in groups if g.mode == CLASSIC]
        if not floors:
            return
        # (a stream group's cursor holds what it has not read yet too)
        upto = min(min(floors), min((g.next for g in groups if g.mode == STREAM),
                                    default=floors[0]))
        if upto <= queue.first:
            return
        waiters = queue.waiters
        for offset in range(queue.first, upto):
            self._remove(queue, offset)
            if waiters:
                waiter = waiters.pop(offset, None)
                if waiter is not None:
                    self._early.append(waiter)
        queue.first = upto
        ops.append(TrimQueue(queue.name, upto))
        self._removed()

    def transport_ack(self, group: _Group, offset: int, member: _Member) -> None:
        pending = group.pending.get(offset)
        if pending is None or pending.member is not member:
            return
        del group.pending[offset]
        member.outstanding -= 1
        ops: list[Op] = []
        self._done(group, offset, ops)
        group.acked += 1
        group.queue.acked += 1
        self.stats.acked += 1
        self._flush_soon()
        self._pump(group)

    def after_stream_ack(self, group: _Group) -> None:
        self._pump(group)

    def _find(self, session: Session, message_id: str | None, group_id: str | None,
              address: QueueAddress) -> tuple[_Group, int] | str:
        if not message_id:
            return "no message-id user property (it is <queue>:<offset>)"
        name, sep, digits = message_id.rpartition(":")
        if not sep or not digits.isdigit():
            return f"malformed message-id {message_id!r} (it is <queue>:<offset>)"
        if name != address.queue:
            return f"message-id {message_id!r} is not of queue {address.queue!r}"
        queue = self.queues.get(name)
        if queue is None:
            return f"no queue {name!r}"
        offset = int(digits)
        groups = ([queue.groups[group_id]] if group_id in queue.groups
                  else [] if group_id else list(queue.groups.values()))
        if not groups:
            return f"no group {group_id!r} on queue {name!r}"
        for g in groups:
            if not any(m.session is session for m in g.members):
                continue
            if g.mode == STREAM:
                return (g, offset)
            pending = g.pending.get(offset)
            if pending is not None and pending.member.session is session:
                return (g, offset)
        if not any(any(m.session is session for m in g.members) for g in groups):
            return (f"{session.client_id} is not a member of group "
                    f"{group_id or '(any)'!r} of queue {name!r}")
        return f"message {message_id!r} is not pending for {session.client_id}"

    def command(self, session: Session, topic: str,
                user_properties: Iterable[tuple[str, str]]
                ) -> tuple[Deferred[None] | None, Refusal | None]:
        """An acknowledgement published by an MQTT 5 member: ``$ack``, ``$nack`` or
        ``$reject`` with user properties ``message-id``, ``group-id`` (and
        ``reason``).  The Deferred fires once the change is durable."""
        address = parse_queue_topic(topic)
        if isinstance(address, str) or address.action is None:
            reason = address if isinstance(address, str) else "not an acknowledgement"
            return None, self._refuse("ack", session.client_id, topic, reason,
                                      TOPIC_NAME_INVALID)
        props: dict[str, str] = {}
        for key, value in user_properties:
            props.setdefault(key, value)
        found = self._find(session, props.get("message-id"), props.get("group-id"), address)
        if isinstance(found, str):
            return None, self._refuse("ack", session.client_id, topic, found)
        group, offset = found
        ops: list[Op] = []
        if group.mode == STREAM:
            if not group.queue.first <= offset < group.next:
                return None, self._refuse(
                    "ack", session.client_id, topic,
                    f"offset {offset} is not one group {group.key!r} has read "
                    f"({group.queue.first} to {group.next - 1})")
            if address.action == ACK:           # an explicit cursor commit
                group.cursor_saved = offset + 1
                group.cursor_saved_at = self.clock.seconds()
                ops.append(PutQueueGroup(group.queue.name, group.key,
                                         replace(group.record(), cursor=offset + 1)))
            return self._commit(ops), None
        pending = group.pending.pop(offset)
        pending.member.outstanding -= 1
        if pending.entry is not None:
            pending.entry.on_done = None
        if address.action == ACK:
            self._done(group, offset, ops)
            group.acked += 1
            group.queue.acked += 1
            self.stats.acked += 1
        elif address.action == NACK:
            self.stats.nacked += 1
            self._again(group, offset, ops, "nacked")
        else:
            self.stats.rejected += 1
            self._dead_letter(group, offset, props.get("reason") or "rejected", ops)
        d = self._commit(ops)
        self._pump(group)
        return d, None

    def settle(self, session: Session, entry: OutEntry, outcome: str, failed: bool,
               reason: str | None) -> None:
        """An AMQP outcome other than Accepted on a queue delivery: ``released``
        (nack, not counted), ``modified`` (nack; ``failed`` counts it), ``rejected``
        (dead-letter with ``reason``)."""
        ref = entry.qref
        if ref is None:
            return
        queue = self.queues.get(ref[0])
        group = queue.groups.get(ref[1]) if queue is not None else None
        session.take_back(entry)
        if group is None:
            return
        if group.mode == STREAM:
            # (no redelivery in a stream; the delivery is over all the same: its
            # member's prefetch is free again)
            done, entry.on_done = entry.on_done, None
            if done is not None:
                done()
            return
        offset = ref[2]
        pending = group.pending.get(offset)
        if pending is None or pending.member.session is not session:
            return
        del group.pending[offset]
        pending.member.outstanding -= 1
        ops: list[Op] = []
        if outcome == "rejected":
            self.stats.rejected += 1
            self._dead_letter(group, offset, reason or "rejected", ops)
        else:
            self.stats.nacked += 1
            if outcome == "released" or not failed:
                group.counts[offset] = max(0, group.counts.get(offset, 1) - 1)
                group.uncounted.add(offset)
            self._again(group, offset, ops, "released")
        self._commit(ops, "recording a queue settlement")
        self._pump(group)

    def _again(self, group: _Group, offset: int, ops: list[Op], why: str) -> None:
        """Visible again, or dead-lettered past ``--queue-max-deliveries``."""
        if group.counts.get(offset, 0) >= self.limits.queue_max_deliveries:
            self._dead_letter(
                group, offset,
                f"{why} after {group.counts.get(offset, 0)} deliveries "
                f"(--queue-max-deliveries {self.limits.queue_max_deliveries})", ops)
            return
        heapq.heappush(group.ready, offset)
        ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))

    def _dead_letter(self, group: _Group, offset: int, reason: str, ops: list[Op]) -> None:
        queue = group.queue
        message = queue.log.get(offset)
        count = group.counts.get(offset, 0)
        # Not consumed: its publisher waits for the commits (the dead letter's too,
        # which is in the same or a later one), never early.
        queue.waiters.pop(offset, None)
        self._done(group, offset, ops)
        if message is None:
            return
        queue.dead += 1
        self.stats.dead_lettered += 1
        if queue.name.startswith(DLQ_PREFIX):
            return   # (a dead-letter queue's dead messages go nowhere: counted)
        dlq = self._queue(DLQ_PREFIX + queue.name, ops)
        if dlq is None:
            return
        extra = (("origin-queue", queue.name), ("origin-offset", str(offset)),
                 ("origin-group", group.key), ("delivery-count", str(count)),
                 ("reason", reason))
        props = message.props or MessageProperties()
        dead = replace(message, topic=DLQ_PREFIX + message.topic[len(QUEUE_PREFIX):],
                       props=replace(props, user_properties=_without_metadata(
                           props.user_properties) + extra))
        self._append(dlq, dead, ops)

    # -- time ---------------------------------------------------------------------

    def _arm(self) -> None:
        """Tick in a second (only while something waits on time: an idle broker has
        no queue timer)."""
        if self._timer is None and not self.stopped:
            self._timer = self.clock.callLater(1.0, self._ticked)

    def _ticked(self) -> None:
        self._timer = None
        self.tick()
        if any((g.pending or (g.mode == STREAM and g.next != g.cursor_saved))
               for q in self.queues.values() for g in q.groups.values()) or any(
                   q.retention.max_age is not None and q.log for q in self.queues.values()):
            self._arm()

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def tick(self) -> None:
        """Visibility timeouts, takeovers, retention by age, stream cursors."""
        now = self.clock.seconds()
        timeout = self.limits.queue_visibility_timeout
        ops: list[Op] = []
        for queue in list(self.queues.values()):
            if queue.retention.max_age is not None:
                self._enforce_retention(queue, ops, now)
            for group in list(queue.groups.values()):
                if group.mode == STREAM:
                    if (group.next != group.cursor_saved
                            and now - group.cursor_saved_at >= _CURSOR_EVERY):
                        group.cursor_saved = group.next
                        group.cursor_saved_at = now
                        ops.append(PutQueueGroup(queue.name, group.key, group.record()))
                    continue
                if not group.pending:
                    continue
                expired = [o for o, p in group.pending.items() if p.since + timeout <= now]
                for offset in expired:
                    self._withdraw(group, offset)
                    self._again(group, offset, ops, "not acknowledged within the "
                                f"visibility timeout ({timeout:g} s)")
                self._takeover(group, now, timeout / 2, ops)
                self._pump(group)
        if ops:
            self._commit(ops, "recording queue timeouts")

    def _withdraw(self, group: _Group, offset: int) -> None:
        pending = group.pending.pop(offset)
        pending.member.outstanding -= 1
        if pending.entry is not None:
            pending.entry.on_done = None
            pending.member.session.take_back(pending.entry)

    def _takeover(self, group: _Group, now: float, after: float, ops: list[Op]) -> None:
        """An idle member (credit, nothing pending) takes over the messages pending
        on a member that has not acknowledged for half the visibility timeout."""
        if self._next_offset(group, ops) is not None:
            return
        idle = [m for m in group.members if m.outstanding == 0 and self._credit(m)]
        if not idle:
            return
        stale = [o for o, p in group.pending.items()
                 if p.since + after <= now and p.member not in idle]
        log = group.queue.log
        evicted = group.queue.evicted
        stale = [o for o in stale if o not in evicted]   # (pending ones never are)
        for index, offset in enumerate(stale[: self.limits.queue_prefetch * len(idle)]):
            self._withdraw(group, offset)
            # (straight to the idle member: the stale one must not get it back)
            self._deliver(group, idle[index % len(idle)], offset, log[offset], ops)
        if stale:
            ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))

    # -- restore --------------------------------------------------------------------

    def restore(self, records: Iterable[QueueRecord]) -> None:
        """Rebuild from storage.  Every message below a classic group's stored
        watermark that is not done counts one more delivery (it may have been
        delivered before the crash)."""
        for rec in records:
            retention = (Retention(*rec.retention) if rec.retention is not None
                         else self.default_retention(rec.name))
            queue = _Queue(rec.name, retention, rec.head)
            queue.next_offset = max(queue.next_offset, rec.next_offset)
            evicted = rec.evicted
            for offset, message in rec.messages:
                queue.log[offset] = message
                sizes = evicted.get(offset) if evicted else None
                if sizes is None:
                    queue.bytes += len(message.payload)
                    self.resident += body_size(message)
                else:   # (loaded without its body: ``load`` kept to the budget)
                    queue.evicted[offset] = sizes
                    queue.bytes += sizes[0]
                queue.next_offset = max(queue.next_offset, offset + 1)
            self.total_bytes += queue.bytes
            if queue.log:
                queue.first = min(queue.first, next(iter(queue.log)))
            queue.committed = queue.next_offset
            for key, g in rec.groups.items():
                group = _Group(queue, g.name, g.filter, g.mode)
                group.key = key
                group.floor = max(g.floor, queue.first) if g.mode == CLASSIC else g.floor
                group.done = {o for o in g.done if o >= group.floor}
                group.advance_floor()
                group.stored_members = dict(g.members)
                self._stored_clients.update(group.stored_members)
                if g.mode == STREAM:
                    group.next = group.cursor_saved = min(max(g.cursor, queue.first),
                                                          queue.next_offset)
                else:
                    group.watermark = group.safe = g.watermark
                    group.next = group.floor
                    counts = dict(g.counts)
                    for offset in range(group.floor, min(g.watermark, queue.next_offset)):
                        if offset in queue.log and offset not in group.done:
                            group.counts[offset] = counts.get(offset, 1)
                queue.groups[key] = group
                queue.next_offset = max(queue.next_offset, group.floor)
            self._skip_unstored_offsets(queue, rec.groups.values())
            queue.committed = queue.durable = queue.next_offset
            self.queues[rec.name] = queue
        self.alarm.check_total(self.total_bytes)
        if self.resident > self.budget > 0:
            self._evict()

    @staticmethod
    def _skip_unstored_offsets(queue: _Queue, stored: Iterable[QueueGroupRecord]) -> None:
        """Never give out again an offset that may have gone out before the crash,
        and let floors and cursors jump the offsets that hold no message.

        QoS 0/1 messages go to consumers before their append is durable, so one
        whose append the crash lost was seen with an offset the log no longer has
        (its publisher got no acknowledgement and sends it again: a new message).
        Every classic delivery is below its group's stored watermark: new messages
        start above the highest, so a message id (``queue:offset``) always names one
        message, and a consumer deduplicating by it never drops a new one.  Every
        offset below that with no message in the log (skipped at an earlier
        restart, lost in the crash, deleted one by one) never holds one: the
        queue's skipped ranges, found again at every restart from the log itself.
        """
        top = max((g.watermark for g in stored if g.mode == CLASSIC), default=0)
        end = max(queue.next_offset, top)
        ranges: list[list[int]] = []
        low = queue.first
        for offset in sorted(queue.log):
            if offset > low:
                ranges.append([low, offset])
            low = offset + 1
        if end > low:
            ranges.append([low, end])
        queue.next_offset = end
        queue.skip_starts = [r[0] for r in ranges]
        queue.skip_ends = [r[1] for r in ranges]
        for group in queue.groups.values():
            if group.mode == CLASSIC:
                group.advance_floor()
                group.next = max(group.next, group.floor)
            else:
                group.next = queue.skip(group.next)

    # -- console ---------------------------------------------------------------------

    def views(self) -> list[QueueView]:
        now = self.clock.seconds()
        out = []
        for name in sorted(self.queues):
            queue = self.queues[name]
            oldest = queue.oldest()
            dlq = self.queues.get(DLQ_PREFIX + name)
            groups = tuple(
                GroupView(g.key, g.name, g.filter, g.mode,
                          tuple(m.session.client_id for m in g.members),
                          g.next if g.mode == STREAM else g.floor,
                          g.lag(), len(g.pending), g.redelivered, g.acked)
                for g in queue.groups.values())
            out.append(QueueView(
                name, len(queue.log), queue.bytes,
                None if oldest is None else max(0.0, now - oldest.timestamp),
                queue.published, queue.acked, queue.dead, queue.expired,
                0 if dlq is None else len(dlq.log), queue.retention, groups,
                queue.first, queue.next_offset, len(queue.evicted)))
        return out

    def browse(self, name: str, start: int = 0, limit: int = 50) -> list[QueueMessageView]:
        queue = self.queues.get(name)
        if queue is None:
            return []
        out = []
        for offset, message in queue.log.items():
            if offset < start:
                continue
            props = message.props
            sizes = queue.evicted.get(offset)
            out.append(QueueMessageView(offset, message.topic, message.payload,
                                        message.timestamp, message.qos, message.publisher,
                                        props.user_properties if props else (),
                                        sizes is not None,
                                        len(message.payload) if sizes is None else sizes[0]))
            if len(out) >= limit:
                break
        return out

    def purge(self, name: str) -> Deferred[None] | None:
        """Remove every message of queue ``name`` (its groups stay)."""
        queue = self.queues.get(name)
        if queue is None:
            return None
        ops: list[Op] = []
        for offset in list(queue.log):
            self._forget(queue, offset)
        queue.first = queue.next_offset
        for group in queue.groups.values():
            group.ready.clear()
            group.done.clear()
            group.counts.clear()
            group.uncounted.clear()
            if group.mode == CLASSIC:
                group.floor = group.next = queue.next_offset
            else:
                group.next = max(group.next, queue.next_offset)
            ops.append(PutQueueGroup(name, group.key, group.record()))
        ops.append(TrimQueue(name, queue.next_offset))
        return self.commits.persist(ops)

    def delete(self, name: str) -> Deferred[None] | None:
        """Delete queue ``name`` with its messages and groups (members are dropped
        from it; a later message or consumer creates it anew)."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return None
        for group in queue.groups.values():
            self._disband(group)
        self.total_bytes -= queue.bytes
        self.resident -= sum(body_size(m) for o, m in queue.log.items()
                             if o not in queue.evicted)
        self._removed()
        return self.commits.persist([DeleteQueue(name)])

    def _disband(self, group: _Group) -> None:
        """Every member leaves ``group``, which is going away: what it has pending is
        taken back and given to nobody (not handed round the departing members)."""
        for member in group.members:
            memberships = self._memberships.get(member.session)
            if memberships:
                memberships[:] = [(g, m) for g, m in memberships if g is not group]
                if not memberships:
                    del self._memberships[member.session]
        for pending in group.pending.values():
            if pending.entry is not None:
                pending.entry.on_done = None
                pending.member.session.take_back(pending.entry)
        group.pending.clear()
        group.members.clear()

    def requeue(self, dlq_name: str, offset: int | None = None
                ) -> tuple[int, Deferred[None] | None]:
        """Move dead messages of ``$dlq/<name>`` (one, or all) back to their origin
        queue, as new messages; returns how many moved."""
        dlq = self.queues.get(dlq_name)
        if dlq is None or not dlq_name.startswith(DLQ_PREFIX):
            return 0, None
        offsets = [o for o in ([offset] if offset is not None else list(dlq.log))
                   if o in dlq.log]
        if not any(o in dlq.evicted for o in offsets):
            return self._requeue(dlq_name, dlq, offsets)
        # Some bodies are in storage only: read back and moved a batch at a time.
        batches = [offsets[i:i + _READ_MESSAGES]
                   for i in range(0, len(offsets), _READ_MESSAGES)]
        done: Deferred[None] = Deferred()

        def next_batch(_: object = None) -> None:
            if not batches or self.queues.get(dlq_name) is not dlq:
                done.callback(None)
                return
            batch = [o for o in batches.pop(0) if o in dlq.log]
            wanted = [o for o in batch if o in dlq.evicted]
            if not wanted or self._reader is None:
                moved(batch)
                return
            d = self._reader(dlq_name, wanted)
            d.addCallback(self._restored, dlq)
            d.addCallback(lambda _: moved(batch))
            d.addErrback(done.errback)

        def moved(batch: list[int]) -> None:
            batch = [o for o in batch if o in dlq.log and o not in dlq.evicted]
            d = self._requeue(dlq_name, dlq, batch)[1]
            if d is None:
                next_batch()
            else:
                d.addCallbacks(next_batch, done.errback)

        next_batch()
        return len(offsets), done

    def _restored(self, found: list[tuple[int, Message]], queue: _Queue) -> None:
        """Bodies read back from storage are in memory again."""
        evicted = queue.evicted
        log = queue.log
        for offset, message in found:
            if offset in evicted and offset in log:
                del evicted[offset]
                log[offset] = message
                self.resident += body_size(message)
                self.read_backs += 1
        if found and self.resident > self.budget > 0 and self.resident > self._evict_above:
            # What was read back counts against the budget as appends do: a replay
            # (a stream from its first offset) would otherwise keep it all.  (What
            # a consumer reads next is protected; when that alone is over the
            # budget, appends still evict as before: ``_evict_above`` is theirs.)
            above = self._evict_above
            self._evict()
            if self._evict_above:
                self._evict_above = above

    def _requeue(self, dlq_name: str, dlq: _Queue, offsets: list[int]
                 ) -> tuple[int, Deferred[None] | None]:
        ops: list[Op] = []
        moved = 0
        for o in offsets:
            message = dlq.log.get(o)
            if message is None:
                continue
            props = message.props
            origin = dlq_name[len(DLQ_PREFIX):]
            for key, value in (props.user_properties if props else ()):
                if key == "origin-queue":
                    origin = value
            target = self._queue(origin, ops)
            if target is None:
                break
            users = tuple(kv for kv in (props.user_properties if props else ())
                          if kv[0] not in DLQ_KEYS)
            again = replace(message, topic=QUEUE_PREFIX + origin + message.topic[
                len(dlq_name):], props=None if props is None else replace(
                    props, user_properties=users), timestamp=self.clock.seconds())
            self._forget(dlq, o)
            ops.append(DeleteQueueMessage(dlq_name, o))
            self._append(target, again, ops)
            moved += 1
        return moved, self._commit(ops)

    def set_retention(self, name: str, retention: Retention) -> Deferred[None] | None:
        queue = self.queues.get(name)
        if queue is None:
            return None
        queue.retention = retention
        ops: list[Op] = [PutQueue(name, retention.as_tuple())]
        self._enforce_retention(queue, ops, self.clock.seconds())
        d = self.commits.persist(ops)
        # Pending messages it dropped gave their members' credit back: use it now.
        self._pump_queue(queue)
        return d

    def depth(self) -> int:
        return sum(len(q.log) for q in self.queues.values())

    def delete_group(self, name: str, key: str) -> Deferred[None] | None:
        queue = self.queues.get(name)
        group = queue.groups.get(key) if queue is not None else None
        if queue is None or group is None:
            return None
        self._disband(group)
        del queue.groups[key]
        ops: list[Op] = [DeleteQueueGroup(name, key)]
        self._trim(queue, ops)
        return self.commits.persist(ops)


# The user properties a queue gives its deliveries (the seed's contract for MQTT 5;
# an AMQP receiver gets them as message annotations, see amqp.links), and those a
# dead-lettered one adds.
DLQ_KEYS = frozenset(("origin-queue", "origin-offset", "origin-group", "delivery-count",
                      "reason"))
# The protocols whose deliveries carry the metadata (MQTT 5 user properties, AMQP
# message annotations; the console's tail shows it too).
_METADATA_PROTOCOLS = frozenset(("mqtt5", "amqp", "console", ""))
METADATA_KEYS = frozenset(("message-id", "group-id", "queue", "offset", "delivery-count"))


def _without_metadata(users: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    if not users:
        return users
    return tuple(kv for kv in users if kv[0] not in METADATA_KEYS)


def _with_metadata(message: Message, queue: str, group: str, offset: int, count: int,
                   again: bool) -> Message:
    """The delivery's copy: the seed's metadata as user properties (MQTT 5 sees them;
    AMQP gets them as message annotations and header fields; MQTT 3.x nothing), and
    ``dup`` when the message was delivered before (``again``: AMQP's first-acquirer
    is then false; a stream read is never a first acquisition, it claims nothing)."""
    p = message.props
    users: tuple[tuple[str, str], ...] = (
        ("message-id", f"{queue}:{offset}"), ("group-id", group), ("queue", queue),
        ("offset", str(offset)), ("delivery-count", str(count)))
    m = message
    # (built field by field: ``dataclasses.replace`` twice was 9 us a delivery)
    if p is None:
        props = MessageProperties(None, None, None, None, None, users)
    else:
        props = MessageProperties(p.payload_format, p.expiry_interval, p.content_type,
                                  p.response_topic, p.correlation_data,
                                  (*_without_metadata(p.user_properties), *users))
    return Message(m.topic, m.payload, m.qos, m.retain, m.publisher, m.timestamp, again,
                   m.native, m.amqp_only, props)


def _transport_ack(manager: QueueManager, group: _Group, offset: int, member: _Member
                   ) -> Callable[[], None]:
    def done() -> None:
        manager.transport_ack(group, offset, member)
    return done


def _stream_done(manager: QueueManager, group: _Group, member: _Member
                 ) -> Callable[[], None]:
    def done() -> None:
        # (a reconnect gave the credit back already: ``_give_back``)
        member.outstanding = max(0, member.outstanding - 1)
        manager.after_stream_ack(group)
    return done

"""Queues as AMQP 0.9.1 declares them: the queue manager's queues with the
properties 0.9.1 gives them (durable, exclusive, auto-delete, arguments) and the
rules of ``queue.declare``, ``queue.delete``, ``queue.purge``, the consumers a
``basic.consume`` adds, ``basic.get``, and ``x-expires``'s timers.

A 0.9.1 queue *is* a queue of ``core.queues``: a durable queue ``orders`` is the
queue MQTT and AMQP 1.0 reach as ``$queue/orders/...``, and its 0.9.1 consumers
join its default consumer group (named after the queue, as AMQP 1.0 receivers
without ``consumer-group`` do).  Exclusive, auto-delete and server-named queues
are *transient*: queues of the queue manager that store nothing, gone with their
owner (``connection_closed``) or, auto-delete, when their last consumer goes.

What this module must not do: know the wire (the adapter maps frames to these
calls and ``ChannelError`` to ``channel.close``), or change a queue's messages
other than through the queue manager's commands.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.clock import DelayedCall
from mqttamqp.core.exchanges.arguments import (
    COMPARED,
    QueueArguments,
    parse_queue_arguments,
)
from mqttamqp.core.exchanges.errors import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    ChannelError,
    QueueDeclared,
)
from mqttamqp.core.persistence import Op, PutQueue, PutQueueArguments, QueueRecord
from mqttamqp.core.queues.addresses import QUEUE_PREFIX, STREAM, Consumer
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.queues.model import DeadLetterRoute, QueueLog, Retention, ready_count
from mqttamqp.core.sessions.session import Session

__all__ = ["DeclaredQueue", "QueueDeclarations", "queue_name_problem", "freeze",
           "freeze_value", "Frozen"]

Arguments = Mapping[str, object]
Frozen = tuple[tuple[str, object], ...]


def freeze(arguments: Arguments | None) -> Frozen:
    """A field table as a canonical, hashable value (sorted pairs; nested tables
    and arrays frozen too): what equivalence checks compare and storage keeps."""
    if not arguments:
        return ()
    return tuple(sorted((str(k), freeze_value(v)) for k, v in arguments.items()))


def freeze_value(value: object) -> object:
    if isinstance(value, Mapping):
        return freeze(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze_value(v) for v in value)
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    return str(value)   # (decimals, timestamps: compared and kept as text)


def thaw(frozen: Frozen) -> dict[str, object]:
    """A frozen field table as a mapping again (nested tables stay frozen)."""
    return dict(frozen)


def queue_name_problem(name: str) -> str | None:
    """Why 0.9.1 queue ``name`` cannot be a queue of the queue manager, or None.

    Names MQTT cannot address are refused: ``/`` (the ``$queue/`` separator), the
    wildcards ``+`` and ``#``, a leading ``$`` and NUL.  Celery's and kombu's names
    (``celery``, ``celery@host.celery.pidbox``, ``celeryev.<uuid>``, uuids) pass."""
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return f"queue name {name[:40]!r}... is longer than 255 bytes"
    for bad in ("/", "+", "#", "\x00"):
        if bad in name:
            return (f"queue name {name!r} holds {bad!r}: this broker's queues are also "
                    "MQTT's $queue/<name>, which cannot hold / + # or NUL")
    if name.startswith("$"):
        return f"queue name {name!r} starts with $ (reserved for the broker's namespaces)"
    return None


class DeclaredQueue:
    """What 0.9.1 said of a queue when it declared it."""

    __slots__ = ("arguments", "auto_delete", "consumers", "durable", "exclusive", "name",
                 "owner", "parsed", "transient")

    def __init__(self, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                 arguments: Frozen, owner: str | None, server_named: bool = False) -> None:
        self.name = name
        self.durable = durable
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.owner = owner          # the connection that declared it (exclusive: owns it)
        self.consumers = 0          # 0.9.1 consumers now (auto-delete: goes at 1 -> 0)
        # In memory only, never stored (``QueueLog.transient``).
        self.transient = not durable or exclusive or auto_delete or server_named
        self.parsed = QueueArguments()    # what this broker acts on of ``arguments``


class QueueDeclarations:
    """Declared queues over the queue manager: the rules of the 0.9.1 queue methods."""

    log: Logger   # (``Exchanges``')

    def __init__(self, queues: QueueManager) -> None:
        self.queues = queues
        self.declared: dict[str, DeclaredQueue] = {}
        self._expiry: dict[str, DelayedCall] = {}   # x-expires timers of unused queues
        # (however a queue is deleted, the console's delete too, its declaration
        # and bindings go with it, their stored ops in the delete's own commit)
        queues.attach_delete_hook(self._queue_deleted)

    # -- queue.declare ---------------------------------------------------------------

    def declare_queue(self, name: str, owner: str, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: Arguments | None = None, passive: bool = False
                      ) -> tuple[QueueDeclared, Deferred[None] | None]:
        """``queue.declare``: the queue (made if missing and not ``passive``) and the
        commit that stores a new durable one.  ``name`` "" makes up a server name
        ``amq.gen-<random>``; ``owner`` is the declaring connection's key."""
        if passive:
            if not name:
                raise ChannelError(NOT_FOUND, "a passive declare needs a queue name")
            self._existing(name, owner)
            return self._declared(name), None
        server_named = not name
        if server_named:
            name = "amq.gen-" + secrets.token_urlsafe(16).replace("-", "_")
        elif name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED,
                               f"queue name '{name}' contains reserved prefix 'amq.*'")
        problem = queue_name_problem(name)
        if problem is not None:
            raise ChannelError(PRECONDITION_FAILED, problem)
        frozen = freeze(arguments)
        parsed = parse_queue_arguments(arguments, durable, exclusive, auto_delete)
        if isinstance(parsed, str):
            raise ChannelError(PRECONDITION_FAILED, f"{parsed} for queue '{name}'")
        known = self.declared.get(name)
        existing = self.queues.queues.get(name)
        if known is None and existing is not None:
            # Made by MQTT or AMQP 1.0: a durable queue, which its first durable
            # 0.9.1 declaration describes.
            known = DeclaredQueue(name, True, False, False, frozen, None)
            self._equivalent(known, durable, exclusive, auto_delete, frozen)
            known.parsed = parsed
            self.declared[name] = known
            self._configure(existing, known)
            self._unused(known)
            return self._declared(name), self.queues.commits.persist(
                [PutQueue(name, existing.retention.as_tuple()),
                 PutQueueArguments(name, frozen)])
        if known is not None:
            self._check_lock(known, owner)
            self._equivalent(known, durable, exclusive, auto_delete, frozen)
            self._unused(known)
            return self._declared(name), None
        declared = DeclaredQueue(name, durable, exclusive, auto_delete, frozen, owner,
                                 server_named)
        declared.parsed = parsed
        retention = parsed.retention(self.queues.default_retention(name))
        queue, d = self.queues.declare(
            name, declared.transient,
            () if declared.transient else (PutQueue(name, retention.as_tuple()),
                                           PutQueueArguments(name, frozen)))
        if queue is None:
            raise ChannelError(PRECONDITION_FAILED,
                               f"too many queues (--queue-max-queues "
                               f"{self.queues.limits.queue_max_queues})")
        self.declared[name] = declared
        self._configure(queue, declared)
        self._unused(declared)
        return self._declared(name), d

    def _configure(self, queue: QueueLog, declared: DeclaredQueue) -> None:
        """What the declared arguments make of the queue manager's queue: its
        retention (the arguments' bounds over what it has: the defaults, or what
        an operator set in the console), overflow rule and dead-letter route."""
        parsed = declared.parsed
        default = queue.retention
        if parsed.overflow == "drop-head":
            queue.retention = parsed.retention(default)
            queue.reject_above = None
        else:
            queue.retention = Retention(
                parsed.age() if parsed.message_ttl is not None else default.max_age,
                default.max_bytes, default.max_messages,
                parsed.max_priority if parsed.max_priority is not None
                else default.max_priority)
            queue.reject_above = (parsed.max_length, parsed.max_length_bytes)
            queue.reject_dead = parsed.overflow == "reject-publish-dlx"
        queue.dead_letter = (self._dead_letter_route(queue.name, parsed)
                             if parsed.dead_letter_exchange is not None else None)
        queue.discard_rejected = parsed.dead_letter_exchange is None
        queue.set_max_priority(queue.retention.max_priority)

    def _dead_letter_route(self, name: str, parsed: QueueArguments) -> DeadLetterRoute:
        raise NotImplementedError   # (``Exchanges``)

    # -- x-expires -------------------------------------------------------------------

    def _unused(self, known: DeclaredQueue) -> None:
        """Queue ``known`` was used (declared, read) and has no consumer now: with
        ``x-expires`` it is deleted if nothing uses it for that long."""
        expires = known.parsed.expires
        if expires is None:
            return
        timer = self._expiry.pop(known.name, None)
        if timer is not None and timer.active():
            timer.cancel()
        if known.consumers == 0:
            self._expiry[known.name] = self.queues.clock.callLater(
                expires / 1000.0, self._expired, known.name)

    def stop(self) -> None:
        """The broker stops: no x-expires timer is left behind."""
        for timer in self._expiry.values():
            if timer.active():
                timer.cancel()
        self._expiry.clear()

    def _expired(self, name: str) -> None:
        self._expiry.pop(name, None)
        known = self.declared.get(name)
        if known is None or known.consumers:
            return
        queue = self.queues.queues.get(name)
        if queue is not None and any(g.members for g in queue.groups.values()):
            self._unused(known)   # (MQTT or AMQP 1.0 consumers use it: not yet)
            return
        self.queues.commits.watch(self._drop(name), "deleting expired queue " + name)

    def _equivalent(self, known: DeclaredQueue, durable: bool, exclusive: bool,
                    auto_delete: bool, arguments: Frozen) -> None:
        for what, mine, theirs in (("durable", known.durable, durable),
                                   ("exclusive", known.exclusive, exclusive),
                                   ("auto_delete", known.auto_delete, auto_delete)):
            if mine != theirs:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{what}' for queue '{known.name}' in vhost '/': "
                    f"received '{str(theirs).lower()}' but current is "
                    f"'{str(mine).lower()}'")
        if arguments != known.arguments:
            # (as RabbitMQ: only the arguments it knows are compared; others may
            # differ from one declaration to the next)
            mine_map, theirs_map = dict(known.arguments), dict(arguments)
            key = next((k for k in sorted(set(mine_map) | set(theirs_map))
                        if k in COMPARED and mine_map.get(k) != theirs_map.get(k)), None)
            if key is None:
                return
            raise ChannelError(
                PRECONDITION_FAILED,
                f"inequivalent arg '{key}' for queue '{known.name}' in vhost '/': "
                f"received {theirs_map.get(key)!r} but current is {mine_map.get(key)!r}")

    def _check_lock(self, known: DeclaredQueue, owner: str | None) -> None:
        if known.exclusive and known.owner != owner:
            raise ChannelError(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{known.name}' in "
                "vhost '/'. It could be originally declared on another connection or "
                "the exclusive property value does not match that of the original "
                "declaration.")

    def _existing(self, name: str, owner: str | None) -> QueueLog:
        """Queue ``name`` as a 0.9.1 method on it finds it (403 for the broker's
        ``$`` queues, ``$dlq/`` ones: reached by dead-lettering and MQTT only; 404
        if absent, 405 if another connection's exclusive queue)."""
        if name[:1] == "$":
            raise ChannelError(ACCESS_REFUSED,
                               f"queue '{name}' is the broker's: not for AMQP 0.9.1")
        queue = self.queues.queues.get(name)
        if queue is None:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '/'")
        known = self.declared.get(name)
        if known is not None:
            self._check_lock(known, owner)
        return queue

    def _declared(self, name: str) -> QueueDeclared:
        queue = self.queues.queues.get(name)
        if queue is None:
            return QueueDeclared(name, 0, 0)
        group = queue.groups.get(name)
        if group is None:
            return QueueDeclared(name, len(queue.log), 0)
        return QueueDeclared(name, ready_count(queue), len(group.members))

    # -- consumers -------------------------------------------------------------------

    def consumer_filter(self, name: str, owner: str | None = None,
                        arguments: Arguments | None = None) -> tuple[str, Consumer]:
        """What a ``basic.consume`` on queue ``name`` joins: the ``$queue/`` filter
        and the ``Consumer`` (the queue's default group, acknowledged by outcomes)
        to subscribe a session with (``Broker.add_topic_receiver``).  A stream queue
        reads from ``x-stream-offset`` (``first``, ``last``, an offset, a time).
        Call ``consumer_added`` once it joined, ``consumer_cancelled`` when it left."""
        self._existing(name, owner)
        known = self.declared.get(name)
        stream = known is not None and known.parsed.queue_type == STREAM
        offset = (arguments or {}).get("x-stream-offset") if stream else None
        return (QUEUE_PREFIX + name,
                Consumer(name, STREAM if stream else None,
                         None if offset is None else str(offset), explicit=False))

    def consumer_added(self, name: str) -> None:
        known = self.declared.get(name)
        if known is not None:
            known.consumers += 1
            timer = self._expiry.pop(name, None)
            if timer is not None and timer.active():
                timer.cancel()

    def consumer_cancelled(self, name: str) -> Deferred[None] | None:
        """A 0.9.1 consumer of queue ``name`` left (``basic.cancel``, its channel or
        connection closed): an auto-delete queue whose last consumer this was goes."""
        known = self.declared.get(name)
        if known is None:
            return None
        known.consumers = max(0, known.consumers - 1)
        if known.auto_delete and known.consumers == 0:
            return self._drop(name)
        self._unused(known)
        return None

    def get(self, name: str, session: Session, owner: str | None = None,
            no_ack: bool = False) -> tuple[bool, int]:
        """``basic.get``: whether a message was handed to ``session`` (an online
        session of the channel's, as ``Broker.add_topic_receiver`` makes but with
        no subscription: the delivery reaches its link's ``send_publish`` now, with
        a packet id to settle through ``Broker.acknowledged`` / ``Broker.settle``
        unless ``no_ack``), and the messages left (``get-ok``'s message count).
        What is unsettled goes back to the queue when the session goes."""
        self._existing(name, owner)
        result = self.queues.take_one(name, session, 0 if no_ack else 1)
        if result is None:
            raise ChannelError(PRECONDITION_FAILED,
                               f"queue '{name}' is a stream: consume it (basic.get "
                               "takes no message from a stream)")
        known = self.declared.get(name)
        if known is not None:
            self._unused(known)
        return result

    # -- queue.delete, queue.purge ---------------------------------------------------

    def delete_queue(self, name: str, owner: str | None = None, if_unused: bool = False,
                     if_empty: bool = False) -> tuple[int, Deferred[None] | None]:
        """``queue.delete``: how many messages went with it, and the commit."""
        queue = self.queues.queues.get(name)
        if queue is None and name[:1] != "$":
            return 0, None   # (RabbitMQ answers delete-ok for a missing queue)
        queue = self._existing(name, owner)
        # (as RabbitMQ: if-empty is checked first, and what consumers hold
        # unacknowledged does not count)
        count = ready_count(queue)
        if if_empty and count:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '/' not empty")
        if if_unused and any(g.members for g in queue.groups.values()):
            raise ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '/' in use")
        return count, self._drop(name)

    def purge_queue(self, name: str, owner: str | None = None
                    ) -> tuple[int, Deferred[None] | None]:
        """``queue.purge``: how many messages it removed (those no consumer holds
        unacknowledged), and the commit."""
        self._existing(name, owner)
        return self.queues.purge_ready(name)

    def _drop(self, name: str) -> Deferred[None] | None:
        """Queue ``name`` goes: its declaration, its bindings, and the queue
        manager's queue (``_queue_deleted`` runs as it goes)."""
        if name in self.queues.queues:
            return self.queues.delete(name)
        return self.queues.commits.persist(self._queue_deleted(name))

    def _queue_deleted(self, name: str) -> list[Op]:
        """Queue ``name`` is being deleted (by 0.9.1, x-expires, or the console's
        ``QueueManager.delete``): its declaration, x-expires timer and bindings go;
        the durable ops of that.  The bindings go first, while the declaration
        still says whether they were stored (a transient queue's were not; the
        delete of a durable auto-delete exchange whose last binding that was is
        stored all the same)."""
        timer = self._expiry.pop(name, None)
        if timer is not None and timer.active():
            timer.cancel()
        ops: list[Op] = []
        self._dropped_queue(name, ops)
        self.declared.pop(name, None)
        return ops

    def _dropped_queue(self, name: str, ops: list[Op]) -> None:
        """The bindings to queue ``name`` go (``Exchanges``)."""

    def connection_closed(self, owner: str) -> None:
        """Connection ``owner`` is gone: its exclusive queues go with it.  (Its
        consumers are the adapter's to cancel, ``consumer_cancelled``, which ends
        auto-delete queues whose last consumer they were.)"""
        for name, known in list(self.declared.items()):
            if known.exclusive and known.owner == owner:
                self.queues.commits.watch(self._drop(name), "deleting queue " + name)

    def restore_queues(self, records: list[QueueRecord]) -> None:
        """The durable queues 0.9.1 declared, as stored (after the queue manager's
        own restore)."""
        for rec in records:
            queue = self.queues.queues.get(rec.name)
            if rec.arguments is None or queue is None:
                continue
            known = DeclaredQueue(rec.name, True, False, False, tuple(rec.arguments), None)
            arguments = thaw(known.arguments)
            parsed = parse_queue_arguments(arguments, True, False, False)
            if (isinstance(parsed, str) and "x-overflow" in arguments
                    and arguments.get("x-queue-type") == "stream"):
                # A stream declared with x-overflow before that was refused: its
                # bounds act as a stream's, dropping the oldest.
                del arguments["x-overflow"]
                parsed = parse_queue_arguments(arguments, True, False, False)
                self.log.warn("queue {name}: a stream's x-overflow (declared before "
                              "this version refused it) is ignored; its bounds drop the "
                              "oldest message", name=rec.name)
            if not isinstance(parsed, str):   # (it was checked when declared)
                known.parsed = parsed
            self.declared[rec.name] = known
            self._configure(queue, known)
            self._unused(known)

"""The router's subscriptions: who may subscribe to what, subscribing and
unsubscribing (topic filters, shared groups, durable queue groups), the routes in
the trie, restore at start-up and the re-check when an identity or the ACL changes.
``Router`` (``core.routing.router``) is built on it and owns the state it uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import AllowAll, Authorizer, Identity
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.limits import Limits
from mqttamqp.core.persistence import DeleteSubscription, Op, PutSubscription, StoredQueued
from mqttamqp.core.queues.addresses import Consumer, is_queue_topic
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import SUBSCRIBE, UNSUBSCRIBE, Recorder
from mqttamqp.core.routing.groups import SharedGroups
from mqttamqp.core.routing.published import SUBSCRIBE_FAILURE
from mqttamqp.core.routing.shared import SHARE_PREFIX, parse_share
from mqttamqp.core.routing.suboptions import subscription_ids
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import SubscriptionTrie, validate_topic_filter

__all__ = ["DYNAMIC_PREFIX", "Subscriptions"]

# MQTT 5 reason codes the core gives for a refused filter (3.1.1 answers all with 0x80).
NOT_AUTHORIZED = 0x87
SHARED_NOT_SUPPORTED = 0x9E
WILDCARDS_NOT_SUPPORTED = 0xA2
# Dynamic nodes (AMQP receivers with a dynamic source): each topic under this prefix
# belongs to the one receiver that created it.  Anyone may publish to it (that is
# how replies reach it); nobody else may subscribe, and nothing there is retained.
DYNAMIC_PREFIX = "$dynamic/"


class Subscriptions:
    """The subscription half of ``Router`` (a base class: one object, no extra
    lookup on the paths that use both halves)."""

    log: ClassVar[Logger]   # (``Router``'s)
    # Set by ``Router.__init__``:
    limits: Limits
    _log_limit: LogLimiter
    clock: Clock
    commits: CommitBatcher
    stats: BrokerStats
    authorizer: Authorizer
    recorder: Recorder
    trie: SubscriptionTrie[Session]
    native: set[Session]
    _queues: QueueManager
    groups: SharedGroups

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        """A valid filter ``identity`` may subscribe to."""
        shared = parse_share(topic_filter)
        if isinstance(shared, str):
            return False
        inner = topic_filter if shared is None else shared[1]
        return (validate_topic_filter(inner) is None
                and not inner.startswith(DYNAMIC_PREFIX)
                and self.authorizer.may_subscribe(identity, inner))

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Session, identity: Identity,
                  requests: Sequence[tuple[str, int]], *, native: bool = False,
                  dynamic: bool = False, options: Sequence[int] = (),
                  consumer: Consumer | None = None
                  ) -> tuple[list[int], Deferred[None] | None]:
        """Add subscriptions; returns the SUBACK codes and the commit to wait for.

        ``native``: the session is an AMQP topic receiver's.  ``dynamic``: it is the
        receiver of a dynamic node, the one subscriber its address may have.
        ``options``: per request, MQTT 5 subscription options packed as in
        ``Session.sub_options`` (0: none).  ``consumer``: how a ``$queue/`` or
        ``$dlq/`` filter joins its queue (group, mode, ...; None: the defaults).
        """
        if native:
            self.native.add(session)
        codes: list[int] = []
        ops: list[Op] = []
        for index, (topic_filter, qos) in enumerate(requests):
            packed = options[index] if options else 0
            if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
                codes.append(self._subscribe_queue(session, identity, topic_filter, qos,
                                                   consumer, ops))
                continue
            shared = parse_share(topic_filter)
            if isinstance(shared, str):
                problem: str | None = shared
            else:
                problem = validate_topic_filter(topic_filter if shared is None else shared[1])
            if problem is not None:
                self.log.warn("{c} subscribed to an invalid filter {f!r}: {p}",
                              c=session.client_id, f=topic_filter, p=problem)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            if topic_filter.startswith(DYNAMIC_PREFIX) and not dynamic:
                self.log.warn("{c} subscribed to {f!r}: dynamic addresses belong to the "
                              "receiver that created them", c=session.client_id,
                              f=topic_filter)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            inner = topic_filter if shared is None else shared[1]
            # (--no-shared/wildcard-subscriptions are about MQTT clients: AMQP receivers
            # and the console's tail are ``native``.)
            if not native and shared is not None and not self.limits.shared_subscriptions:
                codes.append(SHARED_NOT_SUPPORTED)     # --no-shared-subscriptions
                continue
            if (not native and not self.limits.wildcard_subscriptions
                    and ("+" in inner or "#" in inner)):
                codes.append(WILDCARDS_NOT_SUPPORTED)  # --no-wildcard-subscriptions
                continue
            if not self.authorizer.may_subscribe(identity, inner):
                codes.append(NOT_AUTHORIZED)
                continue
            if (topic_filter not in session.subscriptions
                    and len(session.subscriptions) >= self.limits.max_subscriptions):
                self.stats.limit_hit("subscriptions")
                suppressed = self._log_limit.allow("subscriptions")
                if suppressed is not None:
                    self.log.warn("{c} has {n} subscriptions (--max-subscriptions); {f!r} "
                                  "refused ({h} more refusals since the last line)",
                                  c=session.client_id, n=len(session.subscriptions),
                                  f=topic_filter, h=suppressed)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            granted = min(qos, 2)
            session.set_subscription(topic_filter, granted)
            session.set_options(topic_filter, packed)
            self._route(topic_filter, session, granted)
            if session.persistent:
                # The options ride above the QoS bits of the stored value (old
                # values, 0-2, have none).
                ops.append(PutSubscription(session.client_id, topic_filter,
                                           granted | packed))
            codes.append(granted)
            self.recorder.event(self.clock.seconds(), SUBSCRIBE, session.client_id,
                                topic=topic_filter, qos=granted)
        return codes, self.commits.persist(ops)

    def _subscribe_queue(self, session: Session, identity: Identity, topic_filter: str,
                         qos: int, consumer: Consumer | None, ops: list[Op]) -> int:
        """Join the consumer group of a queue filter; returns the SUBACK code."""
        if not self.authorizer.may_subscribe(identity, topic_filter):
            return NOT_AUTHORIZED
        refusal, queue_ops = self._queues.subscribe(session, topic_filter, qos,
                                                   consumer or Consumer())
        ops.extend(queue_ops)
        if refusal is not None:
            return SUBSCRIBE_FAILURE
        granted = min(qos, 2)
        session.set_subscription(topic_filter, granted)
        if session.persistent:
            ops.append(PutSubscription(session.client_id, topic_filter, granted))
        self.recorder.event(self.clock.seconds(), SUBSCRIBE, session.client_id,
                            topic=topic_filter, qos=granted)
        return granted

    def unsubscribe(self, session: Session, filters: Sequence[str]) -> Deferred[None] | None:
        ops: list[Op] = []
        left = False
        for topic_filter in filters:
            session.sub_options.pop(topic_filter, None)
            if session.subscriptions.pop(topic_filter, None) is not None:
                self._unroute(topic_filter, session)
                left = left or topic_filter.startswith(SHARE_PREFIX)
                self.recorder.event(self.clock.seconds(), UNSUBSCRIBE, session.client_id,
                                    topic=topic_filter)
                if session.persistent:
                    ops.append(DeleteSubscription(session.client_id, topic_filter))
        if left:
            return self.groups.return_entries(session, False, ops)
        return self.commits.persist(ops)

    def restore_subscriptions(self, session: Session, subscriptions: dict[str, int],
                              queue: Sequence[tuple[int, StoredQueued]] = ()) -> None:
        """At start-up: the stored subscriptions of ``session``, back in the trie, and
        the MQTT 5 subscription identifiers of its restored entries (``queue``: their
        stored records, ``Session.restore``'s): those stored with each, found when it
        was routed; a record stored before they were kept (None) gets those of the
        restored filters that match it."""
        for topic_filter, stored in subscriptions.items():
            qos = stored & 0x03
            if stored & ~0x03:
                session.set_options(topic_filter, stored & ~0x03)
            session.set_subscription(topic_filter, qos)
            self._route(topic_filter, session, qos)
        if not queue:
            return
        stored_ids = {seq: q.subscription_ids for seq, q in queue}
        for entry in session.entries():
            ids = stored_ids.get(entry.seq, ())
            if ids is None:
                entry.subscription_ids = subscription_ids(session, entry.message.topic)
            elif ids:
                entry.subscription_ids = ids

    def recheck(self, session: Session, identity: Identity) -> list[Op]:
        """Drop the subscriptions of ``session`` that ``identity`` may not have (a
        session resumed by another identity, or the ACL changed); returns the ops."""
        if isinstance(self.authorizer, AllowAll):
            return []
        refused = [f for f in session.subscriptions if not self.may_subscribe(identity, f)]
        if not refused:
            return []
        self.log.info("{c}: subscriptions no longer allowed for {u} dropped: {f}",
                      c=session.client_id, u=repr(identity.username) if identity.username
                      else "an anonymous client", f=", ".join(repr(f) for f in refused[:10]))
        ops: list[Op] = []
        for topic_filter in refused:
            del session.subscriptions[topic_filter]
            session.sub_options.pop(topic_filter, None)
            self._unroute(topic_filter, session)
            if session.persistent:
                ops.append(DeleteSubscription(session.client_id, topic_filter))
        return ops

    # -- routes: the trie, or a shared group ------------------------------------

    def _route(self, topic_filter: str, session: Session, qos: int) -> None:
        if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
            return   # (a queue membership is the queue manager's: ``member_returned``)
        shared = parse_share(topic_filter)
        if not isinstance(shared, tuple):
            self.trie.add(topic_filter, session, qos)
            return
        self.groups.join(topic_filter, shared[0], shared[1], session, qos)

    def _unroute(self, topic_filter: str, session: Session) -> None:
        if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
            self.commits.background(self._queues.unsubscribe(session, topic_filter),
                                    "leaving a queue group")
            return
        if not self.groups.leave(topic_filter, session):
            self.trie.remove(topic_filter, session)

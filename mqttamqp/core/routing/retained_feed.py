"""Retained messages as the router keeps and replays them (``core.routing.retained``
is the store).

What it owns: keeping a published retained message (or deleting the topic's, on an
empty payload), within the store's bounds; what a new subscription is owed (the
topics that had a retained message when it subscribed) and feeding those to its
session as it has room (``Session.has_room``: its in-flight window for QoS 1/2,
its link's write buffer or credit for QoS 0), a slice per reactor turn, rather than
pushing them into its bounded queue at once; the broker's own ``$SYS`` retained
messages, at QoS 0.

What it must not do: route live messages (the router does, and tells it of a
retained one a session got live: ``by_session``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from twisted.logger import Logger

from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import DeleteRetained, Op, PutRetained
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.routing.published import SUBSCRIBE_FAILURE, release_held
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.routing.shared import SHARE_PREFIX
from mqttamqp.core.routing.suboptions import subscription_ids
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import SYS_PREFIX, is_sys_topic

__all__ = ["RetainedFeed", "REPLAY_SLICE"]
# Retained messages fed to a session in one go before the reactor gets a turn (the
# rest follows at once, or when the session has room again).
REPLAY_SLICE = 256


class _Replay:
    """The retained messages one subscription (``filter``) is still owed: the topics
    that had one when it subscribed (each read again when its turn comes: a message
    deleted meanwhile is skipped, a replaced one goes out as it is now, and one the
    session got live meanwhile, published retained, is not sent again: ``owed``)."""

    __slots__ = ("filter", "granted", "index", "owed", "topics")

    def __init__(self, topic_filter: str, topics: list[str], granted: int) -> None:
        self.filter = topic_filter
        self.topics = topics
        self.owed = set(topics)
        self.granted = granted
        self.index = 0


class RetainedFeed:
    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, commits: CommitBatcher, stats: BrokerStats,
                 limits: Limits, log_limit: LogLimiter, native: set[Session],
                 queue_full: Callable[[Session], None]) -> None:
        self.clock = clock
        self.commits = commits
        self.stats = stats
        self.limits = limits
        self._log_limit = log_limit
        self.native = native
        # Selective AMQP receivers: only what their selector is true of (the
        # router's ``selectors``, shared).
        self.selectors: dict[Session, Callable[[Message], bool]] = {}
        self._queue_full = queue_full
        self.retained = RetainedStore()
        # Retained messages owed to new subscriptions, by session (``send``).
        self.by_session: dict[Session, deque[_Replay]] = {}
        self._feeding: set[Session] = set()   # a slice is scheduled for these

    def keep(self, message: Message, ops: list[Op]) -> None:
        """A message published retained: kept (or, with an empty payload, the topic's
        deleted), with the ops that store it; not kept past the store's bounds."""
        durable = not message.topic.startswith(SYS_PREFIX)
        if not message.payload and not message.amqp_only:
            if self.retained.delete(message.topic) and durable:
                ops.append(DeleteRetained(message.topic))
        elif not durable or self.retained.room_for(
                message, self.limits.max_retained_messages,
                self.limits.max_retained_bytes):
            self.retained.put(message)
            if durable:
                ops.append(PutRetained(message.with_retain(True)))
        else:
            # Routed all the same; only not kept for later subscribers, and the
            # topic's older message goes (it would be out of date).
            if self.retained.delete(message.topic):
                ops.append(DeleteRetained(message.topic))
            self.stats.limit_hit("retained")
            suppressed = self._log_limit.allow("retained")
            if suppressed is not None:
                self.log.warn(
                    "retained message on {t!r} from {c} not kept: the retained store is "
                    "full (--max-retained-messages {n}, --max-retained-bytes {b}) "
                    "({h} more since the last line)", t=message.topic,
                    c=message.publisher, n=self.limits.max_retained_messages,
                    b=self.limits.max_retained_bytes, h=suppressed)

    def room(self, session: Session) -> None:
        """``session`` may have room again: feed it the retained messages it is owed."""
        if session in self.by_session:
            self.feed(session)

    def forget(self, session: Session) -> None:
        self.by_session.pop(session, None)

    def send(self, session: Session, grants: Iterable[tuple[str, int]]) -> None:
        """After SUBACK: the retained messages of each granted filter, retain set.

        They are not pushed at once into the session's bounded queue (where all but
        a queue's worth would drop): the topics that have one now are noted, and
        the messages are fed as the session has room (``Router.room``), each read when its
        turn comes."""
        replays = None
        for topic_filter, granted in grants:
            if granted >= SUBSCRIBE_FAILURE or topic_filter.startswith(SHARE_PREFIX):
                continue   # (never retained messages on a shared subscription)
            if is_sys_topic(topic_filter):
                with self.stats.own_messages():   # $SYS is not traffic (``stats``)
                    self._send_sys_retained(session, topic_filter)
                continue
            topics = [message.topic for message in self.retained.match(topic_filter)]
            pending = self.by_session.get(session)
            if pending is not None:
                # (one replay per filter: a SUBSCRIBE again replaces what it was owed)
                for old in [r for r in pending if r.filter == topic_filter]:
                    pending.remove(old)
                if not pending and not topics:
                    del self.by_session[session]
            if topics:
                if replays is None:
                    replays = self.by_session.get(session)
                    if replays is None:
                        replays = self.by_session[session] = deque()
                replays.append(_Replay(topic_filter, topics, granted))
        if replays is not None:
            self.feed(session)

    def feed(self, session: Session) -> None:
        """Send ``session`` the retained messages it is owed while it has room (at
        most ``REPLAY_SLICE`` before the reactor's next turn).  An offline
        persistent session queues QoS 1/2 ones up to its high-water mark (QoS 0 is
        not kept for it); the rest waits until it is back."""
        replays = self.by_session.get(session)
        if replays is None:
            return
        ops: list[Op] = []
        last_seq = 0
        now = self.clock.seconds()
        expired: list[str] = []
        native = session in self.native
        selector = self.selectors.get(session)
        budget = REPLAY_SLICE
        retained = self.retained
        limits = self.limits
        while replays:
            replay = replays[0]
            topics = replay.topics
            owed = replay.owed
            index = replay.index
            while index < len(topics):
                if topics[index] not in owed:
                    index += 1     # (sent live meanwhile, published retained)
                    continue
                message = retained.get(topics[index])
                if message is None or (message.amqp_only and not native) or (
                        selector is not None and not selector(message)):
                    index += 1     # deleted meanwhile, no MQTT form, or not selected
                    continue
                if message.props is not None and message.expired(now):
                    expired.append(message.topic)   # MQTT 5 message expiry
                    index += 1
                    continue
                qos = min(replay.granted, message.qos)
                if session.link is None:
                    if not qos:
                        index += 1     # (QoS 0 is not kept for an offline session)
                        continue
                    if (len(session.queue) * 2 >= limits.max_queued_messages
                            or session.queued_bytes * 2 >= limits.max_queued_bytes):
                        break
                elif not session.has_room(qos):
                    break
                if not budget:
                    if session not in self._feeding:
                        self._feeding.add(session)
                        self.clock.callLater(0, self._next_slice, session)
                    break
                budget -= 1
                index += 1
                entry = session.deliver(message, qos, True,
                                        subscription_ids(session, message.topic)
                                        if session.sub_options else ())
                if session.expired_ops:
                    ops.extend(session.take_expired_ops())
                if entry is None:
                    if qos:
                        self._queue_full(session)
                elif session.persistent:
                    ops.append(entry.put_op(session.client_id))
                    last_seq = entry.seq
            replay.index = index
            if index < len(topics):
                break
            replays.popleft()
        if not replays:
            del self.by_session[session]
        for topic in expired:
            if retained.delete(topic):
                ops.append(DeleteRetained(topic))
        d = self.commits.persist(ops)
        if d is not None:
            if last_seq:
                d.addCallback(release_held, [(session, last_seq)])
            self.commits.watch(d, "queueing retained messages")

    def _next_slice(self, session: Session) -> None:
        self._feeding.discard(session)
        self.feed(session)

    def _send_sys_retained(self, session: Session, topic_filter: str) -> None:
        """The broker's own retained ``$SYS`` messages: QoS 0 whatever was granted
        (never queued, never stored, never expiring)."""
        for message in self.retained.match(topic_filter):
            session.deliver(message, 0, True, subscription_ids(session, message.topic))

    def restore(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.retained.put(message)

"""Settlement: how a subscriber's answer to a delivery ends it.

What it owns: the rules for PUBACK, PUBREC, PUBCOMP and an AMQP receiver's
outcome (Accepted, Rejected, Released, Modified; ``Outcome``), for every protocol
alike: the session's in-flight state changes (stored in the background), the
session may take more (``Router.room``), paused publishers may resume, a
rejected delivery is dropped and counted, a released one goes out again, and a
durable queue's delivery is settled by its queue (``QueueManager.settle``); a
delivery whose outcome a transaction holds (``hold``) is exempt from its queue's
visibility timeout and takeover, and is checked still to be the same delivery
before its commit (``still_held``: a packet id freed and reused by another
message is not).

What it must not do: send anything itself (a session's link does, when it is
given room) or wait on a commit before answering: an acknowledgement only ever
frees space.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.queues.model import ConsumerGroup, Pending
from mqttamqp.core.routing.router import Router
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.flow import FlowControl
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats

__all__ = ["Outcome", "Settlement"]


class Outcome(Enum):
    """How an AMQP receiver settled a delivery (AMQP 1.0 §3.4)."""

    ACCEPTED = "accepted"   # done
    REJECTED = "rejected"   # dropped, counted
    RELEASED = "released"   # redeliver unchanged
    MODIFIED = "modified"   # redeliver; a failed attempt counts in delivery-count


# (an Enum member read from its class is a lookup each time: settle runs per AMQP
# delivery)
_ACCEPTED, _REJECTED = Outcome.ACCEPTED, Outcome.REJECTED
_RELEASED, _MODIFIED = Outcome.RELEASED, Outcome.MODIFIED


class Settlement:
    def __init__(self, commits: CommitBatcher, stats: BrokerStats, router: Router,
                 flow: FlowControl, queues: QueueManager) -> None:
        self._commits = commits
        self._stats = stats
        self._router = router
        self._flow = flow
        self._queues = queues
        # What ``Router.room`` and ``FlowControl.resume_paused`` look at first (the
        # same objects): read per acknowledgement, so they are called only with work.
        self._replays = router.retained_feed.by_session
        self._waiting = router.groups.waiting
        self._paused = flow.paused

    def acknowledged(self, session: Session, packet_id: int) -> None:
        """PUBACK (or Accepted on an AMQP delivery of QoS 1)."""
        # (``Session.acknowledge``'s lines, and ``CommitBatcher.background``'s inside
        # a batch: every QoS 1 PUBACK comes here, and each call cost more than it did)
        entry = session.inflight.get(packet_id)
        if entry is not None and entry.qos == 1:
            ops = session._finish(entry)
            if ops:
                commits = self._commits
                if commits._depth and not commits.stopping:
                    commits._ops.extend(ops)
                else:
                    commits.background(ops)
        if session in self._replays or self._waiting:   # (``Router.room``'s tests)
            self._router.room(session)
        if self._paused:
            self._flow.resume_paused()

    def received(self, session: Session, packet_id: int) -> None:
        """PUBREC: PUBREL goes out once the RELEASED state is durable."""
        d = self._commits.persist(session.received(packet_id))
        if d is not None:
            d.addCallback(lambda _: session.pubrel_durable(packet_id))
            self._commits.watch(d, "recording a PUBREC")

    def completed(self, session: Session, packet_id: int) -> None:
        """PUBCOMP (or the final settle of a QoS 2 delivery over AMQP)."""
        self._commits.background(session.completed(packet_id))
        self._router.room(session)
        self._flow.resume_paused()

    def rejected(self, session: Session, packet_id: int, reason: str | None = None) -> None:
        """AMQP Rejected: the delivery is dropped, counted (a durable queue's goes to
        its dead-letter queue with ``reason``)."""
        entry = session.inflight.get(packet_id)
        if entry is not None and entry.receipt is not None:
            entry.receipt.settled(entry, "rejected", False, reason)
            return
        self._stats.messages_rejected += 1
        session.dropped_rejected += 1
        self._commits.background(session.drop(packet_id))
        self._router.room(session)
        self._flow.resume_paused()

    def settle(self, session: Session, packet_id: int, outcome: Outcome,
               failed: bool = False, reason: str | None = None) -> None:
        """An AMQP receiver settled the delivery of ``packet_id`` with ``outcome``
        (``failed``: Modified with delivery-failed; ``reason``: Rejected's error
        description).  Accepted finishes QoS 1, and QoS 2 unless an FE released it
        through ``$mqtt.<id>.pubrel`` (then AMQP_PUBREL's settle completes it).
        On a durable queue's delivery: Accepted acknowledges, Released and Modified
        make it visible again (not once released: then only AMQP_PUBREL's settle
        counts, as on a topic), Rejected dead-letters it."""
        if outcome is not _ACCEPTED:
            if outcome is not _REJECTED and session.awaiting_release(packet_id):
                return   # (its client has it: AMQP_PUBREL's settle completes it)
            entry = session.inflight.get(packet_id)
            if entry is not None and entry.receipt is not None:
                entry.receipt.settled(entry, outcome.value, failed, reason)
                return
            if outcome is _RELEASED or outcome is _MODIFIED:
                session.redeliver(packet_id, failed)
                return
        if outcome is _REJECTED:
            self.rejected(session, packet_id, reason)
        elif session.awaiting_release(packet_id) is False:
            if session.inflight[packet_id].qos == 1:
                self.acknowledged(session, packet_id)
            else:
                self.completed(session, packet_id)

    def accept_many(self, deliveries: Iterable[tuple[Session, int]]) -> None:
        """Accepted on each of ``deliveries`` (session, packet id), as ``settle``
        would do one by one: AMQP 0.9.1's ``basic.ack`` (multiple).  The common
        case, a durable queue's QoS 1 delivery to a member that acknowledges by
        its transport, is finished in place, and the sessions and the queues'
        groups are pumped once for the batch rather than once a delivery; any
        other delivery takes ``settle`` (and its session is pumped and fed then,
        in the middle of the batch: ``InflightWindow._finish``)."""
        queues = self._queues
        sessions: list[Session] = []
        groups: list[ConsumerGroup] = []
        last_session: Session | None = None
        last_group: ConsumerGroup | None = None
        for session, packet_id in deliveries:
            entry = session.inflight.get(packet_id)
            receipt = entry.receipt if entry is not None else None
            if (entry is None or entry.qos != 1 or type(receipt) is not Pending
                    or receipt.member.explicit):
                self.settle(session, packet_id, _ACCEPTED)
                continue
            session.accepted_quietly(entry)
            if queues.accepted_quietly(receipt):
                group = receipt.group
                if group is not last_group and group not in groups:
                    groups.append(group)
                last_group = group
            if session is not last_session and session not in sessions:
                sessions.append(session)
            last_session = session
        if not (sessions or groups):
            return
        queues.after_accepts(groups)
        router = self._router
        for session in sessions:
            session.pump()
            if session.queue_waiting is not None:
                session.feed_queues()
            router.room(session)
        self._flow.resume_paused()

    # -- outcomes a transaction holds (core/transactions.py) -----------------------------

    @staticmethod
    def hold(session: Session, packet_id: int) -> OutEntry | None:
        """A transaction holds the outcome of ``session``'s in-flight ``packet_id``:
        a queue's delivery stays claimed (no visibility timeout, no takeover) until
        ``unhold``.  Returns the delivery's entry, the token ``still_held`` checks
        (None: not in flight)."""
        entry = session.inflight.get(packet_id)
        if entry is not None:
            receipt = entry.receipt
            if isinstance(receipt, Pending):
                receipt.tx_held = True
        return entry

    @staticmethod
    def unhold(entry: OutEntry | None) -> None:
        """The transaction that held ``entry``'s outcome ended."""
        receipt = entry.receipt if entry is not None else None
        if isinstance(receipt, Pending):
            receipt.tx_held = False

    def still_held(self, session: Session, packet_id: int, entry: OutEntry | None) -> bool:
        """``entry`` (from ``hold``) is still ``session``'s in-flight ``packet_id``
        (not taken back, redelivered elsewhere, or its packet id reused by another
        message), or a queue's delivery its link's end left claimed for the
        transaction (``settle_kept``); a queue's still its group's pending one."""
        if entry is None:
            return False
        receipt = entry.receipt
        if isinstance(receipt, Pending):
            group = receipt.group
            queue = group.queue
            if (group.pending.get(receipt.offset) is not receipt
                    or self._queues.queues.get(queue.name) is not queue
                    or queue.groups.get(group.key) is not group):
                return False
            if receipt.entry is None:      # (kept: its session let it go)
                return receipt.tx_held
        return session.inflight.get(packet_id) is entry

    def settle_kept(self, entry: OutEntry | None, outcome: Outcome, failed: bool = False,
                    reason: str | None = None) -> bool:
        """Settle a queue's delivery that stayed claimed for its transaction after
        its link ended (``Membership._give_back``); False (nothing done) if
        ``entry`` is not such a delivery."""
        receipt = entry.receipt if entry is not None else None
        if (not isinstance(receipt, Pending) or receipt.entry is not None
                or not receipt.tx_held
                or receipt.group.pending.get(receipt.offset) is not receipt):
            return False
        assert entry is not None
        receipt.tx_held = False
        if outcome is _ACCEPTED:
            receipt.owner.transport_ack(receipt)
        else:
            receipt.owner.settle(receipt, entry, outcome.value, failed, reason)
        return True

"""The session registry: sessions by client id, who holds each, takeover, the end of
a session, expiry; it builds the table of live connections (``live``).

What it owns: the sessions of client ids (MQTT clients, and AMQP
``$mqtt.to.<id>.publish`` receivers, which claim the same sessions) and the
sessions of AMQP topic receivers (in the trie, but keyed by link, so no client
can claim them); the clean/persistent rules; takeover (a newcomer closes the old
holder first, whose will fires unless the newcomer resumes the persistent
session); what the end of a connection means for its
session and its MQTT will; expiry of offline persistent sessions; the ``$SYS``
drop counts (``DropCounts``).  The live connections, their counts and events are
``live.LiveConnections``'s, whose register methods it hands out.

What it must not do: route (the router does), hold wills (``Wills`` does), or
touch sockets beyond the ``close`` of a holder it takes a session from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Final

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import Identity
from mqttamqp.core.clients.dropcounts import DropCounts
from mqttamqp.core.clients.live import LiveConnections
from mqttamqp.core.clients.wills import Wills
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.commits import CommitBatcher, all_durable
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import WillMessage
from mqttamqp.core.persistence import DeleteSession, Op, PutSession, SessionRecord
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.recorder import (
    CAUSE_LOST,
    CAUSE_TAKEN_OVER,
    SESSION_CLEARED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_RESUMED,
    Recorder,
    records,
)
from mqttamqp.core.routing.router import Router
from mqttamqp.core.sessions.entries import ClientLink
from mqttamqp.core.sessions.flow import FlowControl
from mqttamqp.core.sessions.session import Session, SessionState
from mqttamqp.core.stats import BrokerStats
from mqttamqp.records import final_record

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5: a session expiry interval that means never
# The connect path's session events' fields (``Recorder.fields_event``: no keywords)
_CREATED_FIELDS = ("clean_session",)
_RESUMED_FIELDS = ("queued",)

__all__ = ["SessionRegistry", "Opened"]


@final_record
class Opened:
    """The result of claiming a session: the session, MQTT's session-present flag,
    and the commit that must precede CONNACK (None: nothing to wait for).  Made once
    per MQTT CONNECT: a ``@final_record``, native in the compiled build (made by a
    compiled ``__init__``, read by its fields, not by name)."""

    session: Final[Session]
    present: Final[bool]
    durable: Final[Deferred[None] | None]

    def __init__(self, session: Session, present: bool,
                 durable: Deferred[None] | None) -> None:
        self.session = session
        self.present = present
        self.durable = durable


class SessionRegistry:
    log: ClassVar[Logger] = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, limits: Limits, commits: CommitBatcher,
                 stats: BrokerStats, router: Router, wills: Wills,
                 flow: FlowControl, recorder: Recorder, queues: QueueManager) -> None:
        self.clock = clock
        self.queues = queues
        self.recorder = recorder
        self._recording = records(recorder)
        self.limits = limits
        self.commits = commits
        self.stats = stats
        self.router = router
        self.wills = wills
        self.flow = flow
        self.sessions: dict[str, Session] = {}
        # AMQP topic receivers' sessions: in the trie, keyed by link, not client id.
        self.link_subscribers: dict[str, Session] = {}
        # Live connections (after CONNACK, AMQP open): the console's list, $SYS's
        # counts, the CONNECT and DISCONNECT events and the disconnect lines.
        self.connections = LiveConnections(clock, stats, commits, recorder)
        self.register_connection = self.connections.register_connection
        self.unregister_connection = self.connections.unregister_connection
        self.register_client = self.connections.register_client
        self.unregister_client = self.connections.unregister_client
        # What sessions dropped and hold, for $SYS, the console and the metrics.
        self.drops = DropCounts(self.sessions, self.link_subscribers, router.groups)
        # client id -> (the offline session, its MQTT 5 expiry timer): at most one
        # timer per client id, whoever armed it (see ``_arm_expiry``).
        self._expiry_timers: dict[str, tuple[Session, DelayedCall]] = {}
        # Persistent sessions whose record no commit is known to hold yet (its
        # PutSession submitted and not durable, or failed): resuming one of them
        # stores the record again before CONNACK says "session present".  Every other
        # persistent session is stored, so resuming it with the same owner and expiry
        # needs no commit before CONNACK (see ``open``).  At most one entry per
        # session, dropped when its commit succeeds or the session is discarded.
        self._unsettled: dict[str, Session] = {}

    def restore(self, records: dict[str, SessionRecord]) -> None:
        now = self.clock.seconds()
        for rec in records.values():
            session = Session(rec.client_id, True, self.limits, rec.last_seen)
            # Its client may have been connected until the broker stopped: the expiry
            # clock restarts with the broker rather than expiring it at once.
            session.last_seen = max(rec.last_seen, now)
            session.owner = rec.owner
            session.restore(rec.queue, rec.inbound_qos2)
            self.router.restore_subscriptions(session, rec.subscriptions, rec.queue)
            self.sessions[rec.client_id] = session
            # An MQTT 5 session expiry interval, like --session-expiry, counts from
            # the start (the client may have been connected until the stop).
            session.expiry = rec.expiry
            self._arm_expiry(session)

    def online(self) -> Iterator[Session]:
        """Every session something is delivering to (client ids and topic receivers)."""
        for session in self.sessions.values():
            if session.link is not None:
                yield session
        yield from self.link_subscribers.values()

    # -- claiming and ending --------------------------------------------------

    def take_over(self, client_id: str, reason: str = "taken over",
                  fire_will: bool = True) -> None:
        """Close whoever holds the session of ``client_id``.  Its will fires unless
        ``fire_will`` is False (the newcomer resumes the persistent session: the
        client is back, not gone) or it never got its CONNACK (then its will was
        never accepted); a will not fired is deleted."""
        existing = self.sessions.get(client_id)
        if existing is None or existing.connection is None:
            return
        old = existing.connection
        never_accepted = existing.state is SessionState.CONNECTING
        self.commits.watch(
            self.end(old, existing, clean=never_accepted or not fire_will, reason=reason,
                     cause=CAUSE_TAKEN_OVER), "ending session of " + client_id)
        old.close("session taken over by a new connection")

    def open(self, connection: ClientLink, client_id: str, clean: bool,
             will: WillMessage | None, identity: Identity | None = None,
             expiry: float | None = None, now: float | None = None) -> Opened:
        """Claim the session of ``client_id`` for ``connection``.

        Takes over from a connection that holds it, applies the clean/persistent
        rules and stores the MQTT will.  Call ``activate`` once CONNACK is out.
        ``expiry`` (MQTT 5's session expiry interval; None for 3.1.1) separates
        the two things clean session meant: ``clean`` (clean start) only says
        whether an existing session is resumed, and the session outlives the
        connection by ``expiry`` seconds (0: not at all; kept as persistent while
        connected, so a resumed session's state is not thrown away early).  ``now``:
        the caller's clock reading of this turn (one float a client less).
        """
        now = self.clock.seconds() if now is None else now
        ops: list[Op] = []
        if self.wills.timed and self.wills.owner_returned(client_id):
            self.log.info("client {c} is back within the will grace period; its old "
                          "will is not published", c=client_id)
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            # Resuming a persistent session (clean session 0) means the client is
            # back: its old connection's will is not published (as Mosquitto).  A
            # newcomer that starts clean ends the old session, and the will fires.
            resumes = not clean and existing.persistent
            if resumes and client_id in self.wills.wills:
                self.log.info("client {c} connected again and resumes its session: closing "
                              "its previous connection without publishing its will",
                              c=client_id)
            else:
                self.log.info("client {c} connected again: closing its previous connection",
                              c=client_id)
            self.take_over(client_id, fire_will=not resumes)
            existing = self.sessions.get(client_id)
            now = self.clock.seconds()   # (after the DISCONNECT that recorded)
        # The session is claimed: no expiry timer may outlive this point, neither one
        # armed when it went offline nor the one the takeover just armed by ending
        # the old holder's connection (it would expire the session later on its old
        # interval, whatever the newcomer's DISCONNECT says).
        if client_id in self._expiry_timers:   # (a call less for the many without)
            self._cancel_expiry(client_id)
        present = False
        user = identity.username if identity is not None else None
        persistent = not clean if expiry is None else expiry > 0
        record = False   # a PutSession goes into this CONNECT's commit
        if clean and existing is not None:
            ops.extend(self.discard(existing, "clean_session"))
            now = self.clock.seconds()   # (after the SESSION_CLEARED that recorded)
        if not clean and existing is not None and existing.persistent:
            session = existing
            present = True
            # A stored session resumed as it is (same owner, same expiry) changes
            # nothing stored: "session present" promises only what its commits
            # already hold, so CONNACK waits for no commit of its own.  The stored
            # last_seen stays older (a restart counts expiry from the start anyway;
            # ``end`` stores it when the connection ends): a takeover's reconnect
            # storm is then not one commit per CONNECT.
            claimed = session.owner is None and user is not None
            if claimed or session.expiry != expiry or client_id in self._unsettled:
                if claimed:
                    session.owner = user     # an anonymous session is claimed by its user
                ops.append(PutSession(client_id, now, session.owner, expiry))
                record = True
            if identity is not None:     # what it subscribed to must still be allowed
                ops.extend(self.router.recheck(session, identity))
        else:
            session = Session(client_id, persistent, self.limits, now)
            session.owner = user
            self.sessions[client_id] = session
            if persistent:
                ops.append(PutSession(client_id, now, user, expiry))
                record = True
        if expiry is not None or present:   # (a new session's is None already)
            session.expiry = expiry
        if present:
            self.recorder.fields_event(now, SESSION_RESUMED, client_id, _RESUMED_FIELDS,
                                       (len(session.queue) + len(session.inflight),))
        else:
            self.recorder.fields_event(now, SESSION_CREATED, client_id, _CREATED_FIELDS,
                                       (clean,))
        session.last_seen = now
        session.claim(connection)
        if will is not None and not self.wills.allowed(will, identity):
            self.log.warn("will of {c} on {t!r} is not authorized; ignored", c=client_id,
                          t=will.topic)
            will = None
        if will is not None:
            ops.extend(self.wills.put(will))
        elif client_id in self.wills.wills:
            ops.extend(self.wills.pop(client_id, "mqtt"))
        durable = self.commits.persist(ops) if ops else None
        if record:
            self._settle_on(session, durable)
        return Opened(session, present, durable)

    def activate(self, session: Session, link: ClientLink, protocol: str) -> None:
        """CONNACK went out (an AMQP link attached): deliver in-flight and queued
        messages to ``link``.  (The broker's ``activate``: here, compiled, rather
        than a method of the interpreted ``Broker``, once per connect.)"""
        if session.protocol:   # (a new session has none: nothing to relabel)
            self.drops.relabel(session, protocol)
        session.protocol = protocol
        session.attach(link)
        queues = self.queues
        # ``session_online`` does nothing for a session in no consumer group, not
        # browsing a queue and not a returning member (``Membership``'s tables, read
        # here: most connects, and each call of the interpreted queue manager's
        # ``session_online`` → ``link_drained`` → ``super()`` was three frames).
        if (session in queues._memberships or queues._browsers
                or (session.persistent and queues._stored_clients)):
            queues.session_online(session)
        self.router.room(session)

    def _settle_on(self, session: Session, durable: Deferred[None] | None) -> None:
        """``session``'s record is in the commit ``durable``: unsettled until it
        succeeds (a failure leaves it so: the next resume stores it again)."""
        client_id = session.client_id
        self._unsettled[client_id] = session
        if durable is None:       # (no ops: not with a PutSession among them)
            return

        def settled(result: object) -> object:
            if self._unsettled.get(client_id) is session:
                del self._unsettled[client_id]
            return result

        durable.addCallback(settled)

    def offline_session(self, client_id: str, owner: str | None = None
                        ) -> tuple[Session, Deferred[None] | None]:
        """The persistent session of ``client_id``, created offline if it has none
        (the subscription service provisions sessions before their devices connect),
        owned by ``owner``.  A clean session held by a connection is returned as it is."""
        session = self.sessions.get(client_id)
        if session is not None:
            return session, None
        now = self.clock.seconds()
        session = Session(client_id, True, self.limits, now)
        session.owner = owner
        self.sessions[client_id] = session
        self.recorder.event(now, SESSION_CREATED, client_id, clean_session=False,
                            detail="subscription service")
        durable = self.commits.persist([PutSession(client_id, now, owner)])
        self._settle_on(session, durable)
        return session, durable

    def end(self, connection: ClientLink, session: Session, clean: bool,
            reason: str, cause: str = CAUSE_LOST,
            expiry: float | None = None) -> Deferred[None] | None:
        """The connection that holds ``session`` is gone.

        ``clean`` is True for MQTT DISCONNECT (the will is deleted, not published);
        any other end publishes the will.  A clean session is discarded; a
        persistent one stays with its subscriptions and queue.  ``expiry``: the
        session expiry interval an MQTT 5 DISCONNECT gave in place of CONNECT's
        (None: unchanged); the expiry timer starts on it.
        """
        if session.connection is not connection:
            return None  # already ended (takeover, console) — nothing to do twice
        if expiry is not None:
            session.expiry = expiry
        if self.commits.stopping:
            session.detach()
            return None
        client_id = session.client_id
        ops: list[Op] = []
        fired = None
        if clean:
            ops.extend(self.wills.pop(client_id, "mqtt"))
        else:
            delay = _will_delay(self.wills, session)
            if delay > 0:
                self.wills.fire_later(client_id, delay, reason, cause)
            else:
                fired = self.wills.fire(client_id, reason, "mqtt", cause)
        ops.extend(self.router.member_left(session))
        session.detach()
        kept = session.persistent and session.expiry != 0
        if kept:
            session.last_seen = self.clock.seconds()
            ops.append(PutSession(client_id, session.last_seen, session.owner, session.expiry))
            self._arm_expiry(session)
        else:
            ops.extend(self.discard(session))
        self.flow.resume_paused()
        durable = self.commits.persist(ops)
        if kept:
            # Unsettled until that commit holds it (a DISCONNECT's new expiry, a
            # takeover's DeleteWill): a resume before then, or after it failed,
            # stores the record again and its CONNACK waits for that commit.
            self._settle_on(session, durable)
        return all_durable([fired, durable])

    # MQTT 5 session expiry intervals: one timer per offline session that has one
    # (--session-expiry's loop keeps the sessions of 3.1.1 clients).  Arming always
    # replaces the client id's timer, so a timer never outlives the interval it was
    # armed for; claiming and discarding the session cancel it.

    def _arm_expiry(self, session: Session) -> None:
        self._cancel_expiry(session.client_id)
        expiry = session.expiry
        if expiry is None or expiry >= NEVER_EXPIRES:
            return
        self._expiry_timers[session.client_id] = (
            session, self.clock.callLater(expiry, self._expire_one, session))

    def _cancel_expiry(self, client_id: str) -> None:
        armed = self._expiry_timers.pop(client_id, None)
        if armed is not None and armed[1].active():
            armed[1].cancel()

    def _expire_one(self, session: Session) -> None:
        armed = self._expiry_timers.get(session.client_id)
        if armed is not None and armed[0] is session:
            del self._expiry_timers[session.client_id]
        if self.sessions.get(session.client_id) is not session or session.connection:
            return
        self.log.info("session {c} expired (session expiry interval {e:g}s)",
                      c=session.client_id, e=session.expiry)
        self.recorder.event(self.clock.seconds(), SESSION_EXPIRED, session.client_id,
                            reason="session expiry interval")
        self.commits.background(self.discard(session))

    def stop_timers(self) -> None:
        for _, timer in self._expiry_timers.values():
            if timer.active():
                timer.cancel()
        self._expiry_timers.clear()

    def discard(self, session: Session, reason: str | None = None) -> list[Op]:
        """Remove a session: subscriptions out of the trie, state dropped.  A
        persistent one removed for ``reason`` is recorded as cleared."""
        if reason is not None and session.persistent:
            self.recorder.event(self.clock.seconds(), SESSION_CLEARED, session.client_id,
                                reason=reason)
        self.router.forget_session(session)
        self.drops.retire(session)
        session.clear_messages()
        armed = self._expiry_timers.get(session.client_id)
        if armed is not None and armed[0] is session:
            self._cancel_expiry(session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if self._unsettled.get(session.client_id) is session:
            del self._unsettled[session.client_id]
        return [DeleteSession(session.client_id)] if session.persistent else []

    # -- AMQP topic receivers -------------------------------------------------

    def add_link_subscriber(self, key: str) -> Session:
        """A session of its own for an AMQP topic receiver (offline until attached)."""
        session = Session(key, False, self.limits, self.clock.seconds())
        session.protocol = "amqp"
        self.link_subscribers[key] = session
        return session

    def remove_link_subscriber(self, key: str) -> None:
        """The topic receiver is gone: its routes leave the trie, its drops are kept."""
        session = self.link_subscribers.pop(key, None)
        if session is None:
            return
        self.commits.watch(self.commits.persist(self.router.member_left(session)),
                           "moving shared messages of " + key)
        self.router.forget_session(session)
        self.drops.retire(session)
        session.clear_messages()
        session.detach()
        self.flow.resume_paused()

    # -- expiry ---------------------------------------------------------------

    def expire(self) -> None:
        cutoff = self.clock.seconds() - self.limits.session_expiry
        expired = [s for s in self.sessions.values()
                   if s.persistent and s.connection is None and s.last_seen < cutoff
                   and s.expiry is None]
        ops: list[Op] = []
        for session in expired:
            self.log.info("persistent session {c} expired (offline since {t:.0f})",
                          c=session.client_id, t=session.last_seen)
            self.recorder.event(self.clock.seconds(), SESSION_EXPIRED, session.client_id,
                                reason="offline longer than --session-expiry")
            ops.extend(self.discard(session))
        self.commits.background(ops)


def _will_delay(wills: Wills, session: Session) -> float:
    """MQTT 5: seconds to hold the will of ``session``'s client: its will delay
    interval, but no longer than the session lives (0: at once)."""
    will = wills.wills.get(session.client_id)
    if will is None or not will.delay or session.expiry is None or will.origin != "mqtt":
        return 0.0
    return min(will.delay, session.expiry if session.persistent else 0.0)

"""The router: sessions by client id, the subscription trie, retained messages,
wills, limits and counters.  Protocols (MQTT, AMQP) and the console drive it.

What it owns: who is connected to which session, takeover, clean/persistent
session rules, routing (trie match, delivery QoS = min(publish, granted), one copy
per session at the highest granted QoS), retained messages, wills (including the
grace rule after a restart), session expiry, ``$SYS`` topics.

What it must not do: parse bytes, touch sockets, or wait on storage.  Every durable
change is handed to the ``StateStore`` as operations; callers that must promise
durability (PUBACK, PUBREC, CONNACK, AMQP Accepted) chain on the returned Deferred.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp import __version__
from mqttamqp.core.auth import AllowAll, Authenticator, Authorizer, Credentials, Identity
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.connections import InspectableConnection
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import (
    DeleteRetained,
    DeleteSession,
    DeleteSubscription,
    DeleteWill,
    Op,
    PutRetained,
    PutSession,
    PutSubscription,
    PutWill,
    StateStore,
)
from mqttamqp.core.retained import RetainedStore
from mqttamqp.core.session import ClientLink, OutEntry, Session, SessionState
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import SubscriptionTrie, validate_topic_filter, validate_topic_name

__all__ = ["Broker", "SUBSCRIBE_FAILURE"]

SUBSCRIBE_FAILURE = 0x80
_SYS_PREFIX = "$SYS/"


class Broker:
    log = Logger()

    def __init__(self, clock: Clock, store: StateStore, limits: Limits | None = None,
                 authenticator: Authenticator | None = None,
                 authorizer: Authorizer | None = None) -> None:
        self.clock = clock
        self.store = store
        self.limits = limits if limits is not None else Limits()
        self.authenticator: Authenticator = authenticator or AllowAll()
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.sessions: dict[str, Session] = {}
        self.trie: SubscriptionTrie[Session] = SubscriptionTrie()
        self.retained = RetainedStore()
        self.wills: dict[str, WillMessage] = {}
        self.stats = BrokerStats()
        self.connections: dict[str, InspectableConnection] = {}
        self._connection_protocols: dict[str, str] = {}
        self._grace: dict[str, DelayedCall] = {}
        # paused publisher key -> (resume callback, the congested sessions it fed)
        self._paused: dict[
            int, tuple[Callable[[], None], list[Session] | None, DelayedCall]] = {}
        self._loops: list[LoopingCall] = []
        self._dropped_retired = 0  # drops of sessions that no longer exist
        # Set when the process shuts down: connections then end without firing wills
        # (the grace rule decides at the next start) and nothing more is stored.
        self.stopping = False
        # Set by every publish(): an online subscriber it fed is past its high-water
        # mark, so the publishing connection should stop reading for a while.
        self.last_publish_congested: list[Session] = []
        self._batch_depth = 0
        self._batch_ops: list[Op] = []
        self._batch_waiters: list[Deferred[None]] = []
        self._batch_flushes: list[Callable[[], None]] = []
        # AMQP receivers on topic filters: sessions of their own, in the trie but not
        # keyed by a client id (no MQTT client can claim them).
        self.link_subscribers: dict[str, Session] = {}

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Rebuild from the store, arm the grace timers of orphaned wills and loops."""
        now = self.clock.seconds()
        self.stats.started = now
        snap = self.store.load()
        for message in snap.retained.values():
            self.retained.put(message)
        for record in snap.sessions.values():
            session = Session(record.client_id, True, self.limits, record.last_seen)
            # Its client may have been connected until the broker stopped: the expiry
            # clock restarts with the broker rather than expiring it at once.
            session.last_seen = max(record.last_seen, now)
            session.restore(record.queue, record.inbound_qos2)
            for topic_filter, qos in record.subscriptions.items():
                session.subscriptions[topic_filter] = qos
                self.trie.add(topic_filter, session, qos)
            self.sessions[record.client_id] = session
        for owner, will in snap.wills.items():
            # The owner was connected when the broker stopped: it lost its connection
            # without a clean close, unless it comes back within the grace period.
            self.wills[owner] = will
            self._grace[owner] = self.clock.callLater(
                self.limits.will_grace, self._grace_expired, owner)
        if snap.wills:
            self.log.info("{n} stored will(s) will be published in {s}s unless their "
                          "clients reconnect", n=len(snap.wills), s=self.limits.will_grace)
        self.log.info("loaded {r} retained message(s), {s} persistent session(s)",
                      r=len(snap.retained), s=len(snap.sessions))
        self._start_loop(self.publish_sys, self.limits.sys_interval)
        if self.limits.session_expiry > 0:
            self._start_loop(self.expire_sessions, min(60.0, self.limits.session_expiry))

    def _start_loop(self, fn: Callable[[], object], interval: float) -> None:
        if interval <= 0:
            return
        loop = LoopingCall(fn)
        loop.clock = self.clock  # type: ignore[assignment]
        loop.start(interval, now=True).addErrback(
            lambda f: self.log.failure("periodic task {fn} failed", f, fn=fn.__name__))
        self._loops.append(loop)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()
        for call in self._grace.values():
            if call.active():
                call.cancel()
        self._grace.clear()
        for key in list(self._paused):
            self.forget_paused(key)

    # -- storage --------------------------------------------------------------

    def persist(self, ops: Sequence[Op]) -> Deferred[None] | None:
        """Submit ``ops``; the Deferred fires once durable (None: nothing to wait for).

        Inside ``batch()`` the ops are collected and submitted together when the
        outermost batch ends, in the same order, so one socket read full of
        PUBLISH or PUBACK packets costs one hand-off to the writer thread.
        """
        if not ops:
            return None
        if self.stopping:
            # Shutting down: nothing more is stored, so nothing may be acknowledged.
            return Deferred()
        if self._batch_depth:
            self._batch_ops.extend(ops)
            waiter: Deferred[None] = Deferred()
            self._batch_waiters.append(waiter)
            return waiter
        return self.store.submit(ops)

    def barrier(self) -> Deferred[None]:
        """Fires once everything submitted so far is durable."""
        if self.stopping:
            return Deferred()
        if self._batch_depth:
            waiter: Deferred[None] = Deferred()
            self._batch_waiters.append(waiter)
            return waiter
        return self.store.submit(())

    def begin_batch(self) -> None:
        self._batch_depth += 1

    def flush_after_batch(self, flush: Callable[[], None]) -> bool:
        """Inside a batch: call ``flush`` when it ends (a connection writes what the
        batch gave it in one go) and return True; outside one, return False."""
        if not self._batch_depth:
            return False
        self._batch_flushes.append(flush)
        return True

    def end_batch(self) -> None:
        self._batch_depth -= 1
        if self._batch_depth:
            return
        if self._batch_flushes:
            flushes, self._batch_flushes = self._batch_flushes, []
            for flush in flushes:
                try:
                    flush()
                except Exception:  # one connection's failure must not hold up the rest
                    self.log.failure("writing a connection's output failed", Failure())
        if not (self._batch_ops or self._batch_waiters):
            return
        ops, waiters = self._batch_ops, self._batch_waiters
        self._batch_ops, self._batch_waiters = [], []
        if self.stopping:
            return
        d = self.store.submit(ops)
        if waiters:
            d.addCallbacks(_fire_all, _fail_all, callbackArgs=(waiters,),
                           errbackArgs=(waiters, self._log_store_failure))
        else:
            d.addErrback(self._log_store_failure, "recording a batch of changes")

    # -- authentication -------------------------------------------------------

    def authenticate(self, credentials: Credentials) -> Deferred[bool]:
        result: Deferred[bool] = maybeDeferred(  # type: ignore[call-overload]
            self.authenticator.authenticate, credentials)
        return result

    # -- connections and sessions ---------------------------------------------

    def register_connection(self, key: str, connection: InspectableConnection,
                            protocol: str) -> None:
        """A connection is live (after CONNACK / AMQP open): the console lists it and
        ``$SYS`` counts it as a client (``protocol``: mqtt3.1, mqtt3.1.1 or amqp)."""
        known = self._connection_protocols.get(key)
        if known is not None:
            if self.connections[key] is connection:
                return
            # The key's previous holder is closing but not yet gone (e.g. after an
            # MQTT DISCONNECT): the newcomer takes its place, and its later
            # unregister_connection is a no-op.
            self.stats.disconnected(known)
        self.connections[key] = connection
        self._connection_protocols[key] = protocol
        self.stats.connected(protocol)

    def unregister_connection(self, key: str, connection: InspectableConnection) -> None:
        if self.connections.get(key) is connection:
            del self.connections[key]
            self.stats.disconnected(self._connection_protocols.pop(key))

    def open_session(self, connection: ClientLink, client_id: str, clean: bool,
                     will: WillMessage | None, identity: Identity | None = None
                     ) -> tuple[Session, bool, Deferred[None] | None]:
        """Claim the session of ``client_id`` for ``connection``.

        Takes over from a connection that holds it (the old one is closed and its
        will fires), applies clean/persistent rules and stores the will.  Returns
        the session, the session-present flag and a Deferred for the commit that
        must precede CONNACK.  Call ``activate`` once CONNACK is out.
        """
        now = self.clock.seconds()
        ops: list[Op] = []
        grace = self._grace.pop(client_id, None)
        if grace is not None and grace.active():
            grace.cancel()
            self.log.info("client {c} is back within the will grace period; its old "
                          "will is not published", c=client_id)
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            old = existing.connection
            self.log.info("client {c} connected again: closing its previous connection",
                          c=client_id)
            # One that never got its CONNACK had its will not yet accepted.
            never_accepted = existing.state is SessionState.CONNECTING
            self.end_session(old, existing, clean=never_accepted, reason="taken over")
            old.close("session taken over by a new connection")
            existing = self.sessions.get(client_id)
        present = False
        if clean:
            if existing is not None:
                ops.extend(self._discard(existing))
            session = Session(client_id, False, self.limits, now)
            self.sessions[client_id] = session
        elif existing is not None and existing.persistent:
            session = existing
            present = True
            ops.append(PutSession(client_id, now))
        else:
            session = Session(client_id, True, self.limits, now)
            self.sessions[client_id] = session
            ops.append(PutSession(client_id, now))
        session.last_seen = now
        session.connection = connection
        session.state = SessionState.CONNECTING
        if will is not None and not self._will_allowed(will, identity):
            self.log.warn("will of {c} on {t!r} is not authorized; ignored", c=client_id,
                          t=will.topic)
            will = None
        if will is not None:
            self.wills[client_id] = will
            ops.append(PutWill(will))
        elif self._pop_will(client_id, "mqtt") is not None:
            ops.append(DeleteWill(client_id))
        return session, present, self.persist(ops)

    def activate(self, session: Session, link: ClientLink, protocol: str) -> None:
        """CONNACK went out: deliver in-flight and queued messages to ``link``."""
        session.protocol = protocol
        session.attach(link)

    def end_session(self, connection: ClientLink, session: Session, clean: bool,
                    reason: str) -> None:
        """The connection that holds ``session`` is gone.

        ``clean`` is True for MQTT DISCONNECT (the will is deleted, not published);
        any other end publishes the will.  A clean session is discarded; a
        persistent one stays with its subscriptions and queue.
        """
        if session.connection is not connection:
            return  # already ended (takeover, console) — nothing to do twice
        if self.stopping:
            session.detach()
            return
        client_id = session.client_id
        ops: list[Op] = []
        if clean:
            if self._pop_will(client_id, "mqtt") is not None:
                ops.append(DeleteWill(client_id))
        else:
            self.fire_will(client_id, reason, "mqtt")
        session.detach()
        if session.persistent:
            session.last_seen = self.clock.seconds()
            ops.append(PutSession(client_id, session.last_seen))
        else:
            ops.extend(self._discard(session))
        self._resume_paused()
        d = self.persist(ops)
        if d is not None:
            d.addErrback(self._log_store_failure, "ending session of " + client_id)

    # -- AMQP receivers ------------------------------------------------------------
    #
    # An AMQP will (origin "amqp") is keyed by the name of the will link that set it
    # and belongs to that link: claiming or ending the session of the same client id
    # through a ``$mqtt.to.<id>.publish`` receiver neither publishes nor deletes it.

    def add_link_subscriber(self, key: str, session: Session) -> None:
        """Register the own session of an AMQP topic receiver (subscribe it after)."""
        self.link_subscribers[key] = session

    def remove_link_subscriber(self, key: str) -> None:
        """The topic receiver is gone: its routes leave the trie, its drops are kept."""
        session = self.link_subscribers.pop(key, None)
        if session is None:
            return
        for topic_filter in session.subscriptions:
            self.trie.remove(topic_filter, session)
        session.subscriptions.clear()
        self._dropped_retired += session.dropped
        session.clear_messages()
        session.detach()
        self._resume_paused()

    def _discard(self, session: Session) -> list[Op]:
        """Remove a session: subscriptions out of the trie, state dropped."""
        for topic_filter in session.subscriptions:
            self.trie.remove(topic_filter, session)
        self._dropped_retired += session.dropped
        session.clear_messages()
        session.subscriptions.clear()
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        return [DeleteSession(session.client_id)] if session.persistent else []

    # -- wills ----------------------------------------------------------------

    def _will_allowed(self, will: WillMessage, identity: Identity | None) -> bool:
        if validate_topic_name(will.topic) is not None:
            return False
        identity = identity or Identity(will.owner)
        return self.authorizer.may_publish(identity, will.topic, will.retain)

    def set_will(self, will: WillMessage) -> Deferred[None] | None:
        """Store (or replace) the will of ``will.owner`` (AMQP_WILL, also mid-connection)."""
        self.wills[will.owner] = will
        return self.persist([PutWill(will)])

    def _pop_will(self, owner: str, origin: str | None) -> WillMessage | None:
        """Remove the will of ``owner``; with ``origin``, only a will set that way.

        An MQTT client and an AMQP will link may share a name (the contract names
        the will link after the client id): each side only ends its own will.
        """
        will = self.wills.get(owner)
        if will is None or (origin is not None and will.origin != origin):
            return None
        del self.wills[owner]
        return will

    def clear_will(self, owner: str, origin: str | None = None) -> Deferred[None] | None:
        if self._pop_will(owner, origin) is None:
            return None
        return self.persist([DeleteWill(owner)])

    def fire_will(self, owner: str, reason: str, origin: str | None = None) -> bool:
        """Publish the will of ``owner`` (if any; of ``origin`` if given) and delete it."""
        will = self._pop_will(owner, origin)
        if will is None:
            return False
        self.log.info("publishing will of {o} to {t!r} ({r})", o=owner, t=will.topic, r=reason)
        self.stats.wills_published += 1
        d = self.publish(will.as_message(self.clock.seconds()), extra_ops=[DeleteWill(owner)])
        if d is not None:
            d.addErrback(self._log_store_failure, "publishing will of " + owner)
        return True

    def publish_will_copy(self, owner: str, reason: str) -> bool:
        """Publish the will of ``owner`` now but keep it stored (console: force the
        will, keep the client connected).  The will still fires if the client drops."""
        will = self.wills.get(owner)
        if will is None:
            return False
        self.log.info("publishing a copy of the will of {o} to {t!r} ({r})", o=owner,
                      t=will.topic, r=reason)
        self.stats.wills_published += 1
        d = self.publish(will.as_message(self.clock.seconds()))
        if d is not None:
            d.addErrback(self._log_store_failure, "publishing will of " + owner)
        return True

    def cancel_will_grace(self, owner: str) -> bool:
        """``owner`` is back after a restart (an AMQP will link of that name attached):
        its stored will is no longer an orphan.  True if a grace timer was pending."""
        call = self._grace.pop(owner, None)
        if call is None:
            return False
        if call.active():
            call.cancel()
        return True

    def _grace_expired(self, owner: str) -> None:
        self._grace.pop(owner, None)
        self.fire_will(owner, "client did not return within the will grace period after a restart")

    # -- publishing -----------------------------------------------------------

    def publish(self, message: Message, identity: Identity | None = None,
                extra_ops: Sequence[Op] = (), counted: bool = True) -> Deferred[None] | None:
        """Route ``message``; the Deferred fires when everything it promised is durable.

        Deliveries to clean sessions, and QoS 0/1 deliveries to persistent ones, go
        out at once; QoS 2 deliveries to persistent sessions are held until the
        commit that stores them (with their packet id).  ``extra_ops`` (e.g.
        the inbound QoS 2 id) are committed in the same batch.
        """
        if identity is not None and not self.authorizer.may_publish(
                identity, message.topic, message.retain):
            self.stats.publish_denied += 1
            self.log.warn("publish by {c} to {t!r} denied", c=identity.client_id, t=message.topic)
            return self.persist(extra_ops)
        if counted:  # the broker's own $SYS updates are not traffic
            self.stats.messages_received += 1
        ops: list[Op] = list(extra_ops)
        if message.retain:
            durable = not message.topic.startswith(_SYS_PREFIX)
            if not message.payload:
                if self.retained.delete(message.topic) and durable:
                    ops.append(DeleteRetained(message.topic))
            else:
                self.retained.put(message)
                if durable:
                    ops.append(PutRetained(message.with_retain(True)))
        other_ops = len(ops)
        held: list[tuple[Session, int]] = []
        qos1_entries: list[OutEntry] = []
        msg_qos = message.qos
        congested: list[Session] = []
        for session, granted in self.trie.match(message.topic).items():
            qos = granted if granted < msg_qos else msg_qos
            session_ops = session.enqueue(message, qos, False)
            if session_ops:
                ops.extend(session_ops)
                entry = session.last_entry
                if qos == 1 and entry is not None and entry.packet_id in session.inflight:
                    qos1_entries.append(entry)
                else:
                    held.append((session, entry.seq if entry is not None else 0))
            if session.link is not None and session.over_high_water():
                congested.append(session)
        self.last_publish_congested = congested
        # Inside a batch (or while stopping) the Deferred persist returns is ours
        # alone, so it may also be fired early, by acknowledgements.
        owned = bool(self._batch_depth) or self.stopping
        d = self.persist(ops)
        if d is None:
            return None
        if held:
            # Only once stored: a QoS 2 entry whose commit failed must not go out
            # (the publisher got no PUBREC and will send it again).
            d.addCallback(self._release_held, held)
        if qos1_entries and not held and other_ops == 0:
            if owned:
                _fire_when_acknowledged(d, qos1_entries)
                return d
            return _committed_or_acknowledged(d, qos1_entries, self._log_store_failure)
        return d

    def _release_held(self, result: object, held: list[tuple[Session, int]]) -> object:
        for session, seq in held:
            session.release_held(seq)
        return result

    def publish_sys(self) -> None:
        now = self.clock.seconds()
        dropped = self.dropped_total()
        self.stats.messages_dropped = dropped
        for topic, payload in self.stats.sys_topics(
                __version__, now, len(self.trie), len(self.retained),
                len(self.sessions), len(self.wills), dropped):
            self.publish(Message(topic, payload.encode(), 0, True, None, now), counted=False)

    def dropped_total(self) -> int:
        return (self._dropped_retired + sum(s.dropped for s in self.sessions.values())
                + sum(s.dropped for s in self.link_subscribers.values()))

    # -- back-pressure --------------------------------------------------------

    def congested_for(self, topic: str) -> bool:
        """True if an online subscriber of ``topic`` is past its high-water mark."""
        return any(session.over_high_water() for session in self.trie.match(topic))

    def pause_until_drained(self, key: int, resume: Callable[[], None],
                            sessions: list[Session] | None = None) -> None:
        """Publisher ``key`` stopped reading; call ``resume`` once ``sessions`` (the
        congested subscribers it fed; None = any) are below their high-water mark,
        or after ``limits.stall_timeout`` at the latest."""
        known = self._paused.get(key)
        if known is not None:
            if known[1] is not None and sessions is not None:
                # Usually the same one or two subscribers, message after message.
                new = [s for s in sessions if s not in known[1]]
                if not new and known[0] == resume:
                    return
                sessions = known[1] + new
            timer = known[2]
        else:
            timer = self.clock.callLater(self.limits.stall_timeout, self._pause_expired, key)
        self._paused[key] = (resume, sessions, timer)

    def forget_paused(self, key: int) -> None:
        entry = self._paused.pop(key, None)
        if entry is not None and entry[2].active():
            entry[2].cancel()

    def _pause_expired(self, key: int) -> None:
        """A publisher waited ``stall_timeout``: whoever kept it waiting is stalled."""
        entry = self._paused.pop(key, None)
        if entry is None:
            return
        resume, sessions, _ = entry
        suspects = sessions if sessions is not None else [
            s for s in self.sessions.values() if s.link is not None]
        for session in suspects:
            if session.link is not None and session.over_high_water():
                session.stalled = True
                self.log.warn(
                    "subscriber {c} made no progress for {t:g}s; publishers are no longer "
                    "slowed down for it (its queue drops at its limit, counted)",
                    c=session.client_id, t=self.limits.stall_timeout)
        resume()

    def link_drained(self, session: Session | None) -> None:
        """A congested link can take more again: send its queue, wake publishers."""
        if session is not None:
            session.pump()
        self._resume_paused()

    def _resume_paused(self) -> None:
        if not self._paused:
            return
        any_congested: bool | None = None
        ready: list[Callable[[], None]] = []
        for key, (resume, sessions, timer) in list(self._paused.items()):
            if sessions is None:
                if any_congested is None:
                    any_congested = any(
                        s.over_high_water() for s in self.sessions.values()
                        if s.link is not None) or any(
                        s.over_high_water() for s in self.link_subscribers.values())
                if any_congested:
                    continue
            elif any(s.link is not None and s.over_high_water() for s in sessions):
                continue
            del self._paused[key]
            if timer.active():
                timer.cancel()
            ready.append(resume)
        for resume in ready:
            resume()

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Session, identity: Identity,
                  requests: Sequence[tuple[str, int]]
                  ) -> tuple[list[int], Deferred[None] | None]:
        """Add subscriptions; returns the SUBACK codes and the commit to wait for."""
        codes: list[int] = []
        ops: list[Op] = []
        for topic_filter, qos in requests:
            problem = validate_topic_filter(topic_filter)
            if problem is not None:
                self.log.warn("{c} subscribed to an invalid filter {f!r}: {p}",
                              c=session.client_id, f=topic_filter, p=problem)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            if not self.authorizer.may_subscribe(identity, topic_filter):
                codes.append(SUBSCRIBE_FAILURE)
                continue
            granted = min(qos, 2)
            session.subscriptions[topic_filter] = granted
            self.trie.add(topic_filter, session, granted)
            if session.persistent:
                ops.append(PutSubscription(session.client_id, topic_filter, granted))
            codes.append(granted)
        return codes, self.persist(ops)

    def send_retained(self, session: Session, grants: Iterable[tuple[str, int]]) -> None:
        """After SUBACK: the retained messages of each granted filter, retain set."""
        ops: list[Op] = []
        last_seq = 0
        for topic_filter, granted in grants:
            if granted == SUBSCRIBE_FAILURE:
                continue
            for message in self.retained.match(topic_filter):
                qos = min(granted, message.qos)
                session_ops = session.enqueue(message, qos, True)
                if session_ops:
                    ops.extend(session_ops)
                    last_seq = session_ops[-1].seq  # type: ignore[union-attr]
        d = self.persist(ops)
        if d is not None:
            d.addCallback(self._release_held, [(session, last_seq)])
            d.addErrback(self._log_store_failure, "queueing retained messages")

    def unsubscribe(self, session: Session, filters: Sequence[str]) -> Deferred[None] | None:
        ops: list[Op] = []
        for topic_filter in filters:
            if session.subscriptions.pop(topic_filter, None) is not None:
                self.trie.remove(topic_filter, session)
                if session.persistent:
                    ops.append(DeleteSubscription(session.client_id, topic_filter))
        return self.persist(ops)

    # -- outbound acknowledgements -------------------------------------------

    def acknowledged(self, session: Session, packet_id: int) -> None:
        self._background(session.acknowledge(packet_id))
        self._resume_paused()

    def received(self, session: Session, packet_id: int) -> None:
        d = self.persist(session.received(packet_id))
        if d is not None:
            d.addCallback(lambda _: session.pubrel_durable(packet_id))
            d.addErrback(self._log_store_failure, "recording a PUBREC")

    def completed(self, session: Session, packet_id: int) -> None:
        self._background(session.completed(packet_id))
        self._resume_paused()

    def rejected(self, session: Session, packet_id: int) -> None:
        self._background(session.drop(packet_id))

    def _background(self, ops: Sequence[Op]) -> None:
        """Store ``ops`` with nobody waiting (a failure is logged by the batch)."""
        if not ops or self.stopping:
            return
        if self._batch_depth:
            self._batch_ops.extend(ops)
            return
        self.store.submit(ops).addErrback(self._log_store_failure, "recording a change")

    def _log_store_failure(self, failure: Failure, what: str) -> None:
        self.log.failure("storage failed while {what}", failure, what=what)

    # -- expiry ---------------------------------------------------------------

    def expire_sessions(self) -> None:
        cutoff = self.clock.seconds() - self.limits.session_expiry
        expired = [s for s in self.sessions.values()
                   if s.persistent and s.connection is None and s.last_seen < cutoff]
        ops: list[Op] = []
        for session in expired:
            self.log.info("persistent session {c} expired (offline since {t:.0f})",
                          c=session.client_id, t=session.last_seen)
            ops.extend(self._discard(session))
        self._background(ops)

    # -- operator actions (console) -------------------------------------------

    def disconnect_client(self, client_id: str, with_will: bool, reason: str) -> bool:
        """Close the connection of ``client_id``; its will fires only if asked."""
        session = self.sessions.get(client_id)
        if session is None or session.connection is None:
            return False
        connection = session.connection
        if not with_will:
            self.clear_will(client_id)
        self.end_session(connection, session, clean=not with_will, reason=reason)
        connection.close(reason)
        return True

    def clear_session(self, client_id: str, reason: str) -> Deferred[None] | None:
        """Disconnect (without will) and delete subscriptions, queue and in-flight state."""
        self.disconnect_client(client_id, with_will=False, reason=reason)
        session = self.sessions.get(client_id)
        if session is None:
            return None
        return self.persist(self._discard(session))

    def delete_retained(self, topic: str) -> Deferred[None] | None:
        if not self.retained.delete(topic):
            return None
        return self.persist([DeleteRetained(topic)])

    def delete_retained_matching(self, topic_filter: str) -> tuple[int, Deferred[None] | None]:
        matches = self.retained.match(topic_filter)
        ops: list[Op] = []
        for message in matches:
            self.retained.delete(message.topic)
            if not message.topic.startswith(_SYS_PREFIX):
                ops.append(DeleteRetained(message.topic))
        count = len(matches)
        return count, self.persist(ops)


def _fire_all(_: object, waiters: list[Deferred[None]]) -> None:
    for waiter in waiters:
        if not waiter.called:  # else fired early (_fire_when_acknowledged)
            waiter.callback(None)


def _fail_all(failure: Failure, waiters: list[Deferred[None]],
              log_failure: Callable[[Failure, str], None]) -> None:
    early = False
    for waiter in waiters:
        if waiter.called:
            early = True
        else:
            waiter.errback(failure)
    if early:
        log_failure(failure, "storing messages that were already acknowledged")


def _fire_when_acknowledged(waiter: Deferred[None], entries: list[OutEntry]) -> None:
    """Fire ``waiter`` as soon as every entry has been acknowledged (unless it fired
    already).  A batch waiter is used as is; otherwise ``_committed_or_acknowledged``
    puts a Deferred of its own between the store's and the caller."""
    remaining = [len(entries)]

    def acknowledged() -> None:
        remaining[0] -= 1
        if remaining[0] == 0 and not waiter.called:
            waiter.callback(None)

    for entry in entries:
        entry.on_done = acknowledged


def _committed_or_acknowledged(
        commit: Deferred[None], entries: list[OutEntry],
        log_failure: Callable[[Failure, str], None]) -> Deferred[None]:
    """Fires when ``commit`` does or when every entry has been acknowledged.

    A PUBACK promises that the message is safe: stored for its persistent
    subscribers, or already delivered to them.  When all of them acknowledge
    before the writer thread commits, the promise holds without waiting (and
    the writer skips the queue writes their deletes cancel).
    """
    result: Deferred[None] = Deferred()
    _fire_when_acknowledged(result, entries)

    def committed(_: object) -> None:
        if not result.called:
            result.callback(None)

    def failed(failure: Failure) -> None:
        if not result.called:
            result.errback(failure)
        else:
            log_failure(failure, "storing messages that were already acknowledged")

    commit.addCallbacks(committed, failed)
    return result

"""Wills and the grace rule after a restart.

What it owns: the stored wills (keyed by owner: an MQTT client id, or the name of
an AMQP will link), which side set each one (``origin``: an MQTT client and an
AMQP will link may share a name, and each side only ends its own), publishing a
will (and deleting it in the same commit), publishing a copy on an operator's
request, and the grace timers: a will that was stored when the broker stopped
belonged to a client that was connected then, so it fires ``will_grace`` seconds
after the next start unless that owner comes back first.

What it must not do: route messages itself (it hands the will to the router) or
decide when a connection ended uncleanly (the registry and the AMQP will link do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import Authorizer, Identity
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import DeleteWill, Op, PutWill
from mqttamqp.core.recorder import (
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CAUSE_RESTART,
    WILL_PUBLISHED,
    Recorder,
)
from mqttamqp.core.routing.published import Published
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import is_sys_topic, validate_topic_name

__all__ = ["Wills"]

# The AMQP will service's lines keep the namespace they had on the port (``Broker``).
_port_log = Logger(namespace="mqttamqp.core.broker.Broker")


class Wills:
    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, commits: CommitBatcher, stats: BrokerStats,
                 authorizer: Authorizer, publish: Callable[[Message, Sequence[Op]], Published],
                 grace: float, recorder: Recorder) -> None:
        self.clock = clock
        self.recorder = recorder
        self.commits = commits
        self.stats = stats
        self.authorizer = authorizer
        self._publish = publish
        self.grace = grace
        self.wills: dict[str, WillMessage] = {}
        self._grace: dict[str, DelayedCall] = {}
        # The same dict, read-only outside: empty when no will waits for its timer
        # (a connect asks ``owner_returned`` only when it is not: a call less).
        self.timed: dict[str, DelayedCall] = self._grace
        # Of those timers, the MQTT 5 will delays (not the grace after a restart,
        # which readiness waits for).
        self._delayed: set[str] = set()

    # -- start and stop -------------------------------------------------------

    def restore(self, wills: Iterable[WillMessage]) -> int:
        """At start-up: every stored will's owner was connected when the broker
        stopped; it fires after the grace period unless the owner comes back."""
        count = 0
        for will in wills:
            self.wills[will.owner] = will
            self._grace[will.owner] = self.clock.callLater(
                self.grace, self._grace_expired, will.owner)
            count += 1
        if count:
            self.log.info("{n} stored will(s) will be published in {s}s unless their "
                          "clients reconnect", n=count, s=self.grace)
        return count

    def stop(self) -> None:
        for call in self._grace.values():
            if call.active():
                call.cancel()
        self._grace.clear()
        self._delayed.clear()

    # -- the grace rule -------------------------------------------------------

    def in_grace(self) -> int:
        """Restored wills whose grace period is still running (readiness waits; MQTT
        5 will delays are not counted)."""
        return len(self._grace) - len(self._delayed)

    def owner_returned(self, owner: str) -> bool:
        """``owner`` is back: its stored will from before the restart is no longer an
        orphan.  True if a grace timer was pending."""
        call = self._grace.pop(owner, None)
        self._delayed.discard(owner)
        if call is None:
            return False
        if call.active():
            call.cancel()
        return True

    def _grace_expired(self, owner: str) -> None:
        self._grace.pop(owner, None)
        self._delayed.discard(owner)
        self.commits.watch(
            self.fire(owner, "client did not return within the will grace period after "
                      "a restart", cause=CAUSE_RESTART), "publishing will of " + owner)

    # -- wills ----------------------------------------------------------------

    def allowed(self, will: WillMessage, identity: Identity | None) -> bool:
        if validate_topic_name(will.topic) is not None or is_sys_topic(will.topic):
            return False  # (and $SYS is the broker's own)
        identity = identity or Identity(will.owner)
        return self.authorizer.may_publish(identity, will.topic, will.retain)

    def put(self, will: WillMessage) -> list[Op]:
        """Store (or replace) the will of ``will.owner``; returns the op to commit."""
        self.wills[will.owner] = will
        return [PutWill(will)]

    def pop(self, owner: str, origin: str | None = None) -> list[Op]:
        """Remove the will of ``owner`` (of ``origin`` only, if given); the ops to
        commit (none if there was no such will)."""
        will = self.wills.get(owner)
        if will is None or (origin is not None and will.origin != origin):
            return []
        del self.wills[owner]
        return [DeleteWill(owner)]

    def store(self, will: WillMessage) -> Deferred[None] | None:
        """Store (or replace) the will of ``will.owner`` (AMQP_WILL, also
        mid-connection); fires once durable."""
        return self.commits.persist(self.put(will))

    def clear(self, owner: str, origin: str | None = None) -> Deferred[None] | None:
        """Delete the will of ``owner`` (of ``origin`` only, if given); fires once
        durable, None if there was nothing to delete."""
        return self.commits.persist(self.pop(owner, origin))

    def returned(self, owner: str) -> None:
        """An AMQP will link named ``owner`` attached: a will of that name stored
        before a restart is not published (its grace timer stops, it is deleted)."""
        if self.owner_returned(owner):
            _port_log.info("{o} is back within the will grace period; its will from before "
                           "the restart is not published", o=owner)
            self.commits.watch(self.clear(owner), "clearing a will")

    def link_ended(self, owner: str, brute: bool, reason: str) -> None:
        """The AMQP will link of ``owner`` is gone: detached with an error, lost or
        timed out (``brute``) publishes its will, a clean detach deletes it."""
        if self.commits.stopping:
            return  # the grace rule decides at the next start
        if brute:
            cause = CAUSE_KEEPALIVE if "idle time-out" in reason else CAUSE_LOST
            self.commits.watch(self.fire(owner, reason, "amqp", cause),
                               "publishing will of " + owner)
        else:
            self.commits.watch(self.clear(owner, "amqp"), "clearing a will")

    def fire(self, owner: str, reason: str, origin: str | None = None,
             cause: str = CAUSE_LOST) -> Deferred[None] | None:
        """Publish the will of ``owner`` (if any; of ``origin`` if given) and delete
        it in the same commit.  The Deferred fires once both are durable; None if
        there was no will or nothing to wait for."""
        will = self.wills.get(owner)
        if will is None or (origin is not None and will.origin != origin):
            return None
        del self.wills[owner]
        self.log.info("publishing will of {o} to {t!r} ({r})", o=owner, t=will.topic, r=reason)
        self.stats.wills_published += 1
        self.recorder.event(self.clock.seconds(), WILL_PUBLISHED, owner, topic=will.topic,
                            qos=will.qos, retain=will.retain, reason=cause, detail=reason)
        return self._publish(will.as_message(self.clock.seconds()),
                             [DeleteWill(owner)]).durable

    def fire_later(self, owner: str, delay: float, reason: str, cause: str) -> None:
        """MQTT 5 will delay interval: publish the will of ``owner`` in ``delay``
        seconds unless it comes back first (``owner_returned`` cancels it, as it
        cancels the grace timer after a restart)."""
        self.owner_returned(owner)
        self.log.info("will of {o} will be published in {d:g}s unless it reconnects",
                      o=owner, d=delay)
        self._grace[owner] = self.clock.callLater(delay, self._delay_over, owner, reason,
                                                  cause)
        self._delayed.add(owner)

    def _delay_over(self, owner: str, reason: str, cause: str) -> None:
        self._grace.pop(owner, None)
        self._delayed.discard(owner)
        self.commits.watch(self.fire(owner, reason + " (after its will delay)", "mqtt", cause),
                           "publishing will of " + owner)

    def publish_copy(self, owner: str, reason: str) -> Deferred[None] | None:
        """Publish the will of ``owner`` now but keep it stored (the console's "force
        the will, keep the client connected"); it still fires if the client drops."""
        will = self.wills.get(owner)
        if will is None:
            return None
        self.log.info("publishing a copy of the will of {o} to {t!r} ({r})", o=owner,
                      t=will.topic, r=reason)
        self.stats.wills_published += 1
        self.recorder.event(self.clock.seconds(), WILL_PUBLISHED, owner, topic=will.topic,
                            qos=will.qos, retain=will.retain, reason=CAUSE_CONSOLE,
                            detail=reason)
        return self._publish(will.as_message(self.clock.seconds()), ()).durable

"""The operator's commands: what the console (and a configuration reload) does to
the broker.

What it owns: disconnecting a client (with or without its will), publishing its
will (a copy, or for real), clearing a session, the durable ban list, deleting
retained messages, debugging a client's packets, the audit event of a console
action, and dropping subscriptions the access rules no longer allow.  Each
command answers once its change is durable (a Deferred that fires after the
commit, or fails if a commit did).

What it must not do: read views (``readmodel.ReadModel`` does), touch sockets
(a connection is closed through its ``close``), or serve protocol adapters: they
use ``Broker``, the port.  Durable queues are administered through their own part
(``Broker.queues``).
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred

from mqttamqp.core.auth import Ban, Bans, Identity
from mqttamqp.core.clients.clientdebug import ClientDebug
from mqttamqp.core.clients.registry import SessionRegistry
from mqttamqp.core.clients.wills import Wills
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import CommitBatcher, all_durable
from mqttamqp.core.persistence import DeleteRetained, Op
from mqttamqp.core.readmodel import will_owners
from mqttamqp.core.recorder import CAUSE_CONSOLE, CONSOLE_ACTION, Recorder
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.routing.router import Router
from mqttamqp.core.topics import SYS_PREFIX

__all__ = ["ConsoleCommands"]


class ConsoleCommands:
    def __init__(self, clock: Clock, commits: CommitBatcher, registry: SessionRegistry,
                 wills: Wills, router: Router, bans: Bans, recorder: Recorder,
                 client_debug: ClientDebug) -> None:
        self.clock = clock
        self._commits = commits
        self._registry = registry
        self._wills = wills
        self._router = router
        self._retained: RetainedStore = router.retained
        self.bans = bans
        self.recorder = recorder
        self.client_debug = client_debug

    # -- clients and sessions -------------------------------------------------

    def disconnect_client(self, client_id: str, with_will: bool, reason: str) -> bool:
        """Close the connection holding the session of ``client_id``; its will fires
        only if asked.  False if nothing holds that session."""
        held, done = self._disconnect_holder(client_id, with_will, reason)
        self._commits.watch(done, "disconnecting " + client_id)
        return held

    def _disconnect_holder(self, client_id: str, with_will: bool, reason: str
                           ) -> tuple[bool, Deferred[None] | None]:
        """``disconnect_client``: whether something held the session, and the
        commit of its end."""
        session = self._registry.sessions.get(client_id)
        if session is None or session.connection is None:
            return False, None
        connection = session.connection
        dropped_will = None if with_will else self._commits.persist(self._wills.pop(client_id))
        ended = self._registry.end(connection, session, clean=not with_will, reason=reason,
                                   cause=CAUSE_CONSOLE)
        connection.close(reason)
        return True, all_durable([dropped_will, ended])

    def disconnect(self, key: str, with_will: bool, reason: str
                   ) -> tuple[int, Deferred[None]] | None:
        """Close the live connection ``key``: its wills fire (or are deleted first),
        the session it holds ends.  Returns how many wills were published and a
        Deferred that fires once all of it is durable (or fails if a commit did);
        None if ``key`` is not connected."""
        conn = self._registry.connections.get(key)
        if conn is None:
            return None
        info = conn.info()
        fired = 0
        commits: list[Deferred[None] | None] = []
        for owner in will_owners(self._wills.wills, info):
            if with_will:
                d = self._wills.fire(owner, reason, cause=CAUSE_CONSOLE)
                fired += d is not None
                commits.append(d)
            else:
                commits.append(self._commits.persist(self._wills.pop(owner)))
        sid = info.session_id
        session = self._registry.sessions.get(sid) if sid is not None else None
        # Only the session this very connection holds (an MQTT client): an AMQP
        # connection's session links end with the connection, and a .publish receiver
        # still waiting for its session must not close whoever holds it.
        holder: object = session.connection if session is not None else None
        if sid is not None and holder is conn:
            commits.append(self._disconnect_holder(sid, with_will, reason)[1])
        if self._registry.connections.get(key) is conn:
            conn.close(reason)
        return fired, self._durable(commits)

    def force_will(self, key: str, keep_connected: bool, reason: str
                   ) -> tuple[list[str], Deferred[None]] | None:
        """Publish the wills of connection ``key``: a copy, the client staying
        connected with its will, or for real with the client disconnected.  Returns
        the owners published and a Deferred that fires once durable; None if
        ``key`` is not connected."""
        conn = self._registry.connections.get(key)
        if conn is None:
            return None
        owners = will_owners(self._wills.wills, conn.info())
        if not owners:
            return [], self._commits.barrier()
        if keep_connected:
            return owners, self._durable(
                [self._wills.publish_copy(owner, reason) for owner in owners])
        done = self.disconnect(key, True, reason)
        assert done is not None
        return owners, done[1]

    def clear_session(self, client_id: str, reason: str, why: str = "console"
                      ) -> Deferred[None] | None:
        """Disconnect (without will) and delete subscriptions, queue and in-flight
        state (recorded as cleared for ``why``); None if there is no such session.
        The Deferred fires once all of it is durable, or fails if a commit did."""
        _, disconnected = self._disconnect_holder(client_id, False, reason)
        session = self._registry.sessions.get(client_id)
        if session is None:
            self._commits.watch(disconnected, "disconnecting " + client_id)
            return None
        return self._durable([disconnected,
                              self._commits.persist(self._registry.discard(session, why))])

    def fire_will(self, owner: str, reason: str, origin: str | None = None
                  ) -> Deferred[None] | None:
        """Publish the will of ``owner`` (of ``origin`` only, if given) and delete it;
        fires once durable, None if there was no such will."""
        return self._wills.fire(owner, reason, origin)

    def clear_will(self, owner: str) -> Deferred[None] | None:
        """Delete the will of ``owner``; fires once durable."""
        return self._wills.clear(owner)

    def debug_client(self, client_id: str, duration: float) -> tuple[float, int]:
        """Log the packets of ``client_id`` for ``duration`` seconds (0 stops): its
        live connection now, and any it opens before the deadline.  Returns the
        deadline and how many live connections started (a ValueError when too many
        clients are being debugged)."""
        until = self.client_debug.enable(client_id, duration)
        on = until > self.clock.seconds()
        started = 0
        for conn in list(self._registry.connections.values()):
            if conn.info().client_id != client_id:
                continue
            # MQTT connections log their packets, AMQP ones their frames.
            if on and hasattr(conn, "start_debug"):
                conn.start_debug(until)
                started += 1
            elif not on and hasattr(conn, "stop_debug"):
                conn.stop_debug()
        return until, started

    def record_console_action(self, user: str, action: str, target: str) -> None:
        """An operator acted through the console (the archive keeps the audit trail)."""
        self.recorder.event(self.clock.seconds(), CONSOLE_ACTION, None, user=user,
                            action=action, target=target)

    # -- bans -----------------------------------------------------------------

    def ban(self, kind: str, value: str, until: float | None, reason: str, by: str
            ) -> tuple[Ban, Deferred[None]]:
        """Ban ``value`` (a ``kind`` of ``security.bans``); fires once durable.  Raises
        ``BanError`` for a ban that cannot be set.  Connections already open stay."""
        ban, op = self.bans.add(kind, value, until, reason, by)
        return ban, self._durable([self._commits.persist([op, *self.bans.purge()])])

    def unban(self, kind: str, value: str) -> Deferred[None] | None:
        """Lift a ban; None if there was none.  Fires once durable."""
        op = self.bans.remove(kind, value)
        if op is None:
            return None
        return self._durable([self._commits.persist([op])])

    # -- retained messages and access rules -----------------------------------

    def delete_retained(self, topic: str) -> Deferred[None] | None:
        if not self._retained.delete(topic):
            return None
        return self._commits.persist([DeleteRetained(topic)])

    def delete_retained_matching(self, topic_filter: str) -> tuple[int, Deferred[None] | None]:
        matches = self._retained.match(topic_filter)
        ops: list[Op] = []
        for message in matches:
            self._retained.delete(message.topic)
            if not message.topic.startswith(SYS_PREFIX):
                ops.append(DeleteRetained(message.topic))
        return len(matches), self._commits.persist(ops)

    def recheck_subscriptions(self) -> None:
        """The access rules changed: every session's subscriptions are checked again
        (as its owner), and those no longer allowed are dropped, durably.  (An AMQP
        topic receiver keeps what its attach was granted until it detaches.)"""
        ops: list[Op] = []
        router = self._router
        for session in list(self._registry.sessions.values()):
            identity = Identity(session.client_id, session.owner, session.protocol or "mqtt")
            ops.extend(router.recheck(session, identity))
        self._commits.watch(self._commits.persist(ops),
                            "dropping subscriptions the access rules no longer allow")

    def _durable(self, commits: Sequence[Deferred[None] | None]) -> Deferred[None]:
        """Fires once ``commits`` (and everything asked before) are durable."""
        return all_durable([*commits, self._commits.barrier()]) or self._commits.barrier()

"""Sessions kept for a gateway: what an MQTT front end (FE) asks of the core over
the MQTT-over-AMQP control services, for clients it serves.

What it owns: listing, subscribing and unsubscribing the session of a client id
(created offline and persistent when needed: AMQP_LIST, AMQP_SUBSCRIBE,
AMQP_UNSUBSCRIBE), removing it (AMQP_CLOSE), and the release of an outbound QoS 2
delivery the FE got PUBREC for (AMQP_PUBREL).

What it must not do: parse AMQP messages or check who asks (the adapter checks
``ClientGate.may_use_session`` first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred

from mqttamqp.core.auth import Identity
from mqttamqp.core.clients.registry import SessionRegistry
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.routing.published import SUBSCRIBE_FAILURE
from mqttamqp.core.routing.router import Router
from mqttamqp.core.sessions.entries import ClientLink
from mqttamqp.core.sessions.session import Session

__all__ = ["GatewaySessions"]


class GatewaySessions:
    def __init__(self, commits: CommitBatcher, registry: SessionRegistry, router: Router,
                 clear_session: Callable[[str, str, str], Deferred[None] | None]) -> None:
        self._commits = commits
        self._registry = registry
        self._router = router
        self._clear_session = clear_session

    def list_subscriptions(self, client_id: str, identity: Identity | None = None
                           ) -> tuple[dict[str, int], Deferred[None] | None]:
        """AMQP_LIST: the subscriptions of ``client_id``'s persistent session, which is
        opened (offline, owned by ``identity``'s user) if it has none; the Deferred is
        that session's commit."""
        session, d = self._registry.offline_session(
            client_id, identity.username if identity is not None else None)
        return (dict(session.subscriptions) if session.persistent else {}), d

    def subscribe_client(self, client_id: str, identity: Identity,
                         requests: Sequence[tuple[str, int]], options: Sequence[int] = ()
                         ) -> tuple[Session | None, list[int], Deferred[None] | None]:
        """AMQP_SUBSCRIBE: subscribe the session of ``client_id``, created offline and
        persistent if it has none (and at least one filter can be granted), with the
        requests' subscription ``options`` (as ``Broker.subscribe``: none if empty).  The
        Deferred (None when every filter was refused) fires once the session and its
        subscriptions are durable."""
        if client_id not in self._registry.sessions and not any(
                self._router.may_subscribe(identity, f) for f, _ in requests):
            return None, [SUBSCRIBE_FAILURE] * len(requests), None  # nothing is created
        session, created = self._registry.offline_session(client_id, identity.username)
        codes, d = self._router.subscribe(session, identity, requests, options=options)
        if d is None:
            d = created
        if all(code >= SUBSCRIBE_FAILURE for code in codes):
            self._commits.watch(d, "creating a session")
            return session, codes, None
        return session, codes, d

    def unsubscribe_client(self, client_id: str, filters: Sequence[str]
                           ) -> Deferred[None] | None:
        """AMQP_UNSUBSCRIBE: nothing to do for a client id without a session."""
        session = self._registry.sessions.get(client_id)
        if session is None:
            return None
        return self._router.unsubscribe(session, filters)

    def close_session(self, client_id: str, keep: ClientLink | None,
                      reason: str) -> Deferred[None] | None:
        """AMQP_CLOSE: remove the session of ``client_id`` (its holder is taken over;
        ``keep``, the asking FE's own receiver, just gives it up and stays)."""
        session = self._registry.sessions.get(client_id)
        if session is not None and session.connection is not None:
            holder = session.connection
            if holder is keep:
                self._commits.watch(
                    self._registry.end(holder, session, clean=False, reason=reason),
                    "ending the session of " + client_id)
            else:
                self._registry.take_over(client_id)
        return self._clear_session(client_id, reason, "amqp_close")

    def release_outbound(self, client_id: str, packet_id: int
                         ) -> tuple[Deferred[None] | None, Callable[[], None]]:
        """AMQP_PUBREL from an FE (it got PUBREC): mark the QoS 2 delivery released.
        Returns the commit the FE's Accepted waits for, and what to call once that
        Accepted is out: it sends the release to the session's link (the FE settles
        the original delivery when its AMQP_PUBREL is settled, so its answer goes
        first)."""
        session = self._registry.sessions.get(client_id)
        if session is None:
            return None, _nothing

        def release() -> None:
            link = session.link
            if link is not None:
                link.send_pubrel(packet_id)

        return self._commits.persist(session.mark_released(packet_id)), release


def _nothing() -> None:
    pass

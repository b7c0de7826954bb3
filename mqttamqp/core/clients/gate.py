"""The door: who may connect, as whom, on which session, and how fast they publish.

What it owns: admission of a new socket (``--max-connections``, the connection
rate per address), the ban check at MQTT CONNECT and AMQP open, authentication
(counted and recorded when it fails), whether an identity may claim or act on a
session, whether it may write to a topic at all, and a new client's publish
budget.  A refusal is counted and logged here, one line per cause a minute.

What it must not do: close connections (the adapter does, with the answer given
here) or keep any list itself: the ban list and the rate limiters are injected
(``core.auth.Guards``, built by ``mqttamqp.security``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger

from mqttamqp.core.auth import (
    Authenticator,
    Authorizer,
    Credentials,
    Guards,
    Identity,
    PublishLimiter,
    peer_host,
)
from mqttamqp.core.clock import Clock
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import AUTH_FAILURE, Recorder
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import is_sys_topic

__all__ = ["ClientGate"]


# The broker's own sessions of its MQTT bridges (``$bridge/<name>``): no client may
# claim one (it would take the bridge's outbound backlog).
BRIDGE_SESSIONS = "$bridge/"


class ClientGate:
    # (the namespace these lines had before the port split: operators filter on it)
    log: ClassVar[Logger] = Logger(namespace="mqttamqp.core.broker.Broker")

    def __init__(self, clock: Clock, limits: Limits, stats: BrokerStats, recorder: Recorder,
                 log_limit: LogLimiter, authenticator: Authenticator,
                 authorizer: Authorizer, guards: Guards,
                 sessions: dict[str, Session]) -> None:
        self.clock = clock
        self.limits = limits
        self.stats = stats
        self.recorder = recorder
        self._log_limit = log_limit
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.bans = guards.bans
        self._connect_rate = guards.connect_rate
        self._publish_rate = guards.publish_rate
        self._sessions = sessions

    # -- connections ----------------------------------------------------------

    def admit(self, kind: str, peer: str, connections: int) -> bool:
        """A new socket from ``peer`` (``host:port``), with ``connections`` of its
        ``kind`` (MQTT, AMQP) open: may it go on?  A refusal is counted and logged
        (one line per cause a minute)."""
        if connections >= self.limits.max_connections:
            cause, what = "max_connections", (
                f"--max-connections ({self.limits.max_connections}) reached")
        elif self._connect_rate is not None and not self._connect_rate.admit(
                peer_host(peer)):
            cause, what = "connect_rate", (
                f"more than {self.limits.max_connect_rate:g} new connections a second "
                "from that address (--max-connect-rate)")
        else:
            return True
        self.stats.connections_refused += 1
        self.stats.limit_hit(cause)
        suppressed = self._log_limit.allow(cause)
        if suppressed is not None:
            self.log.warn("refusing {kind} connection from {peer}: {what} ({n} more "
                          "refused since the last line)", kind=kind, peer=peer, what=what,
                          n=suppressed)
        return False

    def refund_connect(self, peer: str) -> None:
        """Give back the connection-rate token ``admit`` took for ``peer``: its socket
        was admitted at its accept and is admitted again (a WebSocket's MQTT connection
        at the end of its upgrade), so that it spends one token, not two."""
        if self._connect_rate is not None:
            self._connect_rate.refund(peer_host(peer))

    def banned(self, kind: str, client_id: str | None, user: str | None, peer: str
               ) -> str | None:
        """Why a connection (MQTT CONNECT, AMQP open) is banned, or None.  A refusal
        is counted and logged (one line per cause a minute); the caller closes it
        without logging it again."""
        ban = self.bans.check_peer(client_id, user, peer)
        if ban is None:
            return None
        self.stats.connections_refused += 1
        self.stats.limit_hit("banned")
        suppressed = self._log_limit.allow("banned")
        if suppressed is not None:
            self.log.warn("refusing {kind} connection from {peer} (client id {c!r}): {why} "
                          "({n} more refused since the last line)", kind=kind, peer=peer,
                          c=client_id, why=ban.describe(), n=suppressed)
        return ban.describe()

    # -- authentication -------------------------------------------------------

    def auth_failed(self, credentials: Credentials, reason: str) -> None:
        """A failed check outside ``authenticate`` (an MQTT 5 AUTH exchange): counted
        and recorded like the others."""
        self.stats.auth_failures += 1
        self.recorder.event(self.clock.seconds(), AUTH_FAILURE, credentials.client_id or None,
                            protocol=credentials.protocol, address=credentials.peer,
                            user=credentials.username, reason=reason)

    def authenticate(self, credentials: Credentials) -> Deferred[bool]:
        """Check ``credentials``; a refusal (or a failed check) is recorded."""
        result = self.authenticate_now(credentials)
        if isinstance(result, Deferred):
            return result
        return succeed(result)

    def authenticate_now(self, credentials: Credentials) -> bool | Deferred[bool]:
        """``authenticate``, answered at once when the authenticator answers at once
        (anonymous clients, a store without users): no Deferred per MQTT CONNECT."""
        try:
            result = self.authenticator.authenticate(credentials)
        except Exception:
            failed: Deferred[bool] = fail()
            return failed.addErrback(self._auth_recorded, credentials, "error")
        # (``type`` first: Deferred's isinstance goes through ABCMeta, a Python call)
        if type(result) is not bool and isinstance(result, Deferred):
            return result.addCallbacks(
                self._auth_recorded, self._auth_recorded, callbackArgs=(credentials, "refused"),
                errbackArgs=(credentials, "error"))
        if result:   # (``_auth_recorded`` records only a refusal here)
            return result
        return self._auth_recorded(result, credentials, "refused")  # type: ignore[no-any-return]

    def _auth_recorded(self, ok: Any, credentials: Credentials, reason: str) -> Any:
        if not ok or reason != "refused":
            self.stats.auth_failures += 1
            self.recorder.event(
                self.clock.seconds(), AUTH_FAILURE, credentials.client_id or None,
                protocol=credentials.protocol, address=credentials.peer,
                user=credentials.username, reason=reason)
        return ok

    # -- sessions and topics --------------------------------------------------

    def may_claim(self, identity: Identity, client_id: str) -> bool:
        """May ``identity`` take over (or act on) the session of ``client_id``?  Not
        when another user owns it and user names are verified (client users exist):
        a session, its subscriptions and its queue belong to the user that made it."""
        if client_id.startswith(BRIDGE_SESSIONS):
            return False   # a bridge's own session (mqttamqp.bridge): no client's
        session = self._sessions.get(client_id)
        owner = session.owner if session is not None else None
        if owner is None or owner == identity.username:
            return True
        verifies = getattr(self.authenticator, "has_clients", None)  # StoreAuthenticator
        if verifies is None or not verifies():
            return True
        self.log.warn("{u} may not take over the session of {c!r}: it belongs to user {o!r}",
                      u=repr(identity.username) if identity.username else "an anonymous "
                      "client", c=client_id, o=owner)
        return False

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        """May ``identity`` act on the session of ``client_id`` from AMQP (a
        ``.publish`` receiver, the subscription service)?"""
        return (self.authorizer.may_use_session(identity, client_id)
                and self.may_claim(identity, client_id))

    def may_write(self, identity: Identity, topic: str) -> bool:
        """May ``identity`` publish to ``topic`` at all (an AMQP sender's attach)?
        Not counted: no message was refused."""
        return not is_sys_topic(topic) and self.authorizer.may_publish(identity, topic, False)

    # -- publish rate ---------------------------------------------------------

    def publish_rate(self) -> PublishLimiter | None:
        """A new client's publish budget, or None when no rate is limited."""
        return self._publish_rate() if self._publish_rate is not None else None

    def publish_rate_exceeded(self, kind: str, client: str, wait: float) -> None:
        """A client went over its publish rate: not read for ``wait`` seconds."""
        self.stats.limit_hit("publish_rate")
        suppressed = self._log_limit.allow("publish_rate")
        if suppressed is not None:
            self.log.info("{kind} client {c} publishes faster than --max-publish-rate / "
                          "--max-publish-byte-rate: not read for {w:.2f}s ({n} more since "
                          "the last line)", kind=kind, c=client, w=wait, n=suppressed)

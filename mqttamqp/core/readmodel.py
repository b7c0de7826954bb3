"""The console's read model: frozen views of clients, sessions, wills and the
broker's counters, built from the core on request.

What it owns: what the console may know of the core's state, as immutable
values (so a page render cannot change the broker, and the core's internals can
change without the console noticing), and the rules the console needs to read
it: which wills a connection owns (``will_owners``) and whether a will's owner is
connected (``will_owner_connected``).

What it must not do: change anything.  The console acts through the operator's
commands (``ConsoleCommands.force_will``, ``ConsoleCommands.disconnect``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mqttamqp.core.auth import Ban, Bans
from mqttamqp.core.clients.connections import ConnectionInfo
from mqttamqp.core.clients.registry import NEVER_EXPIRES, SessionRegistry
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.recorder import Recorder
from mqttamqp.core.routing.router import Router
from mqttamqp.core.routing.topicstats import TopicStats
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats

__all__ = [
    "ReadModel", "ClientView", "SessionView", "EntryView", "WillView", "Counters",
    "SubscriptionView", "TopicCounts", "SharedGroupView",
    "will_owners", "will_owner_connected",
]


def will_owners(wills: Mapping[str, WillMessage], info: ConnectionInfo) -> list[str]:
    """The stored wills connection ``info`` owns: those it names (AMQP will links)
    and the will of the session it holds (MQTT)."""
    owners = [o for o in info.will_owners if o in wills]
    if info.session_id is not None and info.session_id in wills \
            and info.session_id not in owners:
        owners.append(info.session_id)
    return owners


def will_owner_connected(registry: SessionRegistry, will: WillMessage) -> bool:
    session = registry.sessions.get(will.owner)
    if session is not None and session.connection is not None:
        return True
    if will.origin == "mqtt":
        return False
    # AMQP wills are keyed by link name; ask the connections who owns it.
    # (an AMQP adapter's: MQTT connections own no link names)
    return any(will.owner in conn.info().will_owners
               for conn in registry.connections.other.values())


@dataclass(frozen=True, slots=True)
class EntryView:
    """One outbound QoS 1/2 message of a session, queued or in flight."""

    packet_id: int
    qos: int
    state: str
    dup: bool
    retain: bool
    message: Message


@dataclass(frozen=True, slots=True)
class SessionView:
    client_id: str
    persistent: bool
    state: str                      # "offline", "connecting" or "online"
    online: bool                    # held by a connection
    protocol: str
    last_seen: float
    subscriptions: tuple[tuple[str, int], ...]
    inflight_count: int
    queued_count: int
    queued_bytes: int
    dropped: int
    delivered: int
    inbound_qos2: tuple[int, ...]
    has_will: bool
    # MQTT 5's session expiry interval in seconds as agreed (0: the session ends with
    # the connection), None where the client gave none (MQTT 3.x, AMQP); whether it
    # means never (0xFFFFFFFF); and when an offline session will expire by it.
    expiry: float | None = None
    never_expires: bool = False
    expires_at: float | None = None
    # Filled only by ``ReadModel.session`` (detail), empty in lists.
    inflight: tuple[EntryView, ...] = ()
    queued: tuple[EntryView, ...] = ()


@dataclass(frozen=True, slots=True)
class SubscriptionView:
    """One subscription: an MQTT session's filter, or an AMQP receiver's address."""

    client_id: str                  # the session's client id, or the AMQP link's key
    topic_filter: str
    qos: int
    kind: str                       # "persistent", "clean" or "amqp receiver"
    online: bool


@dataclass(frozen=True, slots=True)
class SharedGroupView:
    """One shared subscription group: ``$share/<name>/<filter>``."""

    name: str
    topic_filter: str
    strategy: str
    members: tuple[tuple[str, int, bool], ...]   # (client id, messages given, online)


@dataclass(frozen=True, slots=True)
class TopicCounts:
    counts: Mapping[str, int]       # topic -> messages routed (tracked topics only)
    tracked: int
    max_tracked: int
    untracked: int                  # messages on topics beyond the cap


@dataclass(frozen=True, slots=True)
class WillView:
    will: WillMessage
    owner_connected: bool


@dataclass(frozen=True, slots=True)
class ClientView:
    """A live connection, its session (if it holds one) and the wills it owns."""

    info: ConnectionInfo
    session: SessionView | None
    wills: tuple[WillView, ...]


@dataclass(frozen=True, slots=True)
class Counters:
    """What the overview and the live feed show."""

    started: float
    connected: int
    amqp_connections: int
    by_protocol: Mapping[str, int]
    clients_maximum: int
    clients_total: int
    connections_refused: int
    sessions: int
    persistent_sessions: int
    offline_sessions: int
    retained: int
    retained_bytes: int
    retained_sys: int
    wills: int
    subscriptions: int
    messages_received: int
    messages_sent: int
    messages_dropped: int
    publish_denied: int
    wills_published: int
    protocol_errors: int
    bytes_received: int
    bytes_sent: int
    archive: Mapping[str, int]      # the archive's counters ({} when it is off)
    storage_failing: bool = False   # the last commit failed (nothing durable is acked)
    storage_failures: int = 0       # failed commits since start
    storage_error: str = ""         # the first error of the current (or last) failing spell
    messages_queued: int = 0        # routed copies not yet written ($SYS messages/queued)
    # The durable queues' aggregate bounds: why their publishers are blocked ("":
    # they are not), payload bytes stored, body bytes in memory (the budget).
    queues_blocked: str = ""
    queue_bytes: int = 0
    queue_memory_bytes: int = 0


def _entry(entry: OutEntry) -> EntryView:
    return EntryView(entry.packet_id, entry.qos, entry.state, entry.dup, entry.retain,
                     entry.message)


def _expires_at(session: Session) -> float | None:
    """When the offline ``session`` ends by its MQTT 5 expiry interval: the registry
    arms that timer when the session goes offline (and again at a restart), and
    ``last_seen`` is set at that moment."""
    expiry = session.expiry
    if (expiry is None or not session.persistent or session.connection is not None
            or not 0 < expiry < NEVER_EXPIRES):
        return None
    return session.last_seen + expiry


class ReadModel:
    """Views of the broker's state; every call builds fresh frozen values."""

    def __init__(self, registry: SessionRegistry, wills: Mapping[str, WillMessage],
                 router: Router, stats: BrokerStats, recorder: Recorder,
                 bans: Bans | None = None, topic_stats: TopicStats | None = None, *,
                 queues: QueueManager) -> None:
        self._bans = bans
        self._queues = queues
        self._topic_stats = topic_stats
        self._recorder = recorder
        self._registry = registry
        self._wills = wills
        self._router = router
        self._stats = stats

    # -- sessions -------------------------------------------------------------

    def _session(self, session: Session, detail_limit: int = 0) -> SessionView:
        inflight: tuple[EntryView, ...] = ()
        queued: tuple[EntryView, ...] = ()
        if detail_limit:
            inflight = tuple(_entry(e) for e in list(session.inflight.values())[:detail_limit])
            queued = tuple(_entry(e) for e in list(session.queue)[:detail_limit])
        return SessionView(
            client_id=session.client_id, persistent=session.persistent,
            state=session.state.value, online=session.connection is not None,
            protocol=session.protocol, last_seen=session.last_seen,
            subscriptions=tuple(sorted(session.subscriptions.items())),
            inflight_count=len(session.inflight), queued_count=len(session.queue),
            queued_bytes=session.queued_bytes, dropped=session.dropped,
            delivered=session.delivered, inbound_qos2=tuple(sorted(session.inbound_qos2)),
            has_will=session.client_id in self._wills, expiry=session.expiry,
            never_expires=session.expiry is not None and session.expiry >= NEVER_EXPIRES,
            expires_at=_expires_at(session), inflight=inflight, queued=queued)

    def session(self, client_id: str, detail_limit: int = 100) -> SessionView | None:
        session = self._registry.sessions.get(client_id)
        return self._session(session, detail_limit) if session is not None else None

    def sessions(self, state: str = "all", persistent_only: bool = True) -> list[SessionView]:
        """Sessions (persistent ones by default), ``state``: all, online or offline."""
        out = []
        for session in list(self._registry.sessions.values()):
            if persistent_only and not session.persistent:
                continue
            held = session.connection is not None
            if (state == "online" and not held) or (state == "offline" and held):
                continue
            out.append(self._session(session))
        return out

    # -- wills ----------------------------------------------------------------

    def will(self, owner: str) -> WillView | None:
        will = self._wills.get(owner)
        return WillView(will, will_owner_connected(self._registry, will)) if will else None

    def wills(self) -> list[WillView]:
        return [WillView(w, will_owner_connected(self._registry, w))
                for _, w in sorted(self._wills.items())]

    # -- clients --------------------------------------------------------------

    def _client(self, info: ConnectionInfo, detail_limit: int) -> ClientView:
        registry = self._registry
        session = registry.sessions.get(info.session_id) if info.session_id else None
        owners = will_owners(self._wills, info)
        return ClientView(
            info, self._session(session, detail_limit) if session is not None else None,
            tuple(WillView(self._wills[o], True) for o in owners))

    def clients(self) -> list[ClientView]:
        return [self._client(conn.info(), 0)
                for conn in list(self._registry.connections.values())]

    def client(self, key: str, detail_limit: int = 100) -> ClientView | None:
        conn = self._registry.connections.get(key)
        return self._client(conn.info(), detail_limit) if conn is not None else None

    def client_holding(self, client_id: str, detail_limit: int = 100) -> ClientView | None:
        """The live connection holding the session ``client_id``, if any."""
        session = self._registry.sessions.get(client_id)
        if session is None or session.connection is None:
            return None
        for conn in list(self._registry.connections.values()):
            info = conn.info()
            if info.session_id == client_id:
                return self._client(info, detail_limit)
        return None

    # -- retained -------------------------------------------------------------

    def retained(self, topic: str) -> Message | None:
        return self._router.retained.get(topic)

    def retained_matching(self, topic_filter: str) -> list[Message]:
        return self._router.retained.match(topic_filter)

    # -- topics and subscriptions ------------------------------------------------

    def topic_counts(self) -> TopicCounts:
        stats = self._topic_stats
        if stats is None:
            return TopicCounts({}, 0, 0, 0)
        return TopicCounts(stats.counts(), len(stats), stats.max_topics, stats.untracked)

    def subscriber_count(self, topic: str) -> int:
        """How many sessions (MQTT sessions, AMQP receivers) a message on ``topic``
        would reach now."""
        return len(self._router.trie.match(topic))

    def subscriptions(self) -> list[SubscriptionView]:
        """Every subscription of every session, MQTT and AMQP."""
        out: list[SubscriptionView] = []
        for session in list(self._registry.sessions.values()):
            kind = "persistent" if session.persistent else "clean"
            online = session.connection is not None
            out.extend(SubscriptionView(session.client_id, f, q, kind, online)
                       for f, q in session.subscriptions.items())
        for key, session in list(self._registry.link_subscribers.items()):
            kind = "console tail" if session.protocol == "console" else "amqp receiver"
            out.extend(SubscriptionView(key, f, q, kind, session.link is not None)
                       for f, q in session.subscriptions.items())
        return out

    def shared_groups(self) -> list[SharedGroupView]:
        """The shared subscription groups with their members and how many messages
        each was given (since it joined), by group name and filter."""
        out = []
        for group in list(self._router.groups.shared.values()):
            members = tuple(sorted(
                (s.client_id, group.counts.get(s.client_id, 0), s.link is not None)
                for s in list(group.members)))
            out.append(SharedGroupView(group.name, group.filter, group.strategy, members))
        return sorted(out, key=lambda g: (g.name, g.topic_filter))

    # -- bans -----------------------------------------------------------------

    def bans(self) -> list[Ban]:
        """The bans in force (``Ban`` is frozen), by kind and value."""
        return self._bans.active() if self._bans is not None else []

    # -- counters -------------------------------------------------------------

    def counters(self) -> Counters:
        registry, router, stats = self._registry, self._router, self._stats
        connections = registry.connections
        persistent = offline = 0
        for s in registry.sessions.values():
            if s.persistent:
                persistent += 1
                if s.connection is None:
                    offline += 1
        return Counters(
            started=stats.started, connected=len(connections),
            amqp_connections=sum(1 for key in connections.other   # (MQTT keys never are)
                                 if key.startswith("amqp:")),
            by_protocol=dict(stats.by_protocol), clients_maximum=stats.clients_maximum,
            clients_total=stats.clients_total, connections_refused=stats.connections_refused,
            sessions=len(registry.sessions), persistent_sessions=persistent,
            offline_sessions=offline, retained=len(router.retained),
            retained_bytes=router.retained.payload_bytes,
            retained_sys=router.retained.sys_count, wills=len(self._wills),
            subscriptions=len(router.trie), messages_received=stats.messages_received,
            messages_sent=stats.messages_sent, messages_dropped=registry.drops.dropped_total(),
            publish_denied=stats.publish_denied, wills_published=stats.wills_published,
            protocol_errors=stats.protocol_errors, bytes_received=stats.bytes_received,
            bytes_sent=stats.bytes_sent,
            # The archive's own counters; other recorders' are named "kind/counter".
            archive={k: v for k, v in self._recorder.stats().items() if "/" not in k},
            storage_failing=stats.storage_failing, storage_failures=stats.storage_failures,
            storage_error=stats.storage_error, messages_queued=registry.drops.queued_total(),
            queues_blocked=self._queues.alarm.reason or "",
            queue_bytes=self._queues.total_bytes,
            queue_memory_bytes=self._queues.resident)

"""Live connections: the table by the console's key, and what registering and
unregistering one counts, records and logs.

What it owns: which connection is live (an MQTT one after CONNACK, an AMQP one
after open) under which key — ``"mqtt:" + client id`` for an MQTT connection, the
adapter's own key for the others (``amqp:N``, ``amqp091:N``) — read as one
mapping by the console, its commands and the ``$SYS`` counts; the connected and
disconnected counts and causes (``BrokerStats``), the archive's CONNECT and
DISCONNECT events and the one log line per disconnect.  An MQTT connection is
kept by its client id, the string the connection, its session and the registry's
``sessions`` already hold, so that no ``"mqtt:" + client id`` string is kept per
connection (62 bytes of an idle client's ~1.6 KB); its key is made when the
table is read by key or iterated.

What it must not do: touch sessions (``SessionRegistry`` does, which builds this
table and hands out its register methods), or close a connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import ClassVar

from twisted.logger import Logger

from mqttamqp.core.clients.connections import InspectableConnection
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_LIMIT,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_SHUTDOWN,
    CAUSE_STORAGE,
    CONNECT,
    DISCONNECT,
    Recorder,
    records,
)
from mqttamqp.core.stats import BrokerStats

__all__ = ["LiveConnections", "MQTT_KEY_PREFIX"]

MQTT_KEY_PREFIX = "mqtt:"
_SKIP = len(MQTT_KEY_PREFIX)
# A CONNECT event's fields (``Recorder.fields_event``: one per connect, no keywords)
_CONNECT_FIELDS = ("protocol", "address", "user", "clean_session", "keepalive")


class LiveConnections(Mapping[str, InspectableConnection]):
    """Live connections by key: ``mqtt`` (client id -> connection) and ``other``
    (key -> connection) seen as one mapping of keys, changed only by the register
    methods."""

    log: ClassVar[Logger] = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, stats: BrokerStats, commits: CommitBatcher,
                 recorder: Recorder) -> None:
        self.mqtt: dict[str, InspectableConnection] = {}
        self.other: dict[str, InspectableConnection] = {}
        self.clock = clock
        self.stats = stats
        self.commits = commits
        self.recorder = recorder
        self._recording = records(recorder)
        # The protocols of live connections that do not say it (``protocol_label``),
        # by the connection's id (a live connection's: dropped when it leaves the
        # table; by id, not key: two tables, two key spaces).
        self._connection_protocols: dict[int, str] = {}
        self._disconnect_lines = LogLimiter(clock.seconds, interval=1.0, burst=20)

    def table_of(self, key: str) -> tuple[dict[str, InspectableConnection], str]:
        """The table that keeps ``key``'s connection, and its key in that table."""
        if key.startswith(MQTT_KEY_PREFIX):
            return self.mqtt, key[_SKIP:]
        return self.other, key

    def __getitem__(self, key: str) -> InspectableConnection:
        if key.startswith(MQTT_KEY_PREFIX):
            return self.mqtt[key[_SKIP:]]
        return self.other[key]

    def get(self, key: str, default: InspectableConnection | None = None  # type: ignore[override]
            ) -> InspectableConnection | None:
        if key.startswith(MQTT_KEY_PREFIX):
            return self.mqtt.get(key[_SKIP:], default)
        return self.other.get(key, default)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key.startswith(MQTT_KEY_PREFIX):
            return key[_SKIP:] in self.mqtt
        return key in self.other

    def __iter__(self) -> Iterator[str]:
        for client_id in list(self.mqtt):
            yield MQTT_KEY_PREFIX + client_id
        yield from list(self.other)

    def __len__(self) -> int:
        return len(self.mqtt) + len(self.other)

    def values(self) -> list[InspectableConnection]:  # type: ignore[override]
        """Every live connection (a list: callers may end connections as they go)."""
        return [*self.mqtt.values(), *self.other.values()]

    def __repr__(self) -> str:
        return f"LiveConnections({dict(self.items())!r})"

    # -- registering ----------------------------------------------------------

    def register_connection(self, key: str, connection: InspectableConnection,
                            protocol: str) -> None:
        """A connection is live (an AMQP one opened) under ``key``; an MQTT key
        (``"mqtt:" + client id``) is the same as ``register_client``."""
        table, key = self.table_of(key)
        self._register(table, key, connection, protocol)

    def register_client(self, client_id: str, connection: InspectableConnection,
                        protocol: str) -> None:
        """An MQTT connection is live (CONNACK out) under its client id: its key is
        ``"mqtt:" + client_id``, made only when read.  ``protocol``: the connection's
        own ``protocol_label``."""
        self._register(self.mqtt, client_id, connection, protocol, True)

    def unregister_connection(self, key: str, connection: InspectableConnection,
                              cause: str = CAUSE_LOST, detail: str = "") -> None:
        table, key = self.table_of(key)
        self._unregister(table, key, connection, cause, detail)

    def unregister_client(self, client_id: str, connection: InspectableConnection,
                          cause: str = CAUSE_LOST, detail: str = "") -> None:
        self._unregister(self.mqtt, client_id, connection, cause, detail)

    def _register(self, table: dict[str, InspectableConnection], key: str,
                  connection: InspectableConnection, protocol: str,
                  labelled: bool = False) -> None:
        """``labelled``: ``protocol`` is the connection's own ``protocol_label`` (an
        MQTT connection's, ``register_client``): nothing to keep for it."""
        previous = table.get(key)
        now = self.clock.seconds()   # (not the read's: a takeover's DISCONNECT is after it)
        if previous is not None:
            if previous is connection:
                return
            # The key's previous holder is closing but not yet gone (e.g. after an
            # MQTT DISCONNECT): the newcomer takes its place, and its later
            # unregister is a no-op.
            known = _protocol_of(self._connection_protocols.pop(id(previous), None), previous)
            self.stats.disconnected(known)
            self.stats.disconnect_cause(CAUSE_CLEAN)
            if self._recording:
                self.recorder.event(now, DISCONNECT, previous.event_fields()[0],
                                    protocol=known, reason=CAUSE_CLEAN)
        table[key] = connection
        if not labelled and getattr(connection, "protocol_label", None) != protocol:
            self._connection_protocols[id(connection)] = protocol
        self.stats.connected(protocol)
        if self._recording:
            client_id, remote, user, clean, keepalive = connection.event_fields()
            self.recorder.fields_event(now, CONNECT, client_id, _CONNECT_FIELDS,
                                       (protocol, remote, user, clean, keepalive))

    def _unregister(self, table: dict[str, InspectableConnection], key: str,
                    connection: InspectableConnection, cause: str, detail: str) -> None:
        if table.get(key) is connection:
            del table[key]
            protocol = _protocol_of(self._connection_protocols.pop(id(connection), None),
                                    connection)
            self.stats.disconnected(protocol)
            if self.commits.stopping:
                cause = CAUSE_SHUTDOWN
            self.stats.disconnect_cause(cause)
            client_id, remote = connection.event_fields()[:2]
            # The one line per disconnect, with its cause.  A protocol error or a
            # limit was logged (as a warning, with its reason) where it was found;
            # storage failures and shutdowns are logged once for all, not per client.
            # (20 lines a second at most, then a count in the next one)
            held = (None if cause in (CAUSE_PROTOCOL_ERROR, CAUSE_STORAGE, CAUSE_SHUTDOWN,
                                      CAUSE_LIMIT)
                    else self._disconnect_lines.allow("disconnect"))
            if held is not None:
                self.log.info("{p} client {c} ({peer}) disconnected: {cause}{d}{h}",
                              p=protocol, c=client_id or "?", peer=remote,
                              cause=cause.replace("_", " "),
                              d=f" ({detail})" if detail else "",
                              h=f" ({held} more disconnects not logged before it)"
                              if held else "")
            if self._recording:
                self.recorder.event(self.clock.seconds(), DISCONNECT, client_id,
                                    protocol=protocol, reason=cause, detail=detail or None)


def _protocol_of(stored: str | None, connection: InspectableConnection) -> str:
    """The protocol a live connection registered with: ``stored``, what the
    table keeps for it, which is only for connections that do not say
    it themselves (``protocol_label``, as an MQTT connection does): one dict entry
    a connection less for most."""
    return stored if stored is not None else str(getattr(connection, "protocol_label", "?"))

"""Broker counters and the ``$SYS/broker/...`` topics built from them."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BrokerStats"]


@dataclass
class BrokerStats:
    started: float = 0.0
    clients_connected: int = 0
    clients_maximum: int = 0
    clients_total: int = 0            # successful connects since start
    connections_refused: int = 0      # over max-connections, bad CONNECT, auth
    protocol_errors: int = 0
    messages_received: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    messages_dropped: int = 0         # queue bounds, congestion, rejected deliveries
    publish_denied: int = 0
    messages_amqp_only: int = 0       # AMQP bodies with no MQTT form (not sent to MQTT)
    wills_published: int = 0
    by_protocol: dict[str, int] = field(default_factory=dict)
    storage_failures: int = 0         # failed store commits
    storage_failing: bool = False     # the last commit failed
    storage_error: str = ""           # the first error of the current (or last) spell
    # How often each limit refused something (``$SYS/broker/limits/<name>``).
    limits: dict[str, int] = field(default_factory=dict)

    def limit_hit(self, name: str) -> None:
        self.limits[name] = self.limits.get(name, 0) + 1

    def connected(self, protocol: str) -> None:
        self.clients_connected += 1
        self.clients_total += 1
        self.by_protocol[protocol] = self.by_protocol.get(protocol, 0) + 1
        if self.clients_connected > self.clients_maximum:
            self.clients_maximum = self.clients_connected

    def disconnected(self, protocol: str) -> None:
        self.clients_connected -= 1
        self.by_protocol[protocol] = self.by_protocol.get(protocol, 1) - 1

    def sys_topics(self, version: str, now: float, subscriptions: int, retained: int,
                   sessions: int, wills: int, dropped: int) -> list[tuple[str, str]]:
        """(topic, payload) pairs published retained under ``$SYS/broker/``.

        ``retained`` is the number of retained messages clients stored: the broker's
        own ``$SYS`` topics are not counted in ``retained messages/count``."""
        p = "$SYS/broker/"
        return [
            (p + "version", f"mqttamqp {version}"),
            (p + "uptime", f"{int(now - self.started)} seconds"),
            (p + "clients/connected", str(self.clients_connected)),
            (p + "clients/total", str(self.clients_total)),
            (p + "clients/maximum", str(self.clients_maximum)),
            (p + "messages/received", str(self.messages_received)),
            (p + "messages/sent", str(self.messages_sent)),
            (p + "messages/dropped", str(dropped)),
            (p + "messages/amqp-only", str(self.messages_amqp_only)),
            (p + "publish/denied", str(self.publish_denied)),
            (p + "bytes/received", str(self.bytes_received)),
            (p + "bytes/sent", str(self.bytes_sent)),
            (p + "subscriptions/count", str(subscriptions)),
            (p + "retained messages/count", str(retained)),
            (p + "sessions/count", str(sessions)),
            (p + "wills/count", str(wills)),
            (p + "storage/failures", str(self.storage_failures)),
            (p + "storage/state", "failing" if self.storage_failing else "ok"),
            *((p + "limits/" + name, str(n)) for name, n in sorted(self.limits.items())),
        ]

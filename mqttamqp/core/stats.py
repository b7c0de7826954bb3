"""Broker counters and the ``$SYS/broker/...`` topics built from them.

These are the one source of the broker's numbers: ``$SYS``, the console and the
Prometheus endpoint (``mqttamqp.ops.metrics``) all read them, so they never
disagree.  The histograms are plain bucket counts kept here, so the core needs
no metrics library; the exporter turns them into its own types at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

__all__ = ["BrokerStats", "Histogram", "DELIVER_SAMPLE_MASK"]

# One delivered message in 1024 has its publish-to-deliver latency observed: the
# per-message cost is one bit test on a counter the send path updates anyway.
DELIVER_SAMPLE_MASK: Final = 1023


def protocol_family(protocol: str) -> str:
    """A protocol as metrics label it: ``mqtt`` (3.1, 3.1.1, 5, and an offline
    session's ""), ``amqp``, ``amqp0-9-1``, ``console`` (the live tail)."""
    return protocol if protocol in ("amqp", "amqp0-9-1", "console") else "mqtt"


@dataclass
class Histogram:
    """Cumulative-ready bucket counts (Prometheus ``le`` semantics: a value goes
    into the first bucket whose upper bound is >= it; the last is +Inf)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    # Called with every observed value (the OpenTelemetry export mirrors the
    # histograms this way); empty unless an export asks.
    listeners: list[Callable[[float], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1
        if self.listeners:
            for listener in self.listeners:
                listener(value)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) pairs, the last bound +Inf."""
        running = 0
        out: list[tuple[float, int]] = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


_LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0)
_BATCH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def _latency() -> Histogram:
    return Histogram(_LATENCY_BOUNDS)


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
    publish_denied_amqp: int = 0      # of which by AMQP senders (metrics' protocol label)
    publish_denied_amqp091: int = 0   # of which by AMQP 0.9.1 publishers
    messages_amqp_only: int = 0       # AMQP bodies with no MQTT form (not sent to MQTT)
    wills_published: int = 0
    by_protocol: dict[str, int] = field(default_factory=dict)
    storage_failures: int = 0         # failed store commits
    storage_failing: bool = False     # the last commit failed
    storage_error: str = ""           # the first error of the current (or last) spell
    ha_role: str = ""                 # --ha: standby, leader or fenced ("" without --ha)
    # How often each limit refused something (``$SYS/broker/limits/<name>``).
    limits: dict[str, int] = field(default_factory=dict)
    amqp_links: int = 0               # AMQP links attached now, all connections (gauge)
    # Times an MQTT connection's input was held for a later reactor turn, after its
    # share of one (``Limits.mqtt_turn``): not a refusal, a measure of contention.
    mqtt_turns_yielded: int = 0
    # Writes to a connection's transport that raised (its output was dropped):
    # ``core.commits.write_failed``.
    write_failures: int = 0
    # By protocol (the totals above stay the $SYS figures): AMQP's share is counted
    # on the AMQP path only, the broker's own publishes (wills, console) where they
    # are routed; MQTT's is the rest, so the MQTT hot path counts nothing extra.
    messages_received_amqp: int = 0
    messages_received_broker: int = 0
    messages_sent_amqp: int = 0
    # AMQP 0.9.1's share, counted by the exchanges (every routed 0.9.1 publish, to a
    # queue or the topic space) and the 0.9.1 adapter (every delivery).
    messages_received_amqp091: int = 0
    messages_sent_amqp091: int = 0
    connects: dict[str, int] = field(default_factory=dict)      # by protocol
    disconnects: dict[str, int] = field(default_factory=dict)   # by cause
    auth_failures: int = 0
    messages_rejected: int = 0        # AMQP Rejected (in messages_dropped)
    # AMQP deliveries the peer settled without an outcome (a peer that always does
    # on ``.publish`` loops until ``--amqp-max-default-outcomes``).
    settled_without_outcome: int = 0
    commits: int = 0                  # successful store commits
    commit_latency: Histogram = field(default_factory=_latency)     # seconds
    commit_batch: Histogram = field(default_factory=lambda: Histogram(_BATCH_BOUNDS))
    deliver_latency: Histogram = field(default_factory=_latency)    # sampled, seconds
    # Seconds since the epoch, for the sampled delivery latency (the broker sets it).
    seconds: Callable[[], float] | None = None

    def deliver_sampled(self, timestamp: float) -> None:
        """One sampled delivery of a message the broker received at ``timestamp``."""
        if self.seconds is not None and timestamp > 0:
            self.deliver_latency.observe(max(0.0, self.seconds() - timestamp))

    def disconnect_cause(self, cause: str) -> None:
        self.disconnects[cause] = self.disconnects.get(cause, 0) + 1

    def limit_hit(self, name: str) -> None:
        self.limits[name] = self.limits.get(name, 0) + 1

    def connected(self, protocol: str) -> None:
        self.clients_connected += 1
        self.clients_total += 1
        self.connects[protocol] = self.connects.get(protocol, 0) + 1
        self.by_protocol[protocol] = self.by_protocol.get(protocol, 0) + 1
        if self.clients_connected > self.clients_maximum:
            self.clients_maximum = self.clients_connected

    def disconnected(self, protocol: str) -> None:
        self.clients_connected -= 1
        self.by_protocol[protocol] = self.by_protocol.get(protocol, 1) - 1

    @contextmanager
    def own_messages(self) -> Iterator[None]:
        """Copies of the broker's own ``$SYS`` messages sent inside this block are not
        counted in ``messages_sent``: they are not traffic, as they are not in
        ``messages_received`` (the router's ``counted=False``), so received = sent +
        dropped + queued holds for a client that watches ``$SYS`` too.  Every send
        is synchronous (the adapters count as they write), so the counters are put
        back as they were; bytes stay counted (they went over the wire)."""
        sent, sent_amqp = self.messages_sent, self.messages_sent_amqp
        sent_amqp091 = self.messages_sent_amqp091
        try:
            yield
        finally:
            self.messages_sent, self.messages_sent_amqp = sent, sent_amqp
            self.messages_sent_amqp091 = sent_amqp091

    def messages_by_protocol(self) -> tuple[dict[str, int], dict[str, int]]:
        """Messages received and sent by protocol (received: who published them,
        ``broker`` for wills; MQTT's share is the rest, as the MQTT path counts
        nothing of its own)."""
        amqp, amqp091 = self.messages_received_amqp, self.messages_received_amqp091
        received = {"amqp": amqp, "amqp0-9-1": amqp091, "broker": self.wills_published,
                    "mqtt": self.messages_received - amqp - amqp091 - self.wills_published}
        sent_amqp, sent_091 = self.messages_sent_amqp, self.messages_sent_amqp091
        sent = {"amqp": sent_amqp, "amqp0-9-1": sent_091,
                "mqtt": self.messages_sent - sent_amqp - sent_091}
        return received, sent

    def _protocol_topics(self, p: str) -> list[tuple[str, str]]:
        """``clients/protocol/<protocol>``, ``messages/received/protocol/<protocol>``
        and ``messages/sent/protocol/<protocol>`` (mqtt3.1, mqtt3.1.1, mqtt5, amqp,
        amqp0-9-1: the label the metrics carry)."""
        received, sent = self.messages_by_protocol()
        connected = dict.fromkeys(("mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp", "amqp0-9-1"), 0)
        connected.update(self.by_protocol)
        return [*((f"{p}clients/protocol/{k}", str(n)) for k, n in sorted(connected.items())),
                *((f"{p}messages/received/protocol/{k}", str(n))
                  for k, n in sorted(received.items())),
                *((f"{p}messages/sent/protocol/{k}", str(n)) for k, n in sorted(sent.items()))]

    def sys_topics(self, version: str, now: float, subscriptions: int, retained: int,
                   sessions: int, wills: int, dropped: int,
                   queued: int = 0) -> list[tuple[str, str]]:
        """(topic, payload) pairs published retained under ``$SYS/broker/``.

        ``retained`` is the number of retained messages clients stored: the broker's
        own ``$SYS`` topics are not counted in ``retained messages/count``.
        ``queued``: message copies routed to sessions and not yet written to a
        connection (``SessionRegistry.queued_total``).  All values are taken in one
        reactor turn, before any is published, so one burst is one consistent
        sample of received = sent + dropped + queued (see docs/production.md, ``$SYS``)."""
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
            (p + "messages/queued", str(queued)),
            (p + "messages/amqp-only", str(self.messages_amqp_only)),
            *self._protocol_topics(p),
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
            *(((p + "ha/role", self.ha_role),) if self.ha_role else ()),
        ]

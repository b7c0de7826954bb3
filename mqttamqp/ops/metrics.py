"""The broker's numbers as metric families, read at scrape time, and their
Prometheus exposition through ``prometheus_client``.

What it owns: the metric names (``mqttamqp_...``, Prometheus conventions: base
units, ``_total`` on counters), what each reads, and the private
``CollectorRegistry`` of one broker.  ``snapshot`` builds every family from the
same sources ``$SYS`` uses (``BrokerStats``, the read model's counters, the
registry's drop total), so the two never disagree; the OpenTelemetry export
(``otel``) reads the same snapshot.

What it must not do: count anything itself, or be read off the reactor thread
(the core's dicts change under a reader on another thread).  Scrapes are
served on the reactor; the OpenTelemetry reader gets a snapshot taken there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mqttamqp.core.broker import Broker
from mqttamqp.core.stats import Histogram, protocol_family

__all__ = ["Family", "BridgeCollector", "BrokerCollector", "StoreCollector", "broker_registry",
           "exposition", "snapshot", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


@dataclass(frozen=True, slots=True)
class Family:
    """One metric at one moment: ``name`` without the ``_total`` suffix of counters;
    ``values`` as (label value, number) pairs, the label value "" when ``label`` is
    None (with two labels, ``label`` and each label value are pairs);
    ``buckets``/``total``/``count`` for histograms."""

    name: str
    kind: str
    doc: str
    unit: str = ""
    label: str | tuple[str, ...] | None = None
    values: tuple[tuple[str | tuple[str, ...], float], ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        if self.label is None:
            return ()
        return (self.label,) if isinstance(self.label, str) else self.label

    def labelled(self) -> Iterator[tuple[dict[str, str], float]]:
        """Each value with its labels as a dict."""
        names = self.label_names
        for key, value in self.values:
            keys = (key,) if isinstance(key, str) else key
            yield (dict(zip(names, keys, strict=True)) if names else {}), value
    buckets: tuple[tuple[float, int], ...] = ()
    total: float = 0.0
    count: int = 0


def _by(values: Iterable[tuple[str, int]]) -> tuple[tuple[str, float], ...]:
    merged: dict[str, float] = {}
    for key, n in values:
        merged[key] = merged.get(key, 0) + n
    return tuple(sorted(merged.items()))


def _one(name: str, kind: str, doc: str, value: float, unit: str = "") -> Family:
    return Family(name, kind, doc, unit, None, (("", value),))


def _histogram(name: str, doc: str, h: Histogram, unit: str = "") -> Family:
    return Family(name, HISTOGRAM, doc, unit, None, (), tuple(h.cumulative()), h.total,
                  h.count)


def _dropped(broker: Broker, stats: Any, denied: int
             ) -> tuple[tuple[tuple[str, ...], float], ...]:
    """Drops by (reason, protocol): the receiving session's protocol, or for denied
    the publisher's."""
    out: dict[tuple[str, str], float] = {
        ("congestion", "mqtt"): 0, ("queue", "mqtt"): 0, ("rejected", "amqp"): 0,
        ("denied", "amqp"): stats.publish_denied_amqp,
        ("denied", "amqp0-9-1"): stats.publish_denied_amqp091,
        ("denied", "mqtt"): denied - stats.publish_denied_amqp - stats.publish_denied_amqp091}
    drops = broker.registry.drops.dropped_by_protocol()
    for family, (dropped, congested, rejected) in drops.items():
        out[("congestion", family)] = congested
        out[("queue", family)] = dropped - congested - rejected
        if rejected or family == "amqp":
            out[("rejected", family)] = rejected
    return tuple(sorted(out.items()))


def _queue_families(broker: Broker) -> list[Family]:
    """The durable queues (``$SYS/broker/queues/...``): queues and their messages by
    kind (dead-letter queues apart), and what happened to queue messages."""
    queues = broker.queues.views()
    dead = [q for q in queues if q.name.startswith("$dlq/")]
    dead_depth = sum(q.depth for q in dead)
    qs = broker.queues.stats
    return [
        Family("mqttamqp_queues", GAUGE, "Durable queues ($queue/), and dead-letter "
               "queues ($dlq/).", "", "kind",
               (("dead_letter", len(dead)), ("queue", len(queues) - len(dead)))),
        Family("mqttamqp_queue_messages", GAUGE, "Messages held in durable queues and in "
               "dead-letter queues.", "", "kind",
               (("dead_letter", dead_depth),
                ("queue", sum(q.depth for q in queues) - dead_depth))),
        Family("mqttamqp_queue_events", COUNTER, "Queue messages appended (published; dead "
               "letters count again in their dead-letter queue), acknowledged, nacked, "
               "rejected, dead-lettered, redelivered, expired by retention, and queue "
               "publishes or acknowledgements refused.", "", "event",
               (("acknowledged", qs.acked), ("dead_lettered", qs.dead_lettered),
                ("expired", qs.expired), ("nacked", qs.nacked),
                ("published", qs.published), ("redelivered", qs.redelivered),
                ("refused", qs.refused), ("rejected", qs.rejected))),
        _one("mqttamqp_queue_stored_bytes", GAUGE, "Payload bytes all durable queues "
             "hold (--queue-max-total-bytes bounds it).", broker.queues.total_bytes,
             "bytes"),
        _one("mqttamqp_queue_memory_bytes", GAUGE, "Bytes of durable queue message "
             "bodies held in memory (--queue-memory-budget bounds it; the others are "
             "in storage only).", broker.queues.resident, "bytes"),
        _one("mqttamqp_queue_publishers_blocked", GAUGE, "1 while publishers to durable "
             "queues are blocked (--queue-max-total-bytes or --disk-free-limit reached), "
             "else 0.", 1 if broker.queues.blocked else 0),
    ]


def snapshot(broker: Broker) -> list[Family]:
    """Every family, read now from the broker (on the reactor thread)."""
    stats = broker.stats
    c = broker.view.counters()
    queued_bytes = 0
    for session in (*broker.sessions.values(), *broker.link_subscribers.values()):
        queued_bytes += session.queued_bytes
    online = sum(1 for s in broker.sessions.values() if s.link is not None)
    received, sent = stats.messages_by_protocol()
    families = [
        Family("mqttamqp_connections", GAUGE, "Live client connections.", "", "protocol",
               _by([("mqtt", 0), ("amqp", 0), ("amqp0-9-1", 0)]
                   + [(protocol_family(p), n) for p, n in c.by_protocol.items()])),
        Family("mqttamqp_sessions", GAUGE, "Sessions by client id, online (a connection "
               "holds it) or offline (persistent, waiting for its client).", "", "state",
               (("offline", c.sessions - online), ("online", online))),
        _one("mqttamqp_queued_messages", GAUGE, "Message copies routed to sessions and not "
             "yet written to a connection ($SYS messages/queued: received = sent + "
             "dropped + queued).", c.messages_queued),
        _one("mqttamqp_queued_bytes", GAUGE, "Payload bytes queued for sessions.",
             queued_bytes, "bytes"),
        _one("mqttamqp_retained_messages", GAUGE, "Retained messages clients stored "
             "($SYS not counted).", c.retained - c.retained_sys),
        _one("mqttamqp_subscriptions", GAUGE, "Topic filters subscribed.", c.subscriptions),
        _one("mqttamqp_amqp_links", GAUGE, "AMQP links attached now, refused ones not yet "
             "detached included (--amqp-max-links-total).", stats.amqp_links),
        _one("mqttamqp_wills_pending", GAUGE, "Stored wills (not yet published).", c.wills),
        _one("mqttamqp_wills_in_grace", GAUGE, "Wills restored at start whose grace "
             "period is still running.", broker.wills_in_grace),
        _one("mqttamqp_clients_maximum", GAUGE, "Most connections at once since start.",
             c.clients_maximum),
        _one("mqttamqp_storage_failing", GAUGE, "1 while store commits fail (nothing "
             "durable is acknowledged), else 0.", 1 if c.storage_failing else 0),
        _one("mqttamqp_start_time_seconds", GAUGE, "When the broker started, seconds since "
             "the epoch.", c.started),
        Family("mqttamqp_messages_received", COUNTER, "Messages routed, by who published "
               "them (broker: wills; the console's test publishes count as mqtt).", "",
               "protocol",
               tuple(sorted(received.items()))),
        Family("mqttamqp_messages_sent", COUNTER, "Messages sent to clients ($SYS "
               "updates not counted).", "",
               "protocol", tuple(sorted(sent.items()))),
        Family("mqttamqp_messages_dropped", COUNTER, "Messages not delivered: at a session's "
               "queue bound or still queued when it ended (queue), QoS 0 for a client "
               "that does not read (congestion), AMQP Rejected (rejected), a publish "
               "refused (denied); protocol: the receiving session's (the publisher's for "
               "denied).", "",
               ("reason", "protocol"), _dropped(broker, stats, c.publish_denied)),
        _one("mqttamqp_messages_amqp_only", COUNTER, "AMQP messages with no MQTT form "
             "(delivered to AMQP receivers only).", stats.messages_amqp_only),
        _one("mqttamqp_received_bytes", COUNTER, "Bytes read from clients.",
             c.bytes_received, "bytes"),
        _one("mqttamqp_sent_bytes", COUNTER, "Bytes written to clients.", c.bytes_sent,
             "bytes"),
        Family("mqttamqp_connects", COUNTER, "Connections accepted (after CONNACK or "
               "AMQP open).", "", "protocol",
               _by([("mqtt", 0), ("amqp", 0)]
                   + [(protocol_family(p), n) for p, n in stats.connects.items()])),
        Family("mqttamqp_disconnects", COUNTER, "Connections ended, by cause.", "", "cause",
               _by(stats.disconnects.items())),
        _one("mqttamqp_connections_refused", COUNTER, "Connections refused (limits, bad "
             "CONNECT, authentication).", c.connections_refused),
        _one("mqttamqp_auth_failures", COUNTER, "Failed authentications.",
             stats.auth_failures),
        _one("mqttamqp_protocol_errors", COUNTER, "Connections closed for a protocol "
             "error.", c.protocol_errors),
        Family("mqttamqp_limit_hits", COUNTER, "How often each limit refused something "
               "($SYS/broker/limits/<name>).", "", "limit", _by(stats.limits.items())),
        _one("mqttamqp_mqtt_turns_yielded", COUNTER, "Times an MQTT connection's input "
             "was held for a later turn of the event loop after its share of one "
             "(--mqtt-turn-ms).", stats.mqtt_turns_yielded),
        _one("mqttamqp_write_failures", COUNTER, "Writes to a connection's socket that "
             "raised (what they held was dropped; logged a line a minute).",
             stats.write_failures),
        _one("mqttamqp_amqp_settled_without_outcome", COUNTER, "AMQP deliveries the "
             "receiver settled without an outcome (consumed; sent again on a gateway's "
             ".publish): a peer that loops shows here.", stats.settled_without_outcome),
        _one("mqttamqp_wills_published", COUNTER, "Wills published.", c.wills_published),
        _one("mqttamqp_commits", COUNTER, "Successful store submits (what callers waited "
             "for; several share a commit: mqttamqp_store_group_commits).", stats.commits),
        _one("mqttamqp_commit_failures", COUNTER, "Failed store commits.",
             c.storage_failures),
        _histogram("mqttamqp_commit_latency_seconds", "From handing a batch to the writer "
                   "thread to its durable commit.", stats.commit_latency, "seconds"),
        _histogram("mqttamqp_commit_batch_size", "Store operations per commit.",
                   stats.commit_batch),
        _histogram("mqttamqp_publish_deliver_latency_seconds", "From a message's arrival to "
                   "its delivery to a client (one delivery in 1024 sampled).",
                   stats.deliver_latency, "seconds"),
    ]
    families.extend(_queue_families(broker))
    tx = broker.transactions.counts()
    families.append(_one("mqttamqp_transactions_open", GAUGE, "Local transactions (AMQP "
                         "1.0 coordinator, AMQP 0.9.1 tx) open now.", tx["open"]))
    families.append(Family(
        "mqttamqp_transactions", COUNTER, "Local transactions declared, committed, rolled "
        "back (asked, or their link, channel or connection ended), failed (could only "
        "roll back, or not stored), and work refused over a bound "
        "(--max-transactions-per-connection, --max-transaction-bytes).", "", "event",
        tuple((k, float(tx[k])) for k in ("committed", "declared", "failed", "refused",
                                           "rolled_back"))))
    archive = c.archive
    for key, doc in (("records", "Records archived."), ("dropped", "Archive records "
                     "dropped (the writer fell behind)."), ("errors", "Archive write errors.")):
        if key in archive:
            families.append(_one(f"mqttamqp_archive_{key}", COUNTER, doc, archive[key]))
    return families


def _prometheus(family: Family) -> Metric:
    labels = list(family.label_names)
    metric: Metric
    if family.kind == HISTOGRAM:
        h = HistogramMetricFamily(family.name, family.doc, unit=family.unit)
        h.add_metric([], [(_le(b), float(n)) for b, n in family.buckets], family.total)
        return h
    if family.kind == COUNTER:
        metric = CounterMetricFamily(family.name, family.doc, labels=labels,
                                     unit=family.unit)
    else:
        metric = GaugeMetricFamily(family.name, family.doc, labels=labels, unit=family.unit)
    for label_values, value in family.labelled():
        metric.add_metric([label_values[n] for n in labels], value)
    return metric


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class BrokerCollector(Collector):
    """A custom collector: every scrape reads the broker's live numbers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        for family in snapshot(self.broker):
            yield _prometheus(family)

    def describe(self) -> Iterable[Any]:
        # Nothing up front: registering must not read the broker before it starts.
        return ()


class HACollector(Collector):
    """--ha: the role (``mqttamqp_ha_role{role=...}`` 1 for the current one), the
    epoch, since when this broker leads, its last takeover's duration and the
    database's latency, from ``figures()`` (``mqttamqp.ha.HighAvailability``)."""

    ROLES = ("standby", "leader", "fenced")

    def __init__(self, figures: Any) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self.figures()
        role = GaugeMetricFamily("mqttamqp_ha_role", "--ha: 1 for this broker's role "
                                 "(standby, leader, fenced), 0 for the others.",
                                 labels=["role"])
        for name in self.ROLES:
            role.add_metric([name], 1 if f["role"] == name else 0)
        yield role
        for name, doc, value in (
                ("mqttamqp_ha_epoch", "--ha: the leader epoch this broker claimed (0 "
                 "while standby).", f["epoch"] or 0),
                ("mqttamqp_ha_leader_since_seconds", "--ha: when this broker became the "
                 "leader, seconds since the epoch (0 while standby).", f["leader_since"]),
                ("mqttamqp_ha_last_takeover_seconds", "--ha: how long this broker's "
                 "takeover took (state loaded, listeners open).",
                 f["last_takeover_seconds"]),
                ("mqttamqp_ha_database_latency_seconds", "--ha: round trip of the last "
                 "statement on the serving lock's connection.",
                 f["database_latency_seconds"])):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)


# (metric, kind, what it is, the key of ``Bridges.figures``)
_BRIDGE_METRICS = (
    ("mqttamqp_bridge_up", GAUGE, "1 while the bridge is connected to its remote.", ""),
    ("mqttamqp_bridge_connected_since_seconds", GAUGE, "When the bridge connected, "
     "seconds since the epoch (0 while not connected).", "connected_since"),
    ("mqttamqp_bridge_connect_attempts", COUNTER, "Connection attempts toward the remote.",
     "attempts"),
    ("mqttamqp_bridge_connect_failures", COUNTER, "Attempts that failed, and connections "
     "lost once connected.", "failures"),
    ("mqttamqp_bridge_messages_out", COUNTER, "Messages sent to the remote (out rules; "
     "resends counted).", "sent"),
    ("mqttamqp_bridge_messages_in", COUNTER, "Messages received from the remote (in "
     "rules).", "received"),
    ("mqttamqp_bridge_too_large", COUNTER, "Out messages dropped: above the remote's "
     "maximum packet size (AMQP: max-message-size).", "too_large"),
    ("mqttamqp_bridge_too_large_in", COUNTER, "In messages dropped: above --max-packet-size "
     "(from a 3.1.1 remote: acknowledged to it; AMQP: rejected).", "too_large_in"),
    ("mqttamqp_bridge_released", COUNTER, "Out messages an AMQP remote released or "
     "modified (sent again).", "released"),
    ("mqttamqp_bridge_full_dropped", COUNTER, "Out messages an AMQP remote refused for "
     "now (amqp:resource-limit-exceeded) for max-full-wait seconds: dropped (counted in "
     "remote_refused too).", "full_dropped"),
    ("mqttamqp_bridge_echoes", COUNTER, "In messages that were ours, back from an AMQP "
     "remote on a both rule (accepted, not published).", "echoes"),
    ("mqttamqp_bridge_too_many_hops", COUNTER, "Out messages not sent: they had crossed "
     "max-hops bridges already (a loop).", "too_many_hops"),
    ("mqttamqp_bridge_remote_refused", COUNTER, "Out messages the remote refused (MQTT 5 "
     "PUBACK failure codes; AMQP: rejected, or modified delivery-failed past "
     "max-resends).", "remote_refused"),
    ("mqttamqp_bridge_refused_here", COUNTER, "In messages refused here: by a durable "
     "queue (for now: not acknowledged, the connection dropped; for good: dropped_in); "
     "AMQP: also undecodable, a bad topic or a queue acknowledgement (rejected).",
     "refused_here"),
    ("mqttamqp_bridge_dropped_in", COUNTER, "In messages a durable queue here refused "
     "for good (it would refuse them again): the remote told (MQTT: acknowledged, at "
     "MQTT 5 with the reason code; AMQP: rejected) and the message dropped (counted in "
     "refused_here too).", "dropped_in"),
    ("mqttamqp_bridge_backlog_messages", GAUGE, "Out messages waiting in the bridge's "
     "session (queued and in flight).", "backlog_messages"),
    ("mqttamqp_bridge_backlog_dropped", COUNTER, "Out messages dropped at the backlog's "
     "bound (max-backlog-bytes, max-backlog-messages).", "backlog_dropped"),
    ("mqttamqp_bridge_backlog_blocked", COUNTER, "Times the backlog's bound paused local "
     "publishers (on-full = \"block\").", "backlog_blocked"),
    ("mqttamqp_bridge_backlog_bytes", GAUGE, "Payload bytes queued in the bridge's "
     "session.", "backlog_bytes"),
)


class BridgeCollector(Collector):
    """``[[bridge]]`` tables: one series per bridge (label ``bridge``) of each
    ``mqttamqp_bridge_*`` metric, from ``figures()`` (``Bridges.figures``)."""

    def __init__(self, figures: Any) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        bridges = self.figures()
        for name, kind, doc, key in _BRIDGE_METRICS:
            family: Any = (CounterMetricFamily(name, doc, labels=["bridge"]) if kind == COUNTER
                           else GaugeMetricFamily(name, doc, labels=["bridge"]))
            for b in bridges:
                value = (1 if b["state"] == "connected" else 0) if not key else (b[key] or 0)
                family.add_metric([b["name"]], value)
            yield family


class StoreCollector(Collector):
    """The writer thread's own commits, from ``stats()`` (``ZODBStore``'s) while the
    store is open: how many commits it made, how many submits they held (their
    ratio: how many callers share a commit) and the time spent in them (their ratio
    to the commits: the engine's commit latency, e.g. PostgreSQL's round trips).
    ``mqttamqp_commits`` counts the submits (what callers waited for), not these."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if not s:
            return
        for name, doc, key in (
                ("mqttamqp_store_group_commits", "Commits the store's writer thread "
                 "made (each holds one or more submits).", "commits"),
                ("mqttamqp_store_committed_submits", "Submits those commits held.",
                 "batches"),
                ("mqttamqp_store_commit_seconds", "Time the writer thread spent "
                 "committing, summed.", "commit_seconds")):
            if key in s:
                yield CounterMetricFamily(name, doc, value=float(s[key]))

    def describe(self) -> Iterable[Any]:
        return ()


def broker_registry(broker: Broker) -> CollectorRegistry:
    """A registry of this broker's own (never the process-wide default one, which
    would mix brokers in tests), with the process' own figures beside the broker's:
    ``process_open_fds`` against ``process_max_fds`` (the unit's LimitNOFILE),
    resident memory, CPU seconds (read from /proc at scrape time; none elsewhere)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of everything in ``registry``."""
    return generate_latest(registry)

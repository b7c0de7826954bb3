"""``$SYS``: the broker's counters (and the archive's, when it is on) published as
retained topics every ``sys_interval`` seconds, each only when its value changed.

What it owns: building the current values and publishing them through the router
as the broker's own (uncounted, not stored) retained messages.  The counters
themselves live in ``stats.BrokerStats`` (and the durable queues' in
``queues.QueueStats``); this module only reads them.
"""

from __future__ import annotations

from mqttamqp import __version__
from mqttamqp.core.clients.registry import SessionRegistry
from mqttamqp.core.clients.wills import Wills
from mqttamqp.core.clock import Clock
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import DLQ_PREFIX
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.recorder import Recorder
from mqttamqp.core.routing.router import Router
from mqttamqp.core.stats import BrokerStats

__all__ = ["SysTopics", "queue_topics"]

UPTIME = "$SYS/broker/uptime"


def queue_topics(queues: QueueManager) -> list[tuple[str, str]]:
    """``$SYS/broker/queues/...``: how many queues and the messages they hold
    (dead-letter queues apart), and the queue counters since the start."""
    stats = queues.stats
    p = "$SYS/broker/queues/"
    total = queues.depth()
    dead = [name for name in queues.queues if name.startswith(DLQ_PREFIX)]
    dead_depth = sum(len(queues.queues[name].log) for name in dead)
    return [
        (p + "count", str(len(queues.queues) - len(dead))),
        (p + "messages", str(total - dead_depth)),
        (p + "dead-letter/count", str(len(dead))),
        (p + "dead-letter/messages", str(dead_depth)),
        (p + "published", str(stats.published)),
        (p + "acknowledged", str(stats.acked)),
        (p + "nacked", str(stats.nacked)),
        (p + "rejected", str(stats.rejected)),
        (p + "dead-lettered", str(stats.dead_lettered)),
        (p + "redelivered", str(stats.redelivered)),
        (p + "expired", str(stats.expired)),
        (p + "refused", str(stats.refused)),
        # The aggregate bounds (docs/queues.md): payload bytes stored, body
        # bytes in memory, and 1 while publishers to queues are blocked.
        (p + "bytes", str(queues.total_bytes)),
        (p + "memory-bytes", str(queues.resident)),
        (p + "blocked", "1" if queues.blocked else "0"),
    ]


class SysTopics:
    def __init__(self, clock: Clock, stats: BrokerStats, router: Router,
                 registry: SessionRegistry, wills: Wills, recorder: Recorder, *,
                 queues: QueueManager) -> None:
        self.clock = clock
        self.queues = queues
        self.recorder = recorder
        self.stats = stats
        self.router = router
        self.registry = registry
        self.wills = wills

    def publish(self) -> None:
        now = self.clock.seconds()
        dropped = self.registry.drops.dropped_total()
        queued = self.registry.drops.queued_total()
        self.stats.messages_dropped = dropped
        retained = self.router.retained
        # Clients' retained messages only: the $SYS topics are the broker's own.
        client_retained = len(retained) - retained.sys_count
        topics = self.stats.sys_topics(
            __version__, now, len(self.router.trie), client_retained,
            len(self.registry.sessions), len(self.wills.wills), dropped, queued)
        topics.extend(queue_topics(self.queues))
        archive = self.recorder.stats()
        for name in ("dropped", "records", "segments", "bytes", "errors", "lost"):
            if name in archive:
                topics.append((f"$SYS/broker/archive/{name}", str(archive[name])))
        for name, value in archive.items():   # other recorders' counters (webhooks/...)
            if "/" in name:
                topics.append((f"$SYS/broker/{name}", str(value)))
        # Only what changed since the retained copy, as Mosquitto does, and the
        # uptime at every burst (its first topic once the version is out: a watcher
        # sees the broker alive and where a burst starts).  A watcher holds every
        # value already (retained on subscribe, then each change), and routing all
        # ~55 topics every interval cost the reactor 1-3 ms under load, the late
        # messages of the tail (bench/README, "Tail latency, session 24").
        with self.stats.own_messages():   # (not traffic: neither received nor sent)
            for topic, payload in topics:
                data = payload.encode()
                if topic != UPTIME and retained.holds(topic, data):
                    continue
                self.router.publish(Message(topic, data, 0, True, None, now),
                                    counted=False)

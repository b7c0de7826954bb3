"""The durable queues' numbers for operators: ``$SYS/broker/queues/...`` and the
Prometheus families read the same counters, after a real flow through the façade
(fake links, ``task.Clock``): publish, ack, nack, reject to the dead-letter queue,
a refused publish."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from queue_facade import ack, client, join, last, make, send

from mqttamqp.core.broker import Broker
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.ops.metrics import broker_registry, exposition


def _sys(broker: Broker) -> dict[str, str]:
    broker.sys_topics.publish()
    prefix = "$SYS/broker/queues/"
    return {m.topic[len(prefix):]: m.payload.decode()
            for m in broker.view.retained_matching("$SYS/broker/queues/#")}


def _scrape(broker: Broker) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition(broker_registry(broker)).decode()):
        for s in family.samples:
            if s.name.startswith("mqttamqp_queue"):
                out.setdefault(s.name, {})[next(iter(s.labels.values()), "")] = s.value
    return out


def test_sys_and_metrics_count_the_same_queue_flow() -> None:
    """$SYS and the Prometheus families count the same queue flow: publish, ack, nack, dead
    letter, refusal."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#", consumer=Consumer(group="g"))
    for i in range(3):
        send(broker, "$queue/jobs/t", b"%d" % i)
    ack(broker, worker, last(link))                     # 2: acknowledged (in flight: 0, 1)
    first = link.published()[0][0]
    ack(broker, worker, first, "$nack")                 # 0: back, delivered again
    ack(broker, worker, last(link), "$reject", reason="bad")   # dead-lettered
    assert send(broker, "$queue/").refusal is not None  # refused: no name

    values = _sys(broker)
    assert values["count"] == "1" and values["dead-letter/count"] == "1"
    assert values["dead-letter/messages"] == "1"
    # (appends: the three publishes and the dead letter's append to $dlq/jobs)
    assert values["published"] == "4" and values["acknowledged"] == "1"
    assert values["nacked"] == "1" and values["rejected"] == "1"
    assert values["dead-lettered"] == "1" and values["refused"] == "1"
    assert values["redelivered"] == "1" and values["expired"] == "0"
    depth = sum(v.depth for v in broker.queues.views() if v.name == "jobs")
    assert values["messages"] == str(depth)

    metrics = _scrape(broker)
    assert metrics["mqttamqp_queues"] == {"queue": 1, "dead_letter": 1}
    assert metrics["mqttamqp_queue_messages"] == {"queue": depth, "dead_letter": 1}
    events = metrics["mqttamqp_queue_events_total"]
    for name, key in (("published", "published"), ("acknowledged", "acknowledged"),
                      ("nacked", "nacked"), ("rejected", "rejected"),
                      ("dead_lettered", "dead-lettered"), ("redelivered", "redelivered"),
                      ("expired", "expired"), ("refused", "refused")):
        assert events[name] == int(values[key]), name

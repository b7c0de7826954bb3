"""An MQTT publish that a queue bound to ``amq.topic`` appends (issue #29 2.3) tells
its publisher ``blocked`` while the durable queues' storage alarm holds, as a publish
to ``$queue/`` does, so the MQTT adapters and the bridge's ``in`` direction stop
reading it; with ``Clock``, fakes and the in-memory store."""

from __future__ import annotations

from exchange_facade import declared, depth
from fakes import MemoryStore
from twisted.internet.task import Clock

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message


def test_a_publish_a_bound_queue_takes_is_blocked_under_the_alarm() -> None:
    """Below --disk-free-limit, sensors/t (bound as sensors.#) is stored and blocked;
    a topic no queue is bound to is not blocked; once the alarm clears, neither is."""
    free = [10 << 30]
    clock = Clock()
    clock.advance(1000.0)
    broker = Broker(clock, MemoryStore(), Limits(sys_interval=0, disk_free_limit=1 << 30),
                    free_space=lambda: free[0])
    broker.start()
    declared(broker, "q")
    broker.exchanges.bind_queue("q", "amq.topic", "sensors.#")
    who = Identity("dev", None, "mqtt3.1.1")

    def pub(topic: str) -> bool:
        return broker.publish(Message(topic, b"x", 1, False, "dev", clock.seconds()),
                              who).blocked

    assert not pub("sensors/t")
    free[0] = 900 << 20
    clock.advance(2.0)
    assert broker.queues.blocked
    assert pub("sensors/t") and depth(broker, "q") == 2   # (stored, then held)
    assert not pub("other/t")
    free[0] = 2 << 30
    clock.advance(2.0)
    assert not broker.queues.blocked and not pub("sensors/t")

"""Which packets an MQTT connection holds while durable queues are blocked
(``mqtt.parking.Parked``), with no transport."""

from __future__ import annotations

from mqttamqp.core.queues.addresses import (
    NOT_QUEUED,
    QUEUE_COMMAND,
    QUEUED,
    is_queue_command,
    is_queue_topic,
)
from mqttamqp.mqtt.packets import Pingreq, Puback, Publish
from mqttamqp.mqtt.parking import PARKED_PACKETS, Parked


class _Queues:
    """The core's queues as parking asks them (``QueueManager.kind``'s answers)."""

    blocked = False

    def kind(self, topic: str) -> int:
        if not is_queue_topic(topic):
            return NOT_QUEUED
        return QUEUE_COMMAND if is_queue_command(topic) else QUEUED


def test_queue_publishes_and_what_follows_wait_in_order_acks_do_not() -> None:
    """A $queue/ PUBLISH waits and every packet after it too, except
    acknowledgements and PINGREQ; a plain PUBLISH before any is handled."""
    parked = Parked()
    assert not parked.hold(Publish("plain", b""), False, _Queues())
    assert parked.hold(Publish("$queue/q/a", b"x"), False, _Queues())
    assert parked.hold(Publish("plain", b"y"), False, _Queues())
    assert not parked.hold(Puback(1), False, _Queues())
    assert not parked.hold(Pingreq(), False, _Queues())
    assert [p.topic for p in (parked.take(), parked.take())] == ["$queue/q/a", "plain"]
    assert parked.bytes == 0 and not parked.packets


def test_an_mqtt5_qos1_queue_publish_is_not_held_when_it_is_refused_at_once() -> None:
    """MQTT 5 QoS 1/2 to a blocked queue is answered 0x97 by the core, not held;
    past the packet bound the connection is over its bound."""
    blocked = _Queues()
    blocked.blocked = True
    parked = Parked()
    assert not parked.hold(Publish("$queue/q/a", b"", 1, packet_id=1), True, blocked)
    for _ in range(PARKED_PACKETS + 1):
        parked.hold(Publish("$queue/q/a", b""), True, blocked)
    assert parked.over_bound


def test_a_queue_command_is_handled_even_behind_held_packets() -> None:
    """An ``$ack`` settles what the client consumed: never held, even after a held
    queue publish."""
    parked = Parked()
    assert parked.hold(Publish("$queue/q/a", b"x"), True, _Queues())
    assert not parked.hold(Publish("$queue/q/$ack", b""), True, _Queues())
    assert len(parked.packets) == 1

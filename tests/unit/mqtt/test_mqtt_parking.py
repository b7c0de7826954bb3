"""Which packets an MQTT connection holds while durable queues are blocked
(``mqtt.parking.Parked``), with no transport."""

from __future__ import annotations

from mqttamqp.mqtt.packets import Pingreq, Puback, Publish
from mqttamqp.mqtt.parking import PARKED_PACKETS, Parked


class _Queues:
    blocked = False


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

"""MQTT 5 features through a gateway (issue #29 §1): SUBACK 0x8F for an invalid
filter, topic aliases from the client, will properties, retain handling; against
the in-memory core (``gateway_memory``, ``amqp_memory``)."""

from __future__ import annotations

from amqp_memory import Net
from gateway_memory import Gateway
from test_gateway_acks import mqtt5_client

from mqttamqp.mqtt.packets import Suback, Subscribe


def test_an_invalid_mqtt5_filter_gets_0x8f_and_the_others_are_granted() -> None:
    """An MQTT 5 SUBSCRIBE with an invalid filter gets 0x8F for it in SUBACK (not a
    close), as from the broker; the other filters reach the core and are granted."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5bad")
    send(Subscribe(1, (("ok/#", 1), ("bad/#/x", 1), ("$share/g/t", 0))))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (1, 0x8F, 0)
    assert set(net.broker.sessions["v5bad"].subscriptions) == {"ok/#", "$share/g/t"}

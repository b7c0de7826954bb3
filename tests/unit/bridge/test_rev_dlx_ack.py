"""The review probe: a reject-publish-dlx queue's never-fits in message from a
bridge remote is not acknowledged before the commit holding its dead letter."""
from __future__ import annotations

from bridge_remote import TABLE, Remote
from core_broker import make_broker
from fakes import ManualStore

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Puback, Publish, Suback


def _sent(remote: Remote, level: int) -> list[object]:
    assert remote.transport is not None
    decoder = Decoder(server=True, protocol_level=level)
    decoder.feed(remote.transport.value())
    remote.transport.clear()
    return list(decoder)


def test_probe() -> None:
    """No PUBACK for a refused, dead-lettered in message while its commit is pending."""
    store = ManualStore()
    broker, clock, _ = make_broker(store)
    store.commit_all()
    broker.exchanges.declare_queue("over", "c1", durable=True)
    broker.exchanges.declare_queue("jobs", "c1", durable=True, arguments={
        "x-max-length-bytes": 4, "x-overflow": "reject-publish-dlx",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "over"})
    store.commit_all()
    remote = Remote()
    remote.up = True
    table = {**TABLE, "topics": ["$queue/jobs/# in 2"], "protocol": "5"}
    bridge = Bridge(broker, clock, BridgeSettings.from_table(table), remote)
    bridge.start()
    store.commit_all()
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0, None), 5))
    store.commit_all()
    (sub,) = _sent(remote, 5)
    remote.client.dataReceived(encode(Suback(sub.packet_id, (2,)), 5))
    store.commit_all()
    _sent(remote, 5)
    n = len(store.pending)
    remote.client.dataReceived(encode(Publish("$queue/jobs/a", b"x" * 10, 1, False, False, 7), 5))
    got = _sent(remote, 5)
    assert not (got and isinstance(got[0], Puback) and len(store.pending) > n), \
        "PUBACK sent while the dead letter's commit is pending"

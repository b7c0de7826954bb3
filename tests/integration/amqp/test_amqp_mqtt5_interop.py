"""MQTT 5 properties across protocols with real clients against the real broker:
paho-mqtt (MQTTv5) and python-qpid-proton's blocking API, each field of the mapping
(docs/amqp.md) both ways.  Every field, its edge cases and expiry in memory:
``test_amqp_mqtt5_map``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, conns, uid
from brokerproc import BrokerProcess
from paho.mqtt.packettypes import PacketTypes
from pahoclient import Paho5, props
from proton import Message, symbol, ubyte

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns"]  # fixtures

FORMAT = "x-opt-mqtt-payload-format"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("amqp-mqtt5")),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def paho5(broker: BrokerProcess) -> Iterator[Any]:
    made: list[Paho5] = []

    def open_client(client_id: str) -> Paho5:
        client = Paho5(broker.mqtt_port, client_id)
        made.append(client)
        return client

    yield open_client
    for client in made:
        client.stop()


def test_paho5_properties_reach_a_proton_receiver(broker, conns, paho5) -> None:
    """An MQTT 5 PUBLISH's properties arrive as the AMQP fields of the mapping."""
    topic = "x5/" + uid()
    conn = conns(broker)
    rcv = conn.create_receiver(topic)
    pub = paho5(uid("p"))
    p = props(PacketTypes.PUBLISH, ContentType="application/json",
              ResponseTopic=topic + "/reply", CorrelationData=b"\x07\x08",
              PayloadFormatIndicator=1, MessageExpiryInterval=300,
              UserProperty=[("unit", "C"), ("site", "2"), ("unit", "F")])
    pub.publish(topic, b'{"t": 21.5}', 1, properties=p)
    msg = rcv.receive(timeout=TIMEOUT)
    rcv.accept()
    assert bytes(msg.body) == b'{"t": 21.5}'
    assert msg.content_type == "application/json"
    assert msg.reply_to == topic + "/reply"
    assert msg.correlation_id == b"\x07\x08"
    assert msg.properties == {"unit": "C", "site": "2"}
    assert 0 < msg.ttl <= 300.0
    assert msg.annotations[symbol(FORMAT)] == 1


def test_proton_fields_reach_a_paho5_subscriber(broker, conns, paho5) -> None:
    """A proton Message's mapped fields arrive as MQTT 5 PUBLISH properties."""
    topic = "x5/" + uid()
    sub = paho5(uid("s"))
    assert sub.subscribe((topic, 1)) == [1]
    conn = conns(broker)
    snd = conn.create_sender(topic)
    msg = Message(body=b"hello", content_type="text/plain", reply_to=topic + "/reply",
                  correlation_id=b"\x01c", ttl=120.0, properties={"k": "v", "n": 7},
                  annotations={symbol(FORMAT): ubyte(1)})
    msg.inferred = True
    snd.send(msg, timeout=TIMEOUT)
    got = sub.get()
    gp = got.properties
    assert got.payload == b"hello"
    assert gp.ContentType == "text/plain"
    assert gp.ResponseTopic == topic + "/reply"
    assert gp.CorrelationData == b"\x01c"
    assert gp.UserProperty == [("k", "v"), ("n", "7")]
    assert 0 < gp.MessageExpiryInterval <= 120
    assert gp.PayloadFormatIndicator == 1

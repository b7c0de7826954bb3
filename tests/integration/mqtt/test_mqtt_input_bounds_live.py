"""What one MQTT client's input may cost a real broker process: others are answered
while one client floods, and too many MQTT 5 user properties are refused."""

from __future__ import annotations

import threading
import urllib.request
from typing import Any

import pytest
from brokerproc import BrokerProcess
from mqtt_strategies import pairs, raw_pair, raw_publish, users
from rawclient import ConnectionClosed, RawClient

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Suback,
    Subscribe,
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # A turn of 10 µs: every packet of a flood ends its connection's turn, so the
    # held-input path of the real reactor runs for each one.
    proc = BrokerProcess(str(tmp_path_factory.mktemp("bounds")), "--mqtt-turn-ms", "0.01",
                         "--max-user-properties", "16", listeners=("--mqtt", "--metrics"))
    proc.start()
    yield proc
    proc.stop()


def test_real_broker_refuses_too_many_user_properties(broker: BrokerProcess) -> None:
    """The issue's packet (100,000 user properties) gets DISCONNECT 0x97 and a
    closed socket; one log line; the limit is counted in /metrics; a packet at the
    limit reaches a subscriber with its properties."""
    sub = client5(broker, "bounds-sub")
    sub.send(Subscribe(1, (("bounds/#", 0),), (0,)))
    sub.expect(Suback)
    pub = client5(broker, "bounds-pub")
    pub.send(Publish("bounds/ok", b"x", properties=users(16)))
    got = sub.expect(Publish)
    assert isinstance(got, Publish) and got.properties is not None
    assert got.properties.user_properties == pairs(16)
    bad = client5(broker, "bounds-bad")
    bad.send(raw_publish(raw_pair(b"k", b"v") * 100_000, b"bounds/bad"))
    closing = bad.wait_closed()
    assert [type(p) for p in closing] == [Disconnect]
    assert isinstance(closing[0], Disconnect) and closing[0].reason_code == 0x97
    broker.wait_for_line(r"bounds-bad .* went beyond a limit: .*more than 16 user properties")
    assert metric(broker, 'mqttamqp_limit_hits_total{limit="user_properties"}') >= 1
    sub.send(Pingreq())
    sub.expect(Pingresp)
    assert [p for p in sub.backlog if isinstance(p, Publish)] == []


def test_others_are_answered_while_one_client_floods(broker: BrokerProcess) -> None:
    """While one client pipelines 3,000 PUBLISHes of 16 user properties, another's
    PINGREQs are answered before the flood is over, and every flooded message
    reaches the subscriber in order with its properties: the input held at the end
    of each turn is neither lost nor reordered (and turns did end: the counter)."""
    sub = client5(broker, "flood-sub")
    sub.send(Subscribe(1, (("flood/#", 0),), (0,)))
    sub.expect(Suback)
    pinger = client5(broker, "flood-pinger")
    flooder = client5(broker, "flood-pub")
    yielded = metric(broker, "mqttamqp_mqtt_turns_yielded_total")
    count = 3000
    stream = b"".join(encode(Publish("flood/t", str(i).encode(), properties=users(16)), 5)
                      for i in range(count)) + encode(Pingreq())
    received: list[Publish] = []
    started, done = threading.Event(), threading.Event()

    def receive() -> None:
        try:
            while len(received) < count:
                packet = sub.recv(timeout=30)
                if isinstance(packet, Publish):
                    received.append(packet)
                    started.set()
        except (TimeoutError, ConnectionClosed):
            pass
        done.set()

    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=flooder.sock.sendall, args=(stream,), daemon=True)
    sender.start()
    assert started.wait(30), "the flood did not begin"
    during = []
    for _ in range(5):
        pinger.send(Pingreq())
        pinger.expect(Pingresp, timeout=10)
        during.append(len(received))
    assert during[0] < count, "the first PINGRESP came only after the whole flood"
    assert done.wait(60), f"{len(received)} of {count} flooded messages arrived"
    sender.join(10)
    flooder.expect(Pingresp, timeout=30)
    assert [p.payload for p in received] == [str(i).encode() for i in range(count)]
    assert all(p.properties is not None and p.properties.user_properties == pairs(16)
               for p in received)
    assert metric(broker, "mqttamqp_mqtt_turns_yielded_total") > yielded
    assert "Traceback" not in broker.output()


def client5(broker: BrokerProcess, client_id: str) -> RawClient:
    c = RawClient(broker.mqtt_port, level=5)
    c.send(Connect("MQTT", 5, client_id, True, 0))
    ack = c.expect(Connack)
    assert isinstance(ack, Connack) and ack.return_code == 0
    return c


def metric(broker: BrokerProcess, name: str) -> float:
    url = f"http://127.0.0.1:{broker.ports['METRICS']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total

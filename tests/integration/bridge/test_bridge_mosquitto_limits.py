"""An MQTT 5 bridge toward a Mosquitto that announces limits in its CONNACK (maximum
QoS 1, no retain, a maximum packet size, a receive maximum, topic aliases): every
message that fits arrives, fitted; the one too large is dropped here and counted;
the connection is never dropped for any of them.  And the ``in`` direction paused
while the durable queues here are full on disk (the storage alarm)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer, running_mosquitto
from pahoclient import PahoClient

LIMITS = ("max_qos 1\nretain_available false\nmax_packet_size 2000\n"
          "max_inflight_messages 5\nmax_topic_alias 2\n")


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[MosquittoServer]:
    yield from running_mosquitto(tmp_path, "plain-mosquitto")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[MosquittoServer]:
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    server = MosquittoServer(str(directory), extra=LIMITS).start()
    yield server
    server.stop()


def test_out_messages_fitted_to_mosquitto_limits(tmp_path: Path,
                                                 limited: MosquittoServer) -> None:
    """QoS 2 and retained messages reach a limited Mosquitto at QoS 1 without retain,
    in order; one above its maximum packet size is dropped, logged, and the bridge
    stays connected (one "connected" line, no "lost")."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "lim"
address = "mqtt://127.0.0.1:{limited.port}"
protocol = "5"
topics = ["lim/# out 2"]
reconnect-min = 0.2
reconnect-max = 1.0
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()
    try:
        line = broker.wait_for_line(r"bridge lim to \S+: connected", timeout=15)
        assert "maximum QoS 1" in line and "no retain" in line, line
        far = PahoClient(limited.port, "far-lim")
        far.subscribe(("lim/#", 1))
        near = PahoClient(broker.mqtt_port, "near-lim")
        near.publish("lim/big", b"B" * 5000, qos=1)
        for i in range(20):
            near.publish(f"lim/t{i % 3}", b"m%02d" % i, qos=2, retain=i == 0)
        near.publish("lim/end", b"end", qos=1)
        got = [far.get() for _ in range(21)]
        assert [m.payload for m in got] == [b"m%02d" % i for i in range(20)] + [b"end"]
        assert [m.topic for m in got[:3]] == ["lim/t0", "lim/t1", "lim/t2"]
        assert not any(m.retain for m in got)
        broker.wait_for_line(r"bridge lim: a message on lim/big was dropped: \d+ bytes, "
                             r"above the remote's maximum packet size 2000", timeout=10)
        out = broker.output()
        assert out.count("bridge lim to ") == 2, out   # connecting, connected
        far.stop()
        near.stop()
    finally:
        broker.stop()


def test_in_pauses_while_the_storage_alarm_holds(tmp_path: Path,
                                                 remote: MosquittoServer) -> None:
    """``in`` messages to a durable queue here beyond --queue-max-total-bytes: the
    bridge stops reading Mosquitto (one line), and once a worker here drains the
    queue it reads again; every message arrives, in order."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["$queue/jobs/# in 1"]
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config),
                           "--queue-max-total-bytes", "4096").start()
    try:
        broker.wait_for_line("bridge hq: subscribed on the remote", timeout=15)
        far = PahoClient(remote.port, "far-jobs")
        for i in range(12):
            far.publish("$queue/jobs/a", b"%02d" % i + b"j" * 1000, qos=1)
        broker.wait_for_line("bridge hq: not reading the remote while the durable "
                             "queues are blocked", timeout=15)
        worker = PahoClient(broker.mqtt_port, "worker")
        worker.subscribe(("$queue/jobs/#", 1))
        got = [worker.get().payload[:2] for _ in range(12)]
        assert got == [b"%02d" % i for i in range(12)]
        broker.wait_for_line("bridge hq: reading the remote again", timeout=15)
        worker.stop()
        far.stop()
    finally:
        broker.stop()

"""An MQTT bridge's ``in`` message that a durable queue here can never take, through
the real broker process with Mosquitto as the remote: acknowledged to the remote and
dropped (counted, one line), so that what follows it still comes in; the bridge was
stuck on it for ever, reconnecting while Mosquitto sent it first again each time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer, running_mosquitto
from pahoclient import PahoClient
from pikaparams import parameters

CONNECTED = r"bridge hq to \S+: connected"
SUBSCRIBED = "bridge hq: subscribed on the remote"


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[MosquittoServer]:
    yield from running_mosquitto(tmp_path)


def test_a_message_the_local_queue_never_takes_does_not_stall_the_in_direction(
        tmp_path: Path, remote: MosquittoServer) -> None:
    """A 10-byte message for a reject-publish queue of 4 bytes is acknowledged to
    Mosquitto and dropped (one line, no reconnect); the next message reaches the
    queue."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ['jobs/# in 1 $queue/ ""']
reconnect-min = 0.2
reconnect-max = 1.0
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config),
                           listeners=("--mqtt", "--amqp")).start()
    conn = None
    far = None
    try:
        broker.wait_for_line(CONNECTED, timeout=15)
        broker.wait_for_line(SUBSCRIBED, timeout=15)
        conn = pika.BlockingConnection(parameters(broker))
        ch = conn.channel()
        ch.queue_declare("jobs", durable=True, arguments={
            "x-max-length-bytes": 4, "x-overflow": "reject-publish"})
        far = PahoClient(remote.port, "far-pub")
        far.publish("jobs/a", b"x" * 10, qos=1)
        line = broker.wait_for_line("refused here", timeout=15)
        assert "can never take a message of 10 bytes" in line
        assert "acknowledged to the remote, dropped; 1 dropped so far" in line
        far.publish("jobs/a", b"ok", qos=1)
        got = []
        for method, _, body in ch.consume("jobs", auto_ack=True, inactivity_timeout=15):
            assert method is not None, "nothing reached the queue"
            got.append(body)
            break
        assert got == [b"ok"]
        assert "bridge hq to" not in "".join(
            ln for ln in broker.log if ": lost" in ln or ": failing" in ln)
    finally:
        if far is not None:
            far.stop()
        if conn is not None and conn.is_open:
            conn.close()
        broker.stop()

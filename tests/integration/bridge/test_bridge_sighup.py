"""SIGHUP (sent by PID to the broker process this test started) applies a changed
``[[bridge]]`` set: a bridge removed from the file stops, a new one connects to
Mosquitto and carries messages, without a restart."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient


def _table(name: str, port: int, topics: str) -> str:
    return (f'[[bridge]]\nname = "{name}"\naddress = "mqtt://127.0.0.1:{port}"\n'
            f'topics = [{topics}]\nreconnect-min = 0.2\nreconnect-max = 1.0\n')


def test_sighup_adds_and_removes_bridges(tmp_path: Path) -> None:
    """After SIGHUP the removed bridge "old" stops and the new bridge "new" connects
    and forwards its out topic to Mosquitto."""
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    remote = MosquittoServer(str(directory)).start()
    config = tmp_path / "mqttamqp.toml"
    config.write_text(_table("old", remote.port, '"a/# out 1"'))
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()
    try:
        broker.wait_for_line(r"bridge old to \S+: connected", timeout=15)
        config.write_text(_table("new", remote.port, '"b/# out 1"'))
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"bridge old to \S+: stopped", timeout=15)
        line = broker.wait_for_line("bridges reloaded", timeout=15)
        assert "new added" in line and "old removed" in line, line
        broker.wait_for_line(r"bridge new to \S+: connected", timeout=15)
        far = PahoClient(remote.port, "far-reload")
        far.subscribe(("a/#", 1), ("b/#", 1))
        near = PahoClient(broker.mqtt_port, "near-reload")
        near.publish("a/x", b"not bridged any more", qos=1)
        near.publish("b/x", b"bridged", qos=1)
        got = far.get()
        assert (got.topic, got.payload) == ("b/x", b"bridged")
        far.stop()
        near.stop()
    finally:
        broker.stop()
        remote.stop()

"""The out backlog's bound with the real broker and Mosquitto as the remote: with
``on-full = "block"`` a publisher here is held (its PUBACKs wait) while the remote is
away and the backlog is full, and every message reaches the remote, in order, once it
is back; with ``drop`` the messages beyond the bound are dropped and counted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[MosquittoServer]:
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    server = MosquittoServer(str(directory))
    yield server
    server.stop()


def _broker(tmp_path: Path, remote: MosquittoServer, on_full: str) -> BrokerProcess:
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["sensors/# out 1"]
max-backlog-messages = 5
on-full = "{on_full}"
reconnect-min = 0.2
reconnect-max = 0.5
""")
    return BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()


def _keeper(remote: MosquittoServer) -> None:
    """A persistent subscriber on the remote, so that it keeps what arrives."""
    remote.start()
    sub = PahoClient(remote.port, "far-keeper", clean=False)
    sub.subscribe(("sensors/#", 1))
    sub.stop()
    remote.stop()


def test_block_holds_the_publisher_until_the_remote_took_the_backlog(
        tmp_path: Path, remote: MosquittoServer) -> None:
    """Remote away, bound 5, block: the publisher's later PUBACKs wait; once the
    remote is back all 20 arrive there in order, none dropped."""
    _keeper(remote)
    broker = _broker(tmp_path, remote, "block")
    try:
        pub = PahoClient(broker.mqtt_port, "near-pub")
        infos = [pub.c.publish("sensors/b", b"b%02d" % i, 1) for i in range(20)]
        broker.wait_for_line("bridge hq: the backlog reached its bound", timeout=15)
        infos[-1].wait_for_publish(1.0)   # (bounded: it must still wait)
        assert not infos[-1].is_published(), "acknowledged past a full backlog"
        remote.start()
        broker.wait_for_line("bridge hq: the backlog is below three quarters of its bound",
                             timeout=30)
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
        sub = PahoClient(remote.port, "far-keeper", clean=False)
        got = [sub.get().payload for _ in range(20)]
        assert got == [b"b%02d" % i for i in range(20)]
        assert "dropped at its queue bound" not in broker.output()
        pub.stop()
        sub.stop()
    finally:
        broker.stop()


def test_drop_beyond_the_bound_is_counted_and_logged(tmp_path: Path,
                                                     remote: MosquittoServer) -> None:
    """Remote away, bound 5, drop: 5 messages wait and reach the remote later; the
    rest are dropped, with one line naming the bridge's bound."""
    _keeper(remote)
    broker = _broker(tmp_path, remote, "drop")
    try:
        pub = PahoClient(broker.mqtt_port, "near-pub")
        for i in range(8):
            pub.publish("sensors/d", b"d%d" % i, qos=1)
        line = broker.wait_for_line(r"\$bridge/hq: \d+ QoS 1/2 message\(s\) dropped", 15)
        assert "max-backlog-messages 5" in line, line
        remote.start()
        sub = PahoClient(remote.port, "far-keeper", clean=False)
        got = [sub.get().payload for _ in range(5)]
        assert got == [b"d%d" % i for i in range(5)]
        pub.stop()
        sub.stop()
    finally:
        broker.stop()

"""A bridge's ``$SYS`` topics with the real broker and Mosquitto as the remote: under
``$SYS/broker/connection/<client id>/`` beside Mosquitto's ``state``, the messages sent
and received, their rates and the out backlog, retained, at every ``--sys-interval``
that changed them."""

from __future__ import annotations

import os
from pathlib import Path

from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient


def test_sys_topics_per_bridge(tmp_path: Path) -> None:
    """After 3 messages out, messages/sent says 3 and the backlog 0."""
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    remote = MosquittoServer(str(directory)).start()
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
client-id = "here.hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["sensors/# out 1"]
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config),
                           "--sys-interval", "0.5").start()
    try:
        broker.wait_for_line(r"bridge hq to \S+: connected", timeout=15)
        pub = PahoClient(broker.mqtt_port, "near-pub")
        for i in range(3):
            pub.publish("sensors/t", b"%d" % i, qos=1)
        watcher = PahoClient(broker.mqtt_port, "watcher")
        watcher.subscribe(("$SYS/broker/connection/here.hq/#", 0))
        seen: dict[str, bytes] = {}
        for _ in range(200):   # (bounded: a round of 8 topics every 0.5 s)
            m = watcher.get()
            seen[m.topic] = m.payload
            if seen.get("$SYS/broker/connection/here.hq/messages/sent") == b"3":
                break
        p = "$SYS/broker/connection/here.hq/"
        assert seen[p + "messages/sent"] == b"3", seen
        assert seen.get(p + "state") == b"1", seen
        for _ in range(40):   # (bounded: a round publishes what changed)
            if seen.get(p + "backlog/messages") == b"0":
                break
            m = watcher.get()
            seen[m.topic] = m.payload
        assert seen.get(p + "backlog/messages") == b"0", seen
        for c in (pub, watcher):
            c.stop()
    finally:
        broker.stop()
        remote.stop()

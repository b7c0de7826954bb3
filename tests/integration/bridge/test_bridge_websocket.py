"""``ws://`` and ``wss://`` remotes: the bridge as an MQTT client over a WebSocket
(autobahn, subprotocol ``mqtt``) to a second mqttamqp's ``--mqtt-ws`` listener (plain
and TLS with a ``mqttamqp-admin gen-cert`` certificate) and to Mosquitto's
websockets listener, QoS 1 both ways; a wrong path is one failing line."""

from __future__ import annotations

import os
from pathlib import Path

from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient
from ports import free_port

from mqttamqp.console.credentials import main as admin_main


def _near(tmp_path: Path, address: str, extra: str = "") -> BrokerProcess:
    config = tmp_path / "near.toml"
    config.write_text(f"""
[[bridge]]
name = "web"
address = "{address}"
topics = ["up/# out 1", "down/# in 1"]
reconnect-min = 0.2
reconnect-max = 1.0
{extra}
""")
    return BrokerProcess(os.path.join(tmp_path, "near"), "--config", str(config)).start()


def _both_ways(near: BrokerProcess, far_port: int) -> None:
    """QoS 1 out (near to far) and in (far to near), in order."""
    near.wait_for_line(r"bridge web to \S+: connected", timeout=15)
    near.wait_for_line("bridge web: subscribed on the remote", timeout=15)
    far_sub = PahoClient(far_port, "far-sub")
    far_sub.subscribe(("up/#", 1))
    near_sub = PahoClient(near.mqtt_port, "near-sub")
    near_sub.subscribe(("down/#", 1))
    near_pub = PahoClient(near.mqtt_port, "near-pub")
    far_pub = PahoClient(far_port, "far-pub")
    for i in range(10):
        near_pub.publish("up/x", b"u%d" % i, qos=1)
        far_pub.publish("down/x", b"d%d" % i, qos=1)
    assert [far_sub.get().payload for _ in range(10)] == [b"u%d" % i for i in range(10)]
    assert [near_sub.get().payload for _ in range(10)] == [b"d%d" % i for i in range(10)]
    for c in (far_sub, near_sub, near_pub, far_pub):
        c.stop()


def test_ws_remote_to_a_second_mqttamqp(tmp_path: Path) -> None:
    """ws:// to the far broker's --mqtt-ws listener (path /mqtt by default)."""
    far = BrokerProcess(os.path.join(tmp_path, "far"),
                        listeners=("--mqtt", "--mqtt-ws")).start()
    try:
        near = _near(tmp_path, f"ws://127.0.0.1:{far.ports['MQTT-WS']}",
                     "try-private = false")
        try:
            _both_ways(near, far.mqtt_port)
        finally:
            near.stop()
    finally:
        far.stop()


def test_wss_remote_with_a_gen_cert_certificate(tmp_path: Path) -> None:
    """wss:// to a --mqtt-ws TLS listener serving a gen-cert certificate, verified by
    name against it as tls-ca."""
    pki = tmp_path / "pki"
    assert admin_main(["gen-cert", "--data", str(pki), "--host", "localhost"]) == 0
    crt, key = pki / "tls" / "server.crt", pki / "tls" / "server.key"
    far = BrokerProcess(os.path.join(tmp_path, "far"), listeners=("--mqtt", "--mqtt-ws"),
                        descriptions={"--mqtt-ws": f"ssl:0:privateKey={key}:certKey={crt}"
                                                   ":interface=127.0.0.1"}).start()
    try:
        near = _near(tmp_path, f"wss://localhost:{far.ports['MQTT-WS']}/mqtt",
                     f'try-private = false\ntls-ca = "{crt}"')
        try:
            _both_ways(near, far.mqtt_port)
        finally:
            near.stop()
    finally:
        far.stop()


def test_ws_remote_to_mosquitto(tmp_path: Path) -> None:
    """ws:// to Mosquitto's websockets listener (the bridge flag on, as toward
    Mosquitto over TCP)."""
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    ws_port = free_port()
    remote = MosquittoServer(str(directory), extra=(
        f"listener {ws_port} 127.0.0.1\nprotocol websockets\n")).start()
    try:
        near = _near(tmp_path, f"ws://127.0.0.1:{ws_port}")
        try:
            _both_ways(near, remote.port)
        finally:
            near.stop()
    finally:
        remote.stop()


def test_ws_remote_with_a_wrong_path_fails(tmp_path: Path) -> None:
    """The far listener serves /mqtt only: another path fails the handshake, one
    failing line naming it."""
    far = BrokerProcess(os.path.join(tmp_path, "far"),
                        listeners=("--mqtt", "--mqtt-ws")).start()
    try:
        near = _near(tmp_path, f"ws://127.0.0.1:{far.ports['MQTT-WS']}/elsewhere",
                     "try-private = false")
        try:
            line = near.wait_for_line(r"bridge web to \S+: (connected|failing)", 15)
            assert "failing (WebSocket handshake failed" in line, line
        finally:
            near.stop()
    finally:
        far.stop()

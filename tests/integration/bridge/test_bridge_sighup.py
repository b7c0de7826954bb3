"""SIGHUP (sent by PID to the broker process this test started) applies a changed
``[[bridge]]`` set: a bridge removed from the file stops, a new one connects to
Mosquitto and carries messages, without a restart; a removed
bridge closes its connection (``mqtts://`` and ``mqtt://``)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient
from pki import make_pki


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



class _Remote:
    """An MQTT remote on loopback (a thread of this test), over TLS when given a
    certificate: CONNACK to CONNECT, SUBACK to SUBSCRIBE, and unlike Mosquitto it never
    closes on DISCONNECT, so ``closed`` is set only when the bridge itself closes the
    connection."""

    def __init__(self, crt: str | None, key: str | None) -> None:
        context = None
        if crt is not None and key is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(crt, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(30)
        self.port = self.listener.getsockname()[1]
        self.context = context
        self.connected = threading.Event()
        self.disconnect_seen = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        raw, _ = self.listener.accept()
        conn = (self.context.wrap_socket(raw, server_side=True) if self.context is not None
                else raw)
        conn.settimeout(60)   # (bounds the thread: the test waits 15 s at most)
        buffer = b""
        try:
            while True:
                data = conn.recv(4096)
                if not data:
                    break
                buffer += data
                while len(buffer) >= 2 and len(buffer) >= 2 + buffer[1]:   # (short packets)
                    kind, body, buffer = buffer[0] >> 4, buffer[2:2 + buffer[1]], \
                        buffer[2 + buffer[1]:]
                    if kind == 1:
                        conn.sendall(b"\x20\x02\x00\x00")
                        self.connected.set()
                    elif kind == 8:
                        conn.sendall(b"\x90\x03" + body[:2] + b"\x01")
                    elif kind == 14:
                        self.disconnect_seen.set()
        except (OSError, ssl.SSLError):
            pass
        self.closed.set()
        conn.close()
        self.listener.close()


@pytest.mark.parametrize("scheme", ["mqtts", "mqtt"])
def test_sighup_closes_a_removed_bridge(tmp_path: Path, scheme: str) -> None:
    """A bridge removed by SIGHUP (``mqtts://`` and ``mqtt://``) closes its connection
    itself (DISCONNECT, then the close) instead of staying connected."""
    pki = make_pki(str(tmp_path))
    tls = scheme == "mqtts"
    remote = _Remote(pki.server_crt if tls else None, pki.server_key if tls else None)
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f'[[bridge]]\nname = "sec"\naddress = "{scheme}://localhost:{remote.port}"\n'
                      + (f'tls-ca = "{pki.ca}"\n' if tls else "") + 'topics = ["a/# in 1"]\n')
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()
    try:
        broker.wait_for_line(r"bridge sec to \S+: connected", timeout=15)
        assert remote.connected.wait(15)
        config.write_text("# no bridge any more\n")
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGHUP)
        line = broker.wait_for_line("bridges reloaded", timeout=15)
        assert "sec removed" in line, line
        assert remote.closed.wait(15), "the removed bridge's connection stayed open"
        assert remote.disconnect_seen.is_set()
    finally:
        broker.stop()

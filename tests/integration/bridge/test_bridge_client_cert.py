"""``mqtts://`` remotes with certificates from ``mqttamqp-admin gen-cert``: Mosquitto
serving a gen-cert certificate for localhost and requiring a client certificate; the
bridge verifies it by name and presents its own (``cert-file``, ``key-file``, another
gen-cert certificate that Mosquitto trusts); without one, or with a wrong
``server-name``, it fails, one line each."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient

from mqttamqp.console.credentials import main as admin_main


def _gen_cert(directory: Path, host: str) -> tuple[str, str]:
    """(certificate, key) written by ``mqttamqp-admin gen-cert``."""
    assert admin_main(["gen-cert", "--data", str(directory), "--host", host]) == 0
    return str(directory / "tls" / "server.crt"), str(directory / "tls" / "server.key")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, tuple[str, str]]:
    return {"server": _gen_cert(tmp_path / "server-pki", "localhost"),
            "client": _gen_cert(tmp_path / "client-pki", "bridge.example")}


@pytest.fixture
def remote(tmp_path: Path, pki: dict[str, tuple[str, str]]) -> Iterator[MosquittoServer]:
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    plain = MosquittoServer(str(directory)).port   # (a second, plain listener)
    server_crt, server_key = pki["server"]
    server = MosquittoServer(str(directory), extra=(
        f"certfile {server_crt}\nkeyfile {server_key}\ncafile {pki['client'][0]}\n"
        f"require_certificate true\nlistener {plain} 127.0.0.1\n")).start()
    server.plain_port = plain   # type: ignore[attr-defined]
    yield server
    server.stop()


def _bridge(tmp_path: Path, remote: MosquittoServer, ca: str, extra: str) -> BrokerProcess:
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "sec"
address = "mqtts://localhost:{remote.port}"
topics = ["up/# out 1"]
tls-ca = "{ca}"
reconnect-min = 0.2
reconnect-max = 1.0
{extra}
""")
    return BrokerProcess(os.path.join(tmp_path, "near"), "--config", str(config)).start()


def test_client_certificate_accepted_by_mosquitto(tmp_path: Path, remote: MosquittoServer,
                                                  pki: dict[str, tuple[str, str]]) -> None:
    """With cert-file and key-file the bridge is let in and carries QoS 1 there."""
    crt, key = pki["client"]
    near = _bridge(tmp_path, remote, pki["server"][0],
                   f'cert-file = "{crt}"\nkey-file = "{key}"')
    try:
        near.wait_for_line(r"bridge sec to \S+: connected", timeout=15)
        sub = PahoClient(remote.plain_port, "far-sub")   # type: ignore[attr-defined]
        sub.subscribe(("up/#", 1))
        pub = PahoClient(near.mqtt_port, "near-pub")
        pub.publish("up/x", b"signed", qos=1)
        assert sub.get().payload == b"signed"
        pub.stop()
        sub.stop()
    finally:
        near.stop()


def test_without_a_client_certificate_mosquitto_refuses(
        tmp_path: Path, remote: MosquittoServer, pki: dict[str, tuple[str, str]]) -> None:
    """Without cert-file the handshake fails: one failing line, no connection."""
    near = _bridge(tmp_path, remote, pki["server"][0], "")
    try:
        line = near.wait_for_line(r"bridge sec to \S+: (connected|failing)", timeout=15)
        assert "failing (connection lost" in line and "certificate required" in line, line
    finally:
        near.stop()


def test_a_wrong_server_name_fails_verification(
        tmp_path: Path, remote: MosquittoServer, pki: dict[str, tuple[str, str]]) -> None:
    """The gen-cert certificate names localhost: server-name wrong.example fails
    verification (VerificationError, named in the line), even with our certificate."""
    crt, key = pki["client"]
    near = _bridge(tmp_path, remote, pki["server"][0],
                   f'cert-file = "{crt}"\nkey-file = "{key}"\nserver-name = "wrong.example"')
    try:
        line = near.wait_for_line(r"bridge sec to \S+: (connected|failing)", timeout=15)
        assert "VerificationError" in line and "wrong.example" in line, line
    finally:
        near.stop()

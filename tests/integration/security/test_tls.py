"""TLS on every listener (issue 10): ``ssl:`` endpoints for MQTT, AMQP and the console,
TLS 1.2+ only, client certificates (``--tls-ca``, ``--tls-require-client-cert``,
``--tls-cert-as-user``) and ``mqttamqp-admin gen-cert``.

The broker runs as a child process on 127.0.0.1 port 0; a test CA, server and
client certificates are made here with ``cryptography``.  Every wait is bounded.
"""

from __future__ import annotations

import ipaddress
import os
import queue
import socket
import ssl
import stat
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from brokerproc import BrokerProcess
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion
from pki import Pki
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from mqttamqp.console.credentials import main as admin_main
from mqttamqp.security.users import make_line

TIMEOUT = 10.0

# -- a small PKI --------------------------------------------------------------------


def _broker(tmp: Any, pki: Pki, *extra: str, kinds: tuple[str, ...] = ("--mqtt",)
            ) -> BrokerProcess:
    return BrokerProcess(str(tmp), "--sys-interval", "0", "--no-archive", *extra,
                         listeners=kinds, descriptions={k: pki.ssl() for k in kinds})


# -- clients ------------------------------------------------------------------------


class TLSPaho:
    """A paho client over TLS whose connection either gets a CONNACK or ends."""

    def __init__(self, port: int, client_id: str, ca: str,
                 cert: tuple[str, str] | None = None, username: str | None = None,
                 password: str | None = None) -> None:
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             reconnect_on_failure=False)
        self.c.tls_set(ca_certs=ca, certfile=cert[0] if cert else None,
                       keyfile=cert[1] if cert else None)
        if username is not None:
            self.c.username_pw_set(username, password)
        self.rc: int | None = None
        self.done = threading.Event()
        self.subscribed = threading.Event()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda *a: self.done.set()
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.error: Exception | None = None
        try:
            self.c.connect("127.0.0.1", port, 60)
        except (ssl.SSLError, OSError) as e:   # refused during the handshake
            self.error = e
            self.done.set()
            return
        self.c.loop_start()
        assert self.done.wait(TIMEOUT), f"{client_id}: neither CONNACK nor close"

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        self.rc = int(reason_code.value)
        self.done.set()

    @property
    def accepted(self) -> bool:
        return self.rc == 0

    def stop(self) -> None:
        if self.error is None:
            self.c.disconnect()
            self.c.loop_stop()


def _mqtt_round_trip(port: int, ca: str, cert: tuple[str, str] | None = None,
                     topic: str = "tls/t") -> None:
    c = TLSPaho(port, "tls-rt", ca, cert)
    try:
        assert c.accepted, (c.rc, c.error)
        c.c.subscribe(topic, 1)
        assert c.subscribed.wait(TIMEOUT)
        info = c.c.publish(topic, b"over TLS", 1)
        info.wait_for_publish(TIMEOUT)
        msg = c.messages.get(timeout=TIMEOUT)
        assert (msg.topic, msg.payload) == (topic, b"over TLS")
    finally:
        c.stop()


def _amqp_domain(ca: str, cert: tuple[str, str] | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(ca)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None:
        domain.set_credentials(cert[0], cert[1], None)
    return domain


def _amqp_round_trip(port: int, domain: SSLDomain) -> None:
    # proton checks the peer name as a DNS name (not an IP address): connect to
    # 127.0.0.1 as "localhost", which the server certificate names.
    conn = BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=TIMEOUT,
                              ssl_domain=domain, virtual_host="localhost")
    try:
        receiver = conn.create_receiver("tls/amqp")
        sender = conn.create_sender("tls/amqp")
        sender.send(Message(body="over TLS"))
        msg = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
        assert msg.body == "over TLS"
    finally:
        conn.close()


def _https_get(port: int, path: str, ca: str, cert: tuple[str, str] | None = None) -> int:
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert[0], cert[1])
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context,
                                timeout=TIMEOUT) as reply:
        status: int = reply.status
        return status


def _handshake(port: int, version: ssl.TLSVersion) -> str:
    """Try a TLS handshake limited to ``version`` alone (any cipher, no
    verification: only the version is in question); the version it got."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():   # TLS 1.1 is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = context.maximum_version = version
    context.set_ciphers("ALL:@SECLEVEL=0")   # so the client side can even offer it
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        with context.wrap_socket(raw) as tls:
            got = tls.version()
            assert got is not None
            return got


# -- TLS listeners, no client certificates -------------------------------------------


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    proc = _broker(tmp_path_factory.mktemp("data"), pki,
                   kinds=("--mqtt", "--amqp", "--web")).start()
    yield proc
    proc.stop()


def test_ssl_listeners_log_their_ports(tls_broker: BrokerProcess) -> None:
    """ssl: listeners for MQTT, AMQP and the console each log the port they bound."""
    assert set(tls_broker.ports) == {"MQTT", "AMQP", "WEB"}
    assert all(port > 0 for port in tls_broker.ports.values())


def test_mqtt_publish_subscribe_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    """paho publishes and subscribes over TLS, checking the broker's certificate."""
    _mqtt_round_trip(tls_broker.mqtt_port, pki.ca)


def test_amqp_send_receive_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    """proton sends and receives over TLS, checking the broker's certificate."""
    _amqp_round_trip(tls_broker.ports["AMQP"], _amqp_domain(pki.ca))


def test_console_over_https(tls_broker: BrokerProcess, pki: Pki) -> None:
    """The console answers over HTTPS."""
    assert _https_get(tls_broker.ports["WEB"], "/login", pki.ca) == 200


def test_plain_mqtt_on_a_tls_port_gets_no_connack(tls_broker: BrokerProcess) -> None:
    """A plain MQTT CONNECT on a TLS port gets no CONNACK."""
    with socket.create_connection(("127.0.0.1", tls_broker.mqtt_port), timeout=TIMEOUT) as s:
        s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        assert s.recv(4) != b"\x20\x02\x00\x00"


@pytest.mark.parametrize("kind", ["MQTT", "AMQP", "WEB"])
def test_tls_1_1_is_refused_and_1_2_accepted(tls_broker: BrokerProcess, kind: str) -> None:
    """Every TLS listener refuses TLS 1.1 and accepts TLS 1.2."""
    port = tls_broker.ports[kind]
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        _handshake(port, ssl.TLSVersion.TLSv1_1)
    assert _handshake(port, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


def _suite(port: int, suite: str) -> str | None:
    """A TLS 1.2 handshake offering ``suite`` alone: the suite agreed, or None if the
    broker refused it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(f"{suite}:@SECLEVEL=0")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                cipher = tls.cipher()
                return cipher[0] if cipher else None
        except (ssl.SSLError, ConnectionResetError):
            return None


_AEAD_ECDHE = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
               "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-AES128-GCM-SHA256",
               "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-CHACHA20-POLY1305"}


def test_tls_1_2_takes_only_ecdhe_aead_suites(tls_broker: BrokerProcess) -> None:
    """Every TLS 1.2 suite this client knows, offered alone: the broker agrees to
    ECDHE with AES-GCM or ChaCha20-Poly1305 only (no CBC, no SHA-1 MAC, no static
    RSA or DHE); TLS 1.3 is unchanged."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.set_ciphers("ALL:@SECLEVEL=0")
    offered = sorted({c["name"] for c in client.get_ciphers()
                      if c["protocol"] != "TLSv1.3"})
    assert "ECDHE-ECDSA-AES128-SHA" in offered and len(offered) < 200   # (bounded)
    port = tls_broker.mqtt_port
    accepted = {suite for suite in offered if _suite(port, suite) == suite}
    assert accepted <= _AEAD_ECDHE, accepted - _AEAD_ECDHE
    assert {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
            "ECDHE-ECDSA-CHACHA20-POLY1305"} <= accepted   # (the test key is EC)
    for kind in ("AMQP", "WEB"):
        assert _suite(tls_broker.ports[kind], "ECDHE-ECDSA-AES128-SHA") is None
        assert _suite(tls_broker.ports[kind], "ECDHE-ECDSA-AES256-SHA384") is None
        assert _suite(tls_broker.ports[kind], "ECDHE-ECDSA-AES128-GCM-SHA256") is not None
    for kind in ("MQTT", "AMQP", "WEB"):
        assert _handshake(tls_broker.ports[kind], ssl.TLSVersion.TLSv1_3) == "TLSv1.3"


def test_tls_1_2_minimum_holds_even_with_sslmethod(tmp_path: Any, pki: Pki) -> None:
    """An ``sslmethod=`` in the description does not lower the minimum."""
    proc = BrokerProcess(str(tmp_path), "--no-archive", listeners=("--mqtt",),
                         descriptions={"--mqtt": pki.ssl() + ":sslmethod=SSLv23_METHOD"})
    with proc:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _handshake(proc.mqtt_port, ssl.TLSVersion.TLSv1_1)
        assert _handshake(proc.mqtt_port, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


# -- client certificates -------------------------------------------------------------


@pytest.fixture(scope="module")
def cert_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki
                ) -> Iterator[BrokerProcess]:
    proc = _broker(tmp_path_factory.mktemp("data"), pki, "--tls-ca", pki.ca,
                   "--tls-require-client-cert", kinds=("--mqtt", "--amqp", "--web")).start()
    yield proc
    proc.stop()


def test_required_client_cert_refuses_mqtt_without_one(cert_broker: BrokerProcess,
                                                       pki: Pki) -> None:
    """With client certificates required, MQTT clients without one, or with one from
    another CA, are refused."""
    for cert in (None, pki.mallory):
        c = TLSPaho(cert_broker.mqtt_port, "no-cert", pki.ca, cert)
        try:
            assert not c.accepted, cert
        finally:
            c.stop()


def test_required_client_cert_accepts_a_ca_signed_one(cert_broker: BrokerProcess,
                                                      pki: Pki) -> None:
    """With client certificates required, a certificate the CA signed is accepted over
    MQTT, AMQP and HTTPS."""
    _mqtt_round_trip(cert_broker.mqtt_port, pki.ca, pki.alice)
    _amqp_round_trip(cert_broker.ports["AMQP"], _amqp_domain(pki.ca, pki.alice))
    assert _https_get(cert_broker.ports["WEB"], "/login", pki.ca, pki.alice) == 200


def test_required_client_cert_refuses_amqp_and_https_without_one(
        cert_broker: BrokerProcess, pki: Pki) -> None:
    """With client certificates required, AMQP and HTTPS clients without one are refused."""
    with pytest.raises(Exception):  # noqa: B017 - proton raises ConnectionException or SSLException
        _amqp_round_trip(cert_broker.ports["AMQP"], _amqp_domain(pki.ca))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionResetError)):
        _https_get(cert_broker.ports["WEB"], "/login", pki.ca)


def test_optional_client_cert_verifies_one_if_given(tmp_path: Any, pki: Pki) -> None:
    """--tls-ca without --tls-require-client-cert: no certificate is fine, a
    certificate from another CA is not."""
    with _broker(tmp_path, pki, "--tls-ca", pki.ca) as proc:
        _mqtt_round_trip(proc.mqtt_port, pki.ca)
        _mqtt_round_trip(proc.mqtt_port, pki.ca, pki.alice)
        c = TLSPaho(proc.mqtt_port, "mallory", pki.ca, pki.mallory)
        try:
            assert not c.accepted
        finally:
            c.stop()


def test_cert_as_user(tmp_path: Any, pki: Pki) -> None:
    """--tls-cert-as-user: alice's certificate makes her user 'alice' without a
    password, though --users does not list her; without a certificate the users file
    applies as usual."""
    users = tmp_path / "users"
    users.write_text(make_line("bob", "bob's password") + "\n")
    with _broker(tmp_path / "data", pki, "--tls-ca", pki.ca, "--tls-cert-as-user",
                 "--users", str(users), kinds=("--mqtt", "--amqp")) as proc:
        c = TLSPaho(proc.mqtt_port, "alice-device", pki.ca, pki.alice, username="someone")
        try:
            assert c.accepted, c.rc
            line = proc.wait_for_line(r"alice-device .*by its TLS client certificate")
            assert "is user 'alice'" in line
        finally:
            c.stop()
        anonymous = TLSPaho(proc.mqtt_port, "no-cert", pki.ca)
        anonymous.stop()
        assert anonymous.rc == 135   # CONNACK 5 (paho's MQTT 5 code for it)
        bob = TLSPaho(proc.mqtt_port, "bob-device", pki.ca, username="bob",
                      password="bob's password")
        bob.stop()
        assert bob.accepted
        # AMQP: the certificate is offered as SASL EXTERNAL, as user alice
        conn = BlockingConnection(f"amqps://127.0.0.1:{proc.ports['AMQP']}", timeout=TIMEOUT,
                                  ssl_domain=_amqp_domain(pki.ca, pki.alice),
                                  virtual_host="localhost", allowed_mechs="EXTERNAL")
        conn.close()
        line = proc.wait_for_line(r"is user .* by its TLS client certificate \(SASL EXTERNAL\)")
        assert "user 'alice'" in line
        # without a certificate EXTERNAL is not offered
        with pytest.raises(Exception):  # noqa: B017 - proton: ConnectionException or SSLException
            BlockingConnection(f"amqps://127.0.0.1:{proc.ports['AMQP']}", timeout=TIMEOUT,
                               ssl_domain=_amqp_domain(pki.ca), virtual_host="localhost",
                               allowed_mechs="EXTERNAL")


def test_cert_options_need_tls_ca(tmp_path: Any, pki: Pki) -> None:
    """--tls-require-client-cert without --tls-ca stops the broker at start, naming --tls-
    ca."""
    proc = _broker(tmp_path, pki, "--tls-require-client-cert")
    with pytest.raises(RuntimeError, match="needs --tls-ca"):
        proc.start()


# -- gen-cert ------------------------------------------------------------------------


def test_gen_cert_writes_a_usable_certificate(tmp_path: Any, capsys: Any) -> None:
    """mqttamqp-admin gen-cert writes a private key (mode 0600) and a certificate for the
    host a broker can serve TLS with, and refuses to overwrite them."""
    data = tmp_path / "data"
    assert admin_main(["gen-cert", "--data", str(data), "--host", "localhost"]) == 0
    key, crt = data / "tls" / "server.key", data / "tls" / "server.crt"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    with pytest.raises(SystemExit, match="exists"):
        admin_main(["gen-cert", "--data", str(data), "--host", "localhost"])
    description = f"ssl:0:privateKey={key}:certKey={crt}:interface=127.0.0.1"
    with BrokerProcess(str(data), "--no-archive", listeners=("--mqtt",),
                       descriptions={"--mqtt": description}) as proc:
        _mqtt_round_trip(proc.mqtt_port, str(crt))   # paho checks the host name too

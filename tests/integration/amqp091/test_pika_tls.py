"""AMQP 0.9.1 over TLS on the shared AMQP port with pika: PLAIN inside TLS, and SASL
EXTERNAL with a client certificate under --tls-cert-as-user."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from brokerproc import BrokerProcess

from mqttamqp.security.users import make_line

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tls091(tmp_path_factory: pytest.TempPathFactory, pki: Any) -> Iterator[BrokerProcess]:
    """A broker with an ssl: AMQP listener, client certificates from the test CA
    standing for their user, and one password user (bob)."""
    tmp = tmp_path_factory.mktemp("tls091")
    users = tmp / "users"
    users.write_text(make_line("bob", "bob's password") + "\n")
    proc = BrokerProcess(str(tmp / "data"), "--no-archive", "--tls-ca", pki.ca,
                         "--tls-cert-as-user", "--users", str(users),
                         listeners=("--mqtt", "--amqp"),
                         descriptions={"--mqtt": pki.ssl(), "--amqp": pki.ssl()})
    proc.start()
    yield proc
    proc.stop()


def tls_parameters(broker: BrokerProcess, pki: Any, cert: tuple[str, str] | None,
                   credentials: Any) -> pika.ConnectionParameters:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert is not None:
        context.load_cert_chain(cert[0], cert[1])
    return pika.ConnectionParameters(
        "127.0.0.1", broker.ports["AMQP"], credentials=credentials,
        ssl_options=pika.SSLOptions(context, "localhost"), connection_attempts=1,
        socket_timeout=10)


def round_trip(conn: pika.BlockingConnection) -> bytes:
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"over TLS")
    _, _, body = ch.basic_get(queue, auto_ack=True)
    return bytes(body)


def test_plain_login_over_tls(tls091: BrokerProcess, pki: Any) -> None:
    """A password user logs in with PLAIN inside TLS and round-trips a message."""
    conn = pika.BlockingConnection(tls_parameters(
        tls091, pki, None, pika.PlainCredentials("bob", "bob's password")))
    try:
        assert round_trip(conn) == b"over TLS"
    finally:
        conn.close()


def test_external_login_with_a_client_certificate(tls091: BrokerProcess, pki: Any) -> None:
    """alice's certificate makes her user alice with SASL EXTERNAL, no password."""
    conn = pika.BlockingConnection(tls_parameters(
        tls091, pki, pki.alice, pika.credentials.ExternalCredentials()))
    try:
        assert round_trip(conn) == b"over TLS"
        tls091.wait_for_line(r"AMQP 0\.9\.1 connection from .*user alice")
    finally:
        conn.close()


def test_external_without_a_certificate_is_refused(tls091: BrokerProcess, pki: Any) -> None:
    """Without a client certificate EXTERNAL is not offered: the login fails."""
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(tls_parameters(
            tls091, pki, None, pika.credentials.ExternalCredentials()))

"""MQTT 5 enhanced authentication against the real broker (issue 11): SCRAM-SHA-256
with a user of the one user store (added with ``mqttamqp-admin user add``), the
client side written in the tests (``support/scram.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from brokerproc import BrokerProcess
from rawclient import RawClient, uid
from scram import METHOD, ScramClient

from mqttamqp.mqtt.packets import Auth, Connack, Connect, Properties

pytestmark = pytest.mark.timeout(60)
ADMIN = os.path.join(os.path.dirname(sys.executable), "mqttamqp-admin")


@pytest.fixture
def scram_broker(tmp_path: Any) -> Iterator[BrokerProcess]:
    data = str(tmp_path / "data")
    os.makedirs(data)
    out = subprocess.run([ADMIN, "user", "add", "-d", data, "--password-stdin", "alice"],
                         input="alice password\n", text=True, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with BrokerProcess(data) as proc:
        yield proc


def _exchange(port: int, scram: ScramClient) -> Any:
    c = RawClient(port, level=5)
    c.send(Connect("MQTT", 5, uid("scram"), True, 30, properties=Properties(
        authentication_method=METHOD, authentication_data=scram.first())))
    challenge = c.recv()
    assert isinstance(challenge, Auth) and challenge.reason_code == 0x18, challenge
    assert challenge.properties is not None
    data = challenge.properties.authentication_data
    assert data is not None
    c.send(Auth(0x18, Properties(authentication_method=METHOD,
                                 authentication_data=scram.final(data))))
    return c.recv()


def test_scram_sha_256_against_the_user_store(scram_broker: BrokerProcess) -> None:
    """SCRAM-SHA-256 against a user of the store connects and proves the server; a wrong
    password or an unknown user gets 0x86."""
    scram = ScramClient("alice", "alice password")
    ack = _exchange(scram_broker.mqtt_port, scram)
    assert isinstance(ack, Connack) and ack.return_code == 0, ack
    assert ack.properties is not None
    # the server proves it knows the credentials too (RFC 5802 server-final)
    assert ack.properties.authentication_data == scram.expected_verifier.encode()
    wrong = _exchange(scram_broker.mqtt_port, ScramClient("alice", "not her password"))
    assert isinstance(wrong, Connack) and wrong.return_code == 0x86, wrong
    nobody = _exchange(scram_broker.mqtt_port, ScramClient("mallory", "x"))
    assert isinstance(nobody, Connack) and nobody.return_code == 0x86, nobody


def test_an_unknown_method_is_refused_with_0x8c(scram_broker: BrokerProcess) -> None:
    """An unknown authentication method gets CONNACK 0x8C."""
    c = RawClient(scram_broker.mqtt_port, level=5)
    c.send(Connect("MQTT", 5, uid("m"), True, 30, properties=Properties(
        authentication_method="KERBEROS-NOT-HERE", authentication_data=b"x")))
    ack = c.recv()
    assert isinstance(ack, Connack) and ack.return_code == 0x8C

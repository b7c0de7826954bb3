"""The user store and ACLs against the real broker (issue 10): users added and
removed with ``mqttamqp-admin`` while it runs, ACL verdicts over MQTT (paho) and
AMQP (proton), the ACL file re-read when it changes, and sessions that belong to
their user."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, body_bytes, receiver, take, uid
from amqp_messages import publish_message
from brokerproc import BrokerProcess
from console_support import CHEAP
from pahoclient import PahoClient
from proton import ConnectionException
from proton.utils import BlockingConnection, LinkDetached

from mqttamqp.security.userstore import UserStore

pytestmark = pytest.mark.timeout(120)
ADMIN = os.path.join(os.path.dirname(sys.executable), "mqttamqp-admin")

ACL = """\
topic read public/#
user alice
topic readwrite sensors/alice/#
user bob
topic readwrite sensors/bob/#
"""


@pytest.fixture
def secured(tmp_path: Any) -> Iterator[tuple[BrokerProcess, str, str]]:
    data = str(tmp_path / "data")
    UserStore(data).set_password("alice", "alice password", **CHEAP)
    acl = str(tmp_path / "acl")
    with open(acl, "w") as f:
        f.write(ACL)
    proc = BrokerProcess(data, "--acl", acl, listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc, data, acl
    proc.stop()


def test_a_start_logs_the_acl_rules_once(secured: tuple[BrokerProcess, str, str]) -> None:
    """The "ACL FILE: N rule(s) ..." line appears exactly once at start (it was twice:
    the option check built an authorizer of its own)."""
    proc, _, acl = secured
    lines = [line for line in proc.log if f"ACL {acl}: " in line]
    assert len(lines) == 1 and "3 rule(s) for 2 user(s)" in lines[0], proc.output()


def _admin(data: str, *args: str, password: str | None = None) -> str:
    out = subprocess.run([ADMIN, "user", args[0], "-d", data, *args[1:]],
                         input=password, text=True, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_users_acl_and_session_owners(secured: tuple[BrokerProcess, str, str]) -> None:
    """Users added while the broker runs, ACL verdicts over MQTT, the ACL file re-read on
    change, and sessions owned by their user."""
    proc, data, acl = secured
    port = proc.mqtt_port
    PahoClient(port, uid("anon"), expect_rc=5).stop()        # client users exist
    PahoClient(port, uid("x"), username="alice", password="wrong", expect_rc=4).stop()
    alice_id = uid("al")
    alice = PahoClient(port, alice_id, clean=False, username="alice",
                       password="alice password", expect_rc=0)
    try:
        # (public/# is granted to anonymous clients only: a user has its own rules)
        assert alice.subscribe(("sensors/alice/#", 1), ("sensors/#", 1),
                               ("public/#", 0)) == [1, 0x80, 0x80]
        alice.publish("sensors/bob/t", b"denied", qos=1)     # acknowledged, dropped
        alice.publish("sensors/alice/t", b"mine", qos=1)
        got = alice.until("sensors/alice/t")
        assert [m.payload for m in got] == [b"mine"]
        proc.wait_for_line(r"publish by .* denied")

        # a user added while the broker runs can connect at once...
        _admin(data, "add", "bob", "--password-stdin", password="bob password\n")
        PahoClient(port, uid("b"), username="bob", password="bob password",
                   expect_rc=0).stop()
        # ...but not take over alice's session,
        PahoClient(port, alice_id, username="bob", password="bob password",
                   expect_rc=5).stop()
        proc.wait_for_line(r"session of .* belongs to user 'alice'")
        assert alice.disconnected.is_set() is False           # alice is still on
        # and a deleted user is refused at once.
        _admin(data, "del", "bob")
        PahoClient(port, uid("b"), username="bob", password="bob password",
                   expect_rc=4).stop()

        # The ACL file is re-read when it changes.
        assert alice.subscribe(("extra/#", 0)) == [0x80]
        with open(acl, "w") as f:
            f.write(ACL.replace("user alice\n", "user alice\ntopic readwrite extra/#\n"))
        proc.wait_for_line(r"ACL .*: \d+ rule", timeout=15)
        assert alice.subscribe(("extra/#", 0)) == [0]
    finally:
        alice.stop()


def test_amqp_sasl_plain_with_the_store_and_acl(
        secured: tuple[BrokerProcess, str, str]) -> None:
    """AMQP SASL PLAIN against the user store, and the ACL refusing links with
    amqp:unauthorized-access."""
    proc, _, _ = secured
    url = f"127.0.0.1:{proc.ports['AMQP']}"
    with pytest.raises(ConnectionException):
        BlockingConnection(url, timeout=TIMEOUT, user="alice", password="wrong",
                           allowed_mechs="PLAIN", allow_insecure_mechs=True)
    conn = BlockingConnection(url, timeout=TIMEOUT, user="alice", password="alice password",
                              allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        with pytest.raises(LinkDetached) as err:
            receiver(conn, "sensors/#")
        assert "amqp:unauthorized-access" in str(err.value)
        with pytest.raises(LinkDetached) as err:
            conn.create_sender("sensors/bob/t")
        assert "amqp:unauthorized-access" in str(err.value)
        rcv = receiver(conn, "sensors/alice/#")
        conn.create_sender("sensors/alice/t").send(publish_message(None, b"hi", qos=1))
        message, _ = take(conn, rcv)
        rcv.accept()
        assert body_bytes(message) == b"hi"
    finally:
        conn.close()

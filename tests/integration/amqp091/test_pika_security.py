"""AMQP 0.9.1 users and ACLs with pika against the real broker: the one user store
(PLAIN), a wrong password, and ACL refusals as 403 channel errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from brokerproc import BrokerProcess
from console_support import CHEAP
from pikaparams import parameters

from mqttamqp.security.userstore import UserStore

pytestmark = pytest.mark.timeout(120)

ACL = """\
user alice
topic readwrite sensors/alice/#
topic readwrite $queue/alice-jobs/#
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with user alice and an ACL that lets her use her topics and queue."""
    tmp = tmp_path_factory.mktemp("secured091")
    data = str(tmp / "data")
    UserStore(data).set_password("alice", "alice password", **CHEAP)
    acl = str(tmp / "acl")
    with open(acl, "w") as f:
        f.write(ACL)
    proc = BrokerProcess(data, "--acl", acl, listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def connect(broker: BrokerProcess, user: str, password: str, **kw: Any
            ) -> pika.BlockingConnection:
    return pika.BlockingConnection(parameters(
        broker, credentials=pika.PlainCredentials(user, password), **kw))


def test_a_wrong_password_is_refused(secured: BrokerProcess) -> None:
    """A wrong password is refused at connection.start-ok (ACCESS_REFUSED)."""
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(secured, "alice", "wrong")
    assert "403" in str(info.value)


def test_the_right_password_opens(secured: BrokerProcess) -> None:
    """alice's password opens a connection and a channel."""
    conn = connect(secured, "alice", "alice password")
    try:
        assert conn.channel().is_open
    finally:
        conn.close()


def test_publish_to_a_topic_the_acl_denies_is_403(secured: BrokerProcess) -> None:
    """A publish to amq.topic on a topic alice may not write closes the channel, 403."""
    conn = connect(secured, "alice", "alice password")
    try:
        ch = conn.channel()
        ch.basic_publish("amq.topic", "sensors.bob.temp", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("alice-jobs")
        assert info.value.reply_code == 403
    finally:
        if conn.is_open:
            conn.close()


def test_consume_from_a_queue_the_acl_denies_is_403(secured: BrokerProcess) -> None:
    """basic.consume on a queue alice may not read closes the channel with 403."""
    conn = connect(secured, "alice", "alice password")
    try:
        ch = conn.channel()
        other = "other-" + uuid.uuid4().hex[:8]
        ch.queue_declare(other)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_consume(other, lambda *a: None)
        assert info.value.reply_code == 403
        ch2 = conn.channel()
        ch2.queue_declare("alice-jobs")
        ch2.basic_consume("alice-jobs", lambda *a: None)
    finally:
        if conn.is_open:
            conn.close()


def test_publish_to_a_queue_the_acl_denies_is_403(secured: BrokerProcess) -> None:
    """A publish through the default exchange is a write on $queue/<name>: 403 if denied."""
    conn = connect(secured, "alice", "alice password")
    try:
        ch = conn.channel()
        other = "other-" + uuid.uuid4().hex[:8]
        ch.queue_declare(other)
        ch.basic_publish("", other, b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare(other, passive=True)
        assert info.value.reply_code == 403
        ch2 = conn.channel()
        ch2.confirm_delivery()
        ch2.queue_declare("alice-jobs")
        ch2.basic_publish("", "alice-jobs", b"mine")
    finally:
        if conn.is_open:
            conn.close()

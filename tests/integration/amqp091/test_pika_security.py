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
topic read $queue/alice-in/#
exchange write alice-out          # publish only
exchange all alice-*-x            # her own exchanges
queue configure,write alice-feed-*
user ops
topic readwrite $queue/#
exchange all *
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with user alice and an ACL that lets her use her topics and queue."""
    tmp = tmp_path_factory.mktemp("secured091")
    data = str(tmp / "data")
    UserStore(data).set_password("alice", "alice password", **CHEAP)
    UserStore(data).set_password("ops", "ops password", **CHEAP)
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


def ops_queue(broker: BrokerProcess) -> str:
    """A queue ops declares (alice may not configure it)."""
    other = "other-" + uuid.uuid4().hex[:8]
    conn = connect(broker, "ops", "ops password")
    try:
        conn.channel().queue_declare(other)
    finally:
        conn.close()
    return other


def refused(conn: pika.BlockingConnection, action: Any) -> str:
    """``action(channel)`` on a new channel of ``conn`` closes it with 403: the text."""
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(ch)
        ch.queue_declare("alice-jobs", passive=True)   # (a publish is answered by none)
    assert info.value.reply_code == 403
    assert conn.is_open          # a channel error, never a dropped connection
    return str(info.value.reply_text)


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
        other = ops_queue(secured)
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
        other = ops_queue(secured)
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


def test_queue_permissions_mirror_the_topic_rules(secured: BrokerProcess) -> None:
    """Declare and delete need a grant on $queue/<name> (read or write), purge a read:
    alice may configure alice-jobs and alice-in, purge alice-in, but not declare,
    delete or purge a queue she has no grant on."""
    conn = connect(secured, "alice", "alice password")
    try:
        ch = conn.channel()
        ch.queue_declare("alice-jobs")
        ch.queue_declare("alice-in")
        ch.queue_purge("alice-in")
        other = ops_queue(secured)
        ch.queue_declare(other, passive=True)           # (passive: no permission)
        text = refused(conn, lambda c: c.queue_declare("nobodys-" + uuid.uuid4().hex[:6]))
        assert "configure access to queue 'nobodys-" in text and "user 'alice'" in text
        assert "configure access" in refused(conn, lambda c: c.queue_delete(other))
        assert "read access" in refused(conn, lambda c: c.queue_purge(other))
        # A server-named exclusive queue is hers to use whatever the rules.
        mine = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_purge(mine)
        ch.basic_consume(mine, lambda *a: None)
    finally:
        if conn.is_open:
            conn.close()


def test_exchange_permissions_come_from_exchange_lines(secured: BrokerProcess) -> None:
    """An exchange line grants configure/write/read on matching names ('*'); without
    one, declaring, deleting and publishing to an exchange are 403; binding a queue
    needs write on it (queue line or topic rule) and read on the exchange."""
    ops = connect(secured, "ops", "ops password")
    conn = connect(secured, "alice", "alice password")
    try:
        ops.channel().exchange_declare("alice-out", "fanout")
        ch = conn.channel()
        ch.exchange_declare("alice-1-x", "topic")
        ch.queue_declare("alice-feed-1")                  # queue line: configure, write
        ch.queue_bind("alice-feed-1", "alice-1-x", "a.#")
        ch.confirm_delivery()
        ch.basic_publish("alice-out", "", b"allowed")     # exchange line: write
        text = refused(conn, lambda c: c.exchange_declare("bobs-x", "direct"))
        assert "configure access to exchange 'bobs-x'" in text
        assert "write access to exchange 'amq.direct'" in refused(
            conn, lambda c: c.basic_publish("amq.direct", "k", b"x"))
        # alice-out: write only, so binding from it (a read) is refused
        assert "read access to exchange 'alice-out'" in refused(
            conn, lambda c: c.queue_bind("alice-feed-1", "alice-out"))
        # dead-lettering into an exchange is a write on it
        assert "write access to exchange 'bobs-x'" in refused(
            conn, lambda c: c.queue_declare("alice-feed-2", arguments={
                "x-dead-letter-exchange": "bobs-x"}))
        ch2 = conn.channel()
        ch2.queue_declare("alice-feed-3", arguments={"x-dead-letter-exchange": "alice-2-x"})
        ch2.exchange_delete("alice-1-x")
    finally:
        for c in (conn, ops):
            if c.is_open:
                c.close()


def test_binding_to_amq_topic_is_a_read_of_the_topic_filter(secured: BrokerProcess) -> None:
    """A binding from amq.topic reads MQTT topics: alice may bind her queue with
    sensors.alice.#, not with # or sensors.bob.*."""
    conn = connect(secured, "alice", "alice password")
    try:
        ch = conn.channel()
        ch.queue_declare("alice-jobs")
        ch.queue_bind("alice-jobs", "amq.topic", "sensors.alice.#")
        ch.queue_bind("alice-jobs", "amq.topic", "sensors.alice.*.temp")
        for key in ("#", "sensors.bob.*"):
            text = refused(conn, lambda c, key=key: c.queue_bind("alice-jobs", "amq.topic",
                                                                 key))
            assert f"read access to topic '{key}' in exchange 'amq.topic'" in text
    finally:
        if conn.is_open:
            conn.close()

"""Priority queues (issue 30) against the real broker with real clients: a queue
given levels by ``--queues`` (``max-priority``) is filled by AMQP 1.0 senders
(python-qpid-proton, header ``priority``) and MQTT publishers (paho, no priority:
the default 4) and read by an MQTT member and an AMQP 1.0 receiver highest level
first; AMQP 0.9.1 (pika) declares one with ``x-max-priority`` and publishes with
``basic.properties`` priority; and the order survives a ``kill -9`` of the broker.

Every wait is an event wait with a timeout (proton's blocking client, paho's
message queue, pika's blocking calls)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from amqp_clients import TIMEOUT, amqp, conns, paho, receiver, send_expect, take, uid
from brokerproc import BrokerProcess, RestartableBroker
from pikaparams import parameters
from proton import Delivery, Message

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures

QUEUES = """
[[queue]]
pattern = "prio*"
max-priority = 9
"""


def _queues_file(directory: Path) -> str:
    path = directory / "queues.toml"
    path.write_text(QUEUES)
    return str(path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("prio")
    proc = BrokerProcess(str(base / "data"), "--queues", _queues_file(base),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _fill(broker: BrokerProcess, conns, paho, name: str) -> None:
    """Low, default (MQTT) and high messages, in that order, all accepted."""
    conn = conns(broker)
    snd = conn.create_sender(f"$queue/{name}/k")
    for body, priority in (("low-1", 1), ("high-1", 9), ("low-2", 1)):
        assert send_expect(snd, Message(body=body, priority=priority)
                           ).remote_state == Delivery.ACCEPTED
    publisher = paho(broker, uid("p"))
    publisher.publish(f"$queue/{name}/k", b"plain", qos=1)
    assert send_expect(snd, Message(body="high-2", priority=200)
                       ).remote_state == Delivery.ACCEPTED


def _text(payload: bytes | str) -> str:
    return payload if isinstance(payload, str) else payload.decode()


def test_an_mqtt_member_gets_the_highest_level_first(broker, conns, paho) -> None:
    """An MQTT 3.1.1 member joining a filled priority queue gets high (9; 200 counts
    as 9), then MQTT's default (4), then low, each level in publish order."""
    name = uid("prio")
    _fill(broker, conns, paho, name)
    worker = paho(broker, uid("w"))
    assert worker.subscribe((f"$queue/{name}/#", 1)) == [1]
    got = [_text(worker.get().payload) for _ in range(5)]
    assert got == ["high-1", "high-2", "plain", "low-1", "low-2"]


def test_an_amqp_receiver_gets_the_highest_level_first(broker, conns, paho) -> None:
    """An AMQP 1.0 receiver on ``$queue/<name>`` gets the same order, and each
    message keeps the priority it was sent with."""
    name = uid("prio")
    _fill(broker, conns, paho, name)
    conn = conns(broker)
    rcv = receiver(conn, f"$queue/{name}", credit=10)
    got = []
    for _ in range(5):
        message, delivery = take(conn, rcv)
        got.append((_text(message.body) if isinstance(message.body, (str, bytes))
                    else bytes(message.body).decode(), message.priority))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
    assert [body for body, _ in got] == ["high-1", "high-2", "plain", "low-1", "low-2"]
    assert dict(got)["high-1"] == 9 and dict(got)["low-1"] == 1


def test_a_queue_without_levels_stays_first_in_first_out(broker, conns, paho) -> None:
    """A queue no max-priority rule names ignores the senders' priorities."""
    name = uid("fifo")
    _fill(broker, conns, paho, name)
    worker = paho(broker, uid("w"))
    assert worker.subscribe((f"$queue/{name}/#", 1)) == [1]
    got = [_text(worker.get().payload) for _ in range(5)]
    assert got == ["low-1", "high-1", "low-2", "plain", "high-2"]


def test_pika_x_max_priority_and_basic_properties_priority(broker) -> None:
    """pika declares x-max-priority 5 and publishes with priorities (none, 2, 9, 5)
    under confirms: basic.get takes 9 (as 5) and 5 in publish order, then 2, then
    the one without (0, as RabbitMQ); a stream queue with x-max-priority is 406."""
    conn = pika.BlockingConnection(parameters(broker))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        queue = uid("pq")
        channel.queue_declare(queue, durable=True, arguments={"x-max-priority": 5})
        for body, priority in ((b"none", None), (b"two", 2), (b"nine", 9), (b"five", 5)):
            channel.basic_publish("", queue, body,
                                  pika.BasicProperties(delivery_mode=2, priority=priority))
        got = []
        for _ in range(4):
            method, props, body = channel.basic_get(queue, auto_ack=True)
            assert method is not None
            got.append((body, props.priority))
        assert got == [(b"nine", 9), (b"five", 5), (b"two", 2), (b"none", None)]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(uid("ps"), durable=True,
                                  arguments={"x-queue-type": "stream", "x-max-priority": 3})
        assert info.value.reply_code == 406
    finally:
        if conn.is_open:
            conn.close()


def test_the_order_survives_kill_9(tmp_path) -> None:
    """Messages accepted (AMQP 1.0 Accepted after the commit) on a priority queue
    come back after ``kill -9`` and a restart in priority order."""
    queues = _queues_file(tmp_path)
    data = str(tmp_path / "data")
    name = uid("prio")
    proc = RestartableBroker(data, "--queues", queues, listeners=("--mqtt", "--amqp"))
    proc.start()
    try:
        conn = amqp(proc)
        snd = conn.create_sender(f"$queue/{name}/k")
        for body, priority in (("a", 2), ("b", 7), ("c", 2), ("d", 5), ("e", 7)):
            assert send_expect(snd, Message(body=body, priority=priority, durable=True)
                               ).remote_state == Delivery.ACCEPTED
    finally:
        proc.kill()
    again = RestartableBroker(data, "--queues", queues, listeners=("--mqtt", "--amqp"))
    again.start(timeout=60)
    try:
        conn = amqp(again)
        rcv = receiver(conn, f"$queue/{name}", credit=10)
        got = []
        for _ in range(5):
            message, delivery = take(conn, rcv, TIMEOUT)
            got.append(message.body)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        conn.close()
        assert got == ["b", "e", "d", "a", "c"]
    finally:
        again.stop()


def test_pika_basic_get_on_a_priority_queue_over_the_memory_budget(tmp_path) -> None:
    """With a 1-byte memory budget (every durable body read back from storage),
    pika's basic.get on an x-max-priority queue takes all 600 messages by level,
    in publish order within one, within the deadline: the read-backs follow the
    levels and what was read back is not evicted again before the get takes it
    (an empty answer only while a read is under way)."""
    proc = BrokerProcess(str(tmp_path / "data"), "--queue-memory-budget", "1",
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    conn = None
    try:
        conn = pika.BlockingConnection(parameters(proc))
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare("pg", durable=True, arguments={"x-max-priority": 9})
        sent = [(b"%04d-" % i + b"x" * 4000, (i * 7) % 10) for i in range(600)]
        for body, priority in sent:
            channel.basic_publish("", "pg", body,
                                  pika.BasicProperties(delivery_mode=2, priority=priority))
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            method, _, body = channel.basic_get("pg", auto_ack=True)
            if method is not None:     # (None: a read-back is under way)
                got.append(body)
        assert [b[:5] for b in got] == [b[:5] for b, _ in sorted(sent, key=lambda s: -s[1])]
    finally:
        if conn is not None and conn.is_open:
            conn.close()
        proc.stop()

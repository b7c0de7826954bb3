"""connection.blocked / unblocked with pika against the real broker: the durable
queues' storage bound raises the alarm, a purge from another connection clears it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pika
import pytest
from brokerproc import BrokerProcess
from pikaparams import parameters

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose durable queues may hold 20 kB in all."""
    data = str(tmp_path_factory.mktemp("blocked091"))
    proc = BrokerProcess(os.path.join(data, "data"), "--queue-max-total-bytes", "20000",
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def test_blocked_then_unblocked(small: BrokerProcess) -> None:
    """Past the bound the publisher hears connection.blocked; once another connection
    purges the queue it hears connection.unblocked and may publish again."""
    conn = pika.BlockingConnection(parameters(small))
    events: list[str] = []
    conn.add_on_connection_blocked_callback(lambda c, m: events.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
    ch = conn.channel()
    queue = "big-" + uuid.uuid4().hex[:8]
    ch.queue_declare(queue, durable=True)
    for _ in range(30):
        ch.basic_publish("", queue, b"x" * 1000, pika.BasicProperties(delivery_mode=2))
    rounds = 100
    while "blocked" not in events and rounds:
        conn.process_data_events(time_limit=0.1)
        rounds -= 1
    assert events == ["blocked"]
    other = pika.BlockingConnection(parameters(small))
    try:
        assert other.channel().queue_purge(queue).method.message_count > 0
    finally:
        other.close()
    rounds = 100
    while "unblocked" not in events and rounds:
        conn.process_data_events(time_limit=0.1)
        rounds -= 1
    assert events == ["blocked", "unblocked"]
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"after", pika.BasicProperties(delivery_mode=2))
    conn.close()

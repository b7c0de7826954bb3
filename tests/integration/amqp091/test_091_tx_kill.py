"""A 0.9.1 transaction is all or nothing over ``kill -9`` (issue 30; mqttamqp only).

A pika channel in tx mode takes ``M`` persistent messages from a durable queue
(unacked), publishes ``N`` persistent messages to another and acks the ``M``; the
broker process is killed with SIGKILL at one stage of it: after ``tx.select``,
with the work done but not committed, with ``tx.commit`` sent but not answered
(at once, and once another connection sees its publishes routed: the commit is
running, its store commit maybe not done), and after commit-ok.  After a restart
on the same data directory the outcome is the whole transaction or none of it:
``N`` published and the ``M`` gone, or no publish and the ``M`` back; after
commit-ok, always the whole.
"""

from __future__ import annotations

import os
import time

import pika
import pytest
from amqp091_target import ENV_URL, NOT_YET, amqp_url, speaks_amqp091, start_broker, uname
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(bool(os.environ.get(ENV_URL)), reason="kills mqttamqp's own process"),
    pytest.mark.skipif(not speaks_amqp091(), reason=NOT_YET),
]

N = 200          # publishes in the transaction (1 KiB each: a commit worth catching)
M = 50           # acknowledgements in it
PERSISTENT = pika.BasicProperties(delivery_mode=2)
STAGES = ("selected", "work done", "commit sent", "commit running", "commit-ok received")
WAIT = 30.0      # seconds for the commit to be seen running


def count(ch: BlockingChannel, queue: str) -> int:
    return int(ch.queue_declare(queue, durable=True, passive=True).method.message_count)


def bodies(ch: BlockingChannel, queue: str, limit: int) -> list[bytes]:
    """Every message of ``queue`` (auto-acknowledged), at most ``limit``."""
    got = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    return got


def run_until(stage: str, conn: BlockingConnection, source: str, sink: str,
              watch: BlockingChannel) -> None:
    """The transaction, up to ``stage``."""
    ch = conn.channel()
    ch.tx_select()
    if stage == "selected":
        return
    last = 0
    for _ in range(M):
        method, _props, _body = ch.basic_get(source, auto_ack=False)
        assert method is not None
        last = method.delivery_tag
    for i in range(N):
        ch.basic_publish("", sink, b"p%04d" % i + b"." * 1019, PERSISTENT)
    ch.basic_ack(last, multiple=True)
    if stage == "work done":
        conn.process_data_events(time_limit=0)
        ch.queue_declare(source, durable=True, passive=True)   # (all of it arrived)
    elif stage in ("commit sent", "commit running"):
        ch._impl.tx_commit(lambda _frame: None)    # (no waiting for commit-ok)
        conn._flush_output()
        if stage == "commit running":
            deadline = time.monotonic() + WAIT
            while count(watch, sink) == 0:
                assert time.monotonic() < deadline, f"the commit was not seen within {WAIT}s"
    elif stage == "commit-ok received":
        ch.tx_commit()


@pytest.mark.parametrize("stage", STAGES)
def test_kill_9_leaves_a_transaction_whole_or_absent(tmp_path: os.PathLike[str],
                                                     stage: str) -> None:
    """kill -9 at one stage of a 0.9.1 transaction: after the restart all of it or
    none of it is there (all of it once commit-ok was received)."""
    data = os.path.join(str(tmp_path), "data")
    source, sink = uname("txk-in"), uname("txk-out")
    broker = start_broker(data, restartable=True)
    try:
        conn = BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        ch.queue_declare(source, durable=True)
        ch.queue_declare(sink, durable=True)
        ch.confirm_delivery()
        for i in range(M):
            ch.basic_publish("", source, b"s%04d" % i, PERSISTENT)
        watcher = BlockingConnection(pika.URLParameters(amqp_url(broker)))
        run_until(stage, conn, source, sink, watcher.channel())
        broker.kill()

        broker = start_broker(data, restartable=True)
        conn = BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        published, left = count(ch, sink), count(ch, source)
        out = bodies(ch, sink, N + 1)
        conn.close()
    finally:
        broker.stop()
    assert len(out) == published
    if stage in ("selected", "work done"):
        assert (published, left) == (0, M), "work of an uncommitted transaction survived"
    elif stage == "commit-ok received":
        assert (published, left) == (N, 0), "a committed transaction was lost"
    else:
        assert (published, left) in ((0, M), (N, 0)), "a transaction was split by kill -9"
    if published:
        assert [b[:5] for b in out] == [b"p%04d" % i for i in range(N)]

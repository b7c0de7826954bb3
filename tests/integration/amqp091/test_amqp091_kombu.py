"""kombu over py-amqp (what every Celery worker speaks) against the broker's AMQP 0.9.1.

Declare, publish with publisher confirms, consume with a prefetch window, ack, reject
with and without requeue, RPC through an exclusive server-named reply queue, and
dead-lettering through ``x-dead-letter-exchange``.  Validated against RabbitMQ 3.10
(``MQTTAMQP_TEST_AMQP091_URL``, see tests/support/amqp091_target.py) before it judged
mqttamqp.  Where a test shows that something does *not* arrive, it publishes a marker
after it and checks that the marker comes next (a window that holds back deliveries is
the exception: there the test waits a bounded half second for nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqp091_target import TIMEOUT, Target, target, uname
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

pytestmark = pytest.mark.timeout(120)

DEFAULT = Exchange("", type="direct")


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


@pytest.fixture
def conn(amqp091: Target) -> Iterator[Connection]:
    """A kombu connection whose publishes wait for the broker's confirm."""
    c = Connection(amqp091.url, transport_options={"confirm_publish": True},
                   connect_timeout=TIMEOUT)
    c.connect()
    yield c
    c.release()


def drain_until(conn: Connection, done: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Handle the connection's events until ``done()``; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        assert left > 0, "timed out waiting for deliveries"
        try:
            conn.drain_events(timeout=left)
        except TimeoutError:
            pass


def nothing_more(conn: Connection, got: list[Any], wait: float = 0.5) -> None:
    """Assert that no delivery arrives within ``wait`` seconds (a bounded wait for
    nothing: a prefetch window holding back is seen only as an absence)."""
    before = len(got)
    try:
        conn.drain_events(timeout=wait)
    except TimeoutError:
        pass
    assert len(got) == before, got[before:]


def work_queue(name: str, **kwargs: Any) -> Queue:
    return Queue(name, exchange=DEFAULT, routing_key=name, durable=True, **kwargs)


def test_declare_publish_with_confirms_and_consume(conn: Connection) -> None:
    """A durable queue declared, three confirmed persistent JSON messages, consumed in order."""
    q = work_queue(uname("kb-basic"))
    ch = conn.channel()
    name, count, consumers = q(ch).queue_declare()
    assert (name, count, consumers) == (q.name, 0, 0)
    producer = Producer(ch, exchange=DEFAULT, serializer="json")
    for i in range(3):
        producer.publish({"n": i}, routing_key=q.name, delivery_mode=2, retry=False)
    got: list[Message] = []
    with Consumer(ch, queues=[q], accept=["json"],
                  callbacks=[lambda body, m: (got.append(m), m.ack())]):
        drain_until(conn, lambda: len(got) == 3)
    assert [m.decode() for m in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert got[0].content_type == "application/json"
    assert got[0].delivery_info["routing_key"] == q.name
    assert got[0].delivery_info["redelivered"] is False
    assert q(ch).queue_declare(passive=True)[1] == 0
    q(ch).delete()


def test_prefetch_window_holds_back_until_ack(conn: Connection) -> None:
    """With prefetch 2 a consumer holds at most 2 unacknowledged deliveries; an ack lets one in."""
    q = work_queue(uname("kb-prefetch"))
    ch = conn.channel()
    q(ch).declare()
    producer = Producer(ch, exchange=DEFAULT, serializer="json")
    for i in range(5):
        producer.publish({"n": i}, routing_key=q.name, delivery_mode=2, retry=False)
    got: list[Message] = []
    with Consumer(ch, queues=[q], accept=["json"], prefetch_count=2,
                  callbacks=[lambda body, m: got.append(m)]):
        drain_until(conn, lambda: len(got) == 2)
        nothing_more(conn, got)
        got[0].ack()
        drain_until(conn, lambda: len(got) == 3)
        nothing_more(conn, got)
        for m in got[1:]:
            m.ack()
        drain_until(conn, lambda: len(got) == 5)
        for m in got[3:]:
            m.ack()
    assert [m.decode()["n"] for m in got] == [0, 1, 2, 3, 4]
    q(ch).delete()


def test_reject_with_requeue_redelivers_then_reject_drops(conn: Connection) -> None:
    """reject(requeue=True) comes back flagged redelivered; reject(requeue=False) without a
    dead-letter exchange drops the message (the marker published after it comes next)."""
    q = work_queue(uname("kb-reject"))
    ch = conn.channel()
    q(ch).declare()
    producer = Producer(ch, exchange=DEFAULT, serializer="json")
    producer.publish({"job": 1}, routing_key=q.name, delivery_mode=2, retry=False)
    got: list[Message] = []
    with Consumer(ch, queues=[q], accept=["json"], prefetch_count=1,
                  callbacks=[lambda body, m: got.append(m)]):
        drain_until(conn, lambda: len(got) == 1)
        assert got[0].delivery_info["redelivered"] is False
        got[0].requeue()
        drain_until(conn, lambda: len(got) == 2)
        assert got[1].decode() == {"job": 1}
        assert got[1].delivery_info["redelivered"] is True
        got[1].reject(requeue=False)
        producer.publish({"marker": True}, routing_key=q.name, delivery_mode=2, retry=False)
        drain_until(conn, lambda: len(got) == 3)
        assert got[2].decode() == {"marker": True}
        got[2].ack()
    q(ch).delete()


def test_rpc_through_an_exclusive_reply_queue(amqp091: Target, conn: Connection) -> None:
    """A client asks through a work queue with reply_to = its exclusive server-named queue;
    the server's answer comes back there with the same correlation id."""
    rpc = work_queue(uname("kb-rpc"))
    server = Connection(amqp091.url, transport_options={"confirm_publish": True})
    server.connect()
    try:
        sch = server.channel()
        rpc(sch).declare()
        reply_queue = Queue("", exclusive=True, auto_delete=True)
        cch = conn.channel()
        bound = reply_queue(cch)
        reply_name = bound.queue_declare()[0]
        assert reply_name.startswith("amq.gen-"), reply_name

        def serve(body: Any, m: Message) -> None:
            Producer(sch, exchange=DEFAULT, serializer="json").publish(
                {"result": body["x"] * 2}, routing_key=m.properties["reply_to"],
                correlation_id=m.properties["correlation_id"], retry=False)
            m.ack()

        asked: list[Message] = []
        answers: list[Message] = []
        with Consumer(sch, queues=[rpc], accept=["json"], callbacks=[serve, lambda b, m:
                                                                     asked.append(m)]), \
                Consumer(cch, queues=[Queue(reply_name, exclusive=True, auto_delete=True,
                                            no_declare=True)],
                         accept=["json"], no_ack=True,
                         callbacks=[lambda b, m: answers.append(m)]):
            Producer(cch, exchange=DEFAULT, serializer="json").publish(
                {"x": 21}, routing_key=rpc.name, reply_to=reply_name, correlation_id="c-1",
                retry=False)
            drain_until(server, lambda: len(asked) == 1)
            drain_until(conn, lambda: len(answers) == 1)
        assert answers[0].decode() == {"result": 42}
        assert answers[0].properties["correlation_id"] == "c-1"
        rpc(sch).delete()
    finally:
        server.release()


def test_exclusive_queue_is_locked_to_its_connection(amqp091: Target, conn: Connection) -> None:
    """Another connection may not consume from an exclusive queue: channel error 405."""
    cch = conn.channel()
    name = Queue("", exclusive=True)(cch).queue_declare()[0]
    other = Connection(amqp091.url)
    other.connect()
    try:
        och = other.channel()
        with pytest.raises(Exception) as err:
            och.basic_consume(name, callback=lambda m: None)
            other.drain_events(timeout=TIMEOUT)
        assert getattr(err.value, "reply_code", None) == 405, err.value
    finally:
        other.release()


def test_rejected_message_is_dead_lettered_with_x_death(conn: Connection) -> None:
    """A queue with x-dead-letter-exchange "" and a routing key sends a rejected message
    to that queue, carrying the x-death header (queue, reason)."""
    dlq = work_queue(uname("kb-dlq"))
    work = work_queue(uname("kb-work"), queue_arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name})
    ch = conn.channel()
    dlq(ch).declare()
    work(ch).declare()
    Producer(ch, exchange=DEFAULT, serializer="json").publish(
        {"bad": "order"}, routing_key=work.name, delivery_mode=2, retry=False)
    got: list[Message] = []
    dead: list[Message] = []
    with Consumer(ch, queues=[work], accept=["json"], callbacks=[lambda b, m: got.append(m)]), \
            Consumer(ch, queues=[dlq], accept=["json"], callbacks=[lambda b, m: dead.append(m)]):
        drain_until(conn, lambda: len(got) == 1)
        got[0].reject(requeue=False)
        drain_until(conn, lambda: len(dead) == 1)
        dead[0].ack()
    assert dead[0].decode() == {"bad": "order"}
    death = dead[0].headers["x-death"][0]
    assert death["queue"] == work.name
    assert death["reason"] == "rejected"
    assert dead[0].delivery_info["routing_key"] == dlq.name
    work(ch).delete()
    dlq(ch).delete()

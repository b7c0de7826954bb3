"""AMQP 0.9.1 deliveries outlive their consumer's ``basic.cancel`` (pika against the
real broker).

As in RabbitMQ and the spec: a delivery made on a channel stays unacknowledged on
that channel after its consumer is cancelled, and can still be acked, nacked or
rejected there until the channel closes; it is not given to another consumer
meanwhile, and comes back (redelivered) only if the channel closes first.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest

pytestmark = pytest.mark.timeout(120)
Connect = Callable[..., pika.BlockingConnection]
TIMEOUT = 10.0


class Inbox:
    """A consumer's deliveries as they arrive (``basic_consume`` callback)."""

    def __init__(self, conn: pika.BlockingConnection, ch: Any, queue: str,
                 tag: str | None = None) -> None:
        self.conn, self.ch = conn, ch
        self.got: list[tuple[Any, Any, bytes]] = []
        self.tag = ch.basic_consume(queue, self._on_message, consumer_tag=tag)

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.got.append((method, props, body))

    def wait(self, n: int) -> list[tuple[Any, Any, bytes]]:
        """Wait (bounded) until ``n`` deliveries arrived."""
        deadline = time.monotonic() + TIMEOUT
        while len(self.got) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"waited for {n} deliveries, got {len(self.got)}"
            self.conn.process_data_events(time_limit=min(left, 0.2))
        return self.got


def setup(pika_conn: Connect) -> tuple[str, Any, Any, Inbox]:
    """A queue holding ``m1``, a consumer that got it, and a second channel."""
    queue = "ac-" + uuid.uuid4().hex[:10]
    conn = pika_conn()
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"m1")
    first = Inbox(conn, ch, queue)
    first.wait(1)
    other_conn = pika_conn()
    other = other_conn.channel()
    other.confirm_delivery()
    return queue, ch, other, first


def next_body(inbox: Inbox, n: int) -> bytes:
    return inbox.wait(n)[n - 1][2]


def test_ack_after_cancel_acknowledges(pika_conn: Connect) -> None:
    """basic.ack of a delivery after its consumer's basic.cancel acknowledges it: it
    is never delivered again."""
    queue, ch, other, first = setup(pika_conn)
    ch.basic_cancel(first.tag)
    ch.basic_ack(first.got[0][0].delivery_tag)
    ch.close()
    second = Inbox(other.connection, other, queue)
    other.basic_publish("", queue, b"marker")
    assert next_body(second, 1) == b"marker"


def test_unacked_after_cancel_is_held_until_the_channel_closes(pika_conn: Connect) -> None:
    """After basic.cancel the delivery is not given to another consumer while the
    channel holds it; closing the channel brings it back, redelivered."""
    queue, ch, other, first = setup(pika_conn)
    ch.basic_cancel(first.tag)
    second = Inbox(other.connection, other, queue)
    other.basic_publish("", queue, b"marker")
    assert next_body(second, 1) == b"marker"
    ch.close()
    method, _props, body = second.wait(2)[1]
    assert body == b"m1" and method.redelivered is True


def test_nack_requeue_after_cancel_gives_it_to_another(pika_conn: Connect) -> None:
    """basic.nack with requeue after basic.cancel: the message goes to another
    consumer at once (the first channel stays open)."""
    queue, ch, other, first = setup(pika_conn)
    ch.basic_cancel(first.tag)
    second = Inbox(other.connection, other, queue)
    other.basic_publish("", queue, b"marker")
    assert next_body(second, 1) == b"marker"
    ch.basic_nack(first.got[0][0].delivery_tag, requeue=True)
    assert next_body(second, 2) == b"m1"


def test_reject_after_cancel_drops_it(pika_conn: Connect) -> None:
    """basic.reject without requeue after basic.cancel drops the message (no
    dead-letter route here): closing the channel does not bring it back."""
    queue, ch, other, first = setup(pika_conn)
    ch.basic_cancel(first.tag)
    ch.basic_reject(first.got[0][0].delivery_tag, requeue=False)
    ch.close()
    second = Inbox(other.connection, other, queue)
    other.basic_publish("", queue, b"marker")
    assert next_body(second, 1) == b"marker"


def _one_delivered(pika_conn: Connect, tag: str | None = None, tx: bool = False
                   ) -> tuple[str, Any, Any, Inbox]:
    """A queue holding ``m1`` and a consumer (``tag``; on a tx channel) that got it."""
    queue = "ac-" + uuid.uuid4().hex[:10]
    conn = pika_conn()
    pub = conn.channel()
    pub.queue_declare(queue, durable=True)
    pub.confirm_delivery()
    pub.basic_publish("", queue, b"m1")
    ch = conn.channel()
    if tx:
        ch.tx_select()
    first = Inbox(conn, ch, queue, tag)
    first.wait(1)
    return queue, conn, ch, first


def _redelivered_elsewhere(pika_conn: Connect, queue: str) -> tuple[Any, bytes]:
    """What a consumer on a new connection gets first from ``queue``."""
    other_conn = pika_conn()
    third = Inbox(other_conn, other_conn.channel(), queue)
    method, _props, body = third.wait(1)[0]
    return method, body


def test_a_tag_reused_after_cancel_keeps_its_new_consumer(pika_conn: Connect) -> None:
    """A consumer tag reused after basic.cancel names a new consumer that the old
    one's last ack does not end: it gets the next message."""
    queue, conn, ch, first = _one_delivered(pika_conn, "t1")
    ch.basic_cancel("t1")
    second = Inbox(conn, ch, queue, "t1")
    ch.basic_ack(first.got[0][0].delivery_tag)
    ch.basic_publish("", queue, b"m2")
    assert next_body(second, 1) == b"m2"


def test_a_tag_reused_after_cancel_then_close_gives_back_the_old_delivery(
        pika_conn: Connect) -> None:
    """The cancelled consumer's unacknowledged delivery comes back (redelivered)
    when its channel closes, though a new consumer reused its tag."""
    queue, conn, ch, _first = _one_delivered(pika_conn, "t1")
    ch.basic_cancel("t1")
    Inbox(conn, ch, queue, "t1")
    ch.close()
    method, body = _redelivered_elsewhere(pika_conn, queue)
    assert body == b"m1" and method.redelivered is True


def test_an_ack_in_an_open_tx_after_cancel_then_close_gives_it_back(
        pika_conn: Connect) -> None:
    """An ack of a cancelled consumer's delivery held by an open transaction is
    rolled back when the channel closes: the message comes back, redelivered."""
    queue, _conn, ch, first = _one_delivered(pika_conn, tx=True)
    ch.basic_cancel(first.tag)
    ch.basic_ack(first.got[0][0].delivery_tag)
    ch.close()
    method, body = _redelivered_elsewhere(pika_conn, queue)
    assert body == b"m1" and method.redelivered is True

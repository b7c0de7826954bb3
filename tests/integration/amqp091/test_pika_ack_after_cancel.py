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

    def __init__(self, conn: pika.BlockingConnection, ch: Any, queue: str) -> None:
        self.conn, self.ch = conn, ch
        self.got: list[tuple[Any, Any, bytes]] = []
        self.tag = ch.basic_consume(queue, self._on_message)

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

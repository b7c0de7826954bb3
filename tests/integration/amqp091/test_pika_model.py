"""AMQP 0.9.1 exchanges, bindings, basic.get and queue deletion with pika against
the real broker (the model is core.exchanges; these check the adapter's side)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

Connect = Callable[..., pika.BlockingConnection]


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_fanout_exchange_reaches_every_bound_queue(pika_conn: Connect) -> None:
    """A message published to a fanout exchange is in each queue bound to it."""
    ch = pika_conn().channel()
    exchange = name("fan")
    ch.exchange_declare(exchange, "fanout")
    queues = [ch.queue_declare(name("q")).method.queue for _ in range(3)]
    for q in queues:
        ch.queue_bind(q, exchange)
    ch.confirm_delivery()
    ch.basic_publish(exchange, "", b"to-all")
    for q in queues:
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"to-all"


def test_basic_get_empty_then_ok_with_counts(pika_conn: Connect) -> None:
    """basic.get: get-empty on an empty queue, get-ok with the count left, a rejected
    message again (redelivered)."""
    ch = pika_conn().channel()
    q = ch.queue_declare(name("get")).method.queue
    assert ch.basic_get(q) == (None, None, None)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"one")
    ch.basic_publish("", q, b"two")
    method, _, body = ch.basic_get(q)
    assert body == b"one" and method.message_count == 1
    ch.basic_ack(method.delivery_tag)
    method, _, body = ch.basic_get(q)
    assert body == b"two" and method.message_count == 0
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"two" and method.redelivered
    assert ch.basic_get(q) == (None, None, None)


def test_topic_exchange_binding_keys(pika_conn: Connect) -> None:
    """A declared topic exchange routes by binding key with * and #."""
    ch = pika_conn().channel()
    exchange = name("top")
    ch.exchange_declare(exchange, "topic")
    q = ch.queue_declare(name("q")).method.queue
    ch.queue_bind(q, exchange, "plant.*.temp")
    ch.confirm_delivery()
    ch.basic_publish(exchange, "plant.line1.temp", b"hit")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(exchange, "plant.line1.pressure", b"miss", mandatory=True)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hit"
    assert (method.exchange, method.routing_key) == (exchange, "plant.line1.temp")


def test_redeclare_with_other_properties_is_406(pika_conn: Connect) -> None:
    """Declaring a queue again with another durable flag closes the channel with 406."""
    conn = pika_conn()
    ch = conn.channel()
    q = name("q")
    ch.queue_declare(q, durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, durable=False)
    assert info.value.reply_code == 406


def test_a_stream_declared_with_x_overflow_is_406(pika_conn: Connect) -> None:
    """x-overflow on a stream queue closes the channel with 406 naming the argument
    (as RabbitMQ); the same stream without it is declared."""
    conn = pika_conn()
    ch = conn.channel()
    q = name("s")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, durable=True, arguments={
            "x-queue-type": "stream", "x-max-length": 2, "x-overflow": "reject-publish"})
    assert info.value.reply_code == 406 and "x-overflow" in info.value.reply_text
    ch = conn.channel()
    assert ch.queue_declare(q, durable=True, arguments={
        "x-queue-type": "stream", "x-max-length": 2}).method.queue == q


def test_exclusive_queue_of_another_connection_is_405(pika_conn: Connect) -> None:
    """Another connection may not use an exclusive queue: 405 RESOURCE_LOCKED."""
    q = pika_conn().channel().queue_declare(name("ex"), exclusive=True).method.queue
    other = pika_conn().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_consume(q, lambda *a: None)
    assert info.value.reply_code == 405


def test_queue_delete_cancels_its_consumers(pika_conn: Connect) -> None:
    """Deleting a queue ends its consumers with basic.cancel (consumer_cancel_notify)."""
    conn = pika_conn()
    ch = conn.channel()
    q = ch.queue_declare(name("del")).method.queue
    cancelled: list[object] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    other.queue_delete(q)
    rounds = 50
    while not cancelled and rounds:
        conn.process_data_events(time_limit=0.2)
        rounds -= 1
    assert cancelled


def test_purge_counts_messages(pika_conn: Connect) -> None:
    """queue.purge answers how many ready messages it removed."""
    ch = pika_conn().channel()
    q = ch.queue_declare(name("purge")).method.queue
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", q, b"x")
    assert ch.queue_purge(q).method.message_count == 3
    assert ch.basic_get(q) == (None, None, None)


def test_exclusive_consumer_keeps_others_out(pika_conn: Connect) -> None:
    """An exclusive consumer refuses other consumers (403), and is refused on a queue
    that has one; once it is cancelled, others may consume."""
    conn = pika_conn()
    ch = conn.channel()
    q = ch.queue_declare(name("exc")).method.queue
    tag = ch.basic_consume(q, lambda *a: None, exclusive=True)
    other = pika_conn().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_consume(q, lambda *a: None)
    assert info.value.reply_code == 403
    ch.basic_cancel(tag)
    third = pika_conn().channel()
    third.basic_consume(q, lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().basic_consume(q, lambda *a: None, exclusive=True)
    assert info.value.reply_code == 403


def test_a_rejected_message_is_dead_lettered_with_x_death(pika_conn: Connect) -> None:
    """basic.reject without requeue on a queue with x-dead-letter-exchange sends the
    message on, with RabbitMQ's x-death header (queue, reason, exchange, keys)."""
    ch = pika_conn().channel()
    dlq = ch.queue_declare(name("dlq")).method.queue
    work = ch.queue_declare(name("work"), arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", work, b"bad order", pika.BasicProperties(
        headers={"n": 1}, message_id="m-9"))
    method, _, _ = ch.basic_get(work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    rounds = 50
    dead = (None, None, None)
    while dead[0] is None and rounds:
        dead = ch.basic_get(dlq, auto_ack=True)
        rounds -= 1
    got, props, body = dead
    assert body == b"bad order" and props.message_id == "m-9"
    [death] = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (work, "rejected", 1)
    assert (death["exchange"], death["routing-keys"]) == ("", [work])
    assert got.routing_key == dlq and props.headers["n"] == 1


def test_a_queue_deleted_from_the_console_cancels_its_consumers(tmp_path: Path) -> None:
    """A queue deleted from the console (not by a 0.9.1 client) ends its 0.9.1
    consumers with basic.cancel, as queue.delete does."""
    from console_support import ConsoleHTTP, initial_password, web_broker_process

    data = str(tmp_path / "data")
    proc = web_broker_process(data, listeners=("--mqtt", "--amqp", "--web")).start()
    conn = None
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(data)) == 303
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.ports["AMQP"], connection_attempts=1, socket_timeout=10))
        ch = conn.channel()
        q = ch.queue_declare(name("gone"), durable=True).method.queue
        cancelled: list[object] = []
        ch.add_on_cancel_callback(cancelled.append)
        ch.basic_consume(q, lambda *a: None)
        assert http.post("/queues/delete", name=q).code == 303
        rounds = 50
        while not cancelled and rounds:
            conn.process_data_events(time_limit=0.2)
            rounds -= 1
        assert cancelled
        assert ch.is_open     # (a cancel, not a channel error)
    finally:
        if conn is not None and conn.is_open:
            conn.close()
        proc.stop()

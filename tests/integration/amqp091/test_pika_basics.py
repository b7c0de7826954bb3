"""AMQP 0.9.1 with pika's BlockingConnection against the real broker: the shared
port, the handshake, declare, publish with confirms, consume, acknowledgements."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

import pika
import pytest
from brokerproc import BrokerProcess

Connect = Callable[..., pika.BlockingConnection]


def qname() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def take(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int,
         timeout: float = 10.0) -> list[tuple[object, pika.BasicProperties, bytes]]:
    """Consume ``n`` messages from ``queue`` (waits on them, ``timeout`` each)."""
    got: list[tuple[object, pika.BasicProperties, bytes]] = []
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((method, props, body))
        if len(got) == n:
            break
    return got


def test_publish_with_confirms_then_consume(pika_conn: Connect) -> None:
    """A confirmed publish to a declared queue reaches a consumer with its properties."""
    ch = pika_conn().channel()
    queue = ch.queue_declare(qname(), durable=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"hello", pika.BasicProperties(
        delivery_mode=2, content_type="text/plain", correlation_id="c-1", reply_to="r",
        headers={"k": "v"}))
    [(method, props, body)] = take(ch, queue, 1)
    assert body == b"hello"
    assert props.content_type == "text/plain"
    assert props.correlation_id == "c-1"
    assert props.reply_to == "r"
    assert props.headers == {"k": "v"}
    assert method.redelivered is False
    ch.basic_ack(method.delivery_tag)


def test_server_properties_and_capabilities(pika_conn: Connect) -> None:
    """connection.start names this broker and announces the capabilities clients need."""
    conn = pika_conn()
    props = conn._impl.server_properties
    assert props["product"] == b"mqttamqp" or props["product"] == "mqttamqp"
    caps = props["capabilities"]
    for name in ("publisher_confirms", "basic.nack", "consumer_cancel_notify",
                 "exchange_exchange_bindings", "connection.blocked", "per_consumer_qos",
                 "authentication_failure_close"):
        assert caps[name] is True


def test_server_named_queue(pika_conn: Connect) -> None:
    """queue.declare with no name gets a server-made amq.gen- name."""
    ch = pika_conn().channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")


def test_prefetch_holds_further_deliveries(pika_conn: Connect) -> None:
    """With prefetch 2 a consumer holds at most 2 unacked; an ack lets the next come."""
    conn = pika_conn()
    ch = conn.channel()
    queue = ch.queue_declare(qname()).method.queue
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", queue, b"%d" % i)
    ch.basic_qos(prefetch_count=2)
    got: list[tuple[int, bytes]] = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append((m.delivery_tag, b)))
    conn.process_data_events(time_limit=1.0)
    deadline = 50
    while len(got) < 2 and deadline:
        conn.process_data_events(time_limit=0.2)
        deadline -= 1
    conn.process_data_events(time_limit=0.5)
    assert [b for _, b in got] == [b"0", b"1"]
    ch.basic_ack(got[1][0], multiple=True)
    deadline = 50
    while len(got) < 4 and deadline:
        conn.process_data_events(time_limit=0.2)
        deadline -= 1
    assert [b for _, b in got] == [b"0", b"1", b"2", b"3"]


def test_nack_requeue_redelivers_with_count(pika_conn: Connect) -> None:
    """basic.nack with requeue redelivers, marked redelivered with x-delivery-count."""
    ch = pika_conn().channel()
    queue = ch.queue_declare(qname()).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"again")
    [(first, _, _)] = take(ch, queue, 1)
    ch.basic_nack(first.delivery_tag, requeue=True)
    [(second, props, body)] = take(ch, queue, 1)
    assert body == b"again"
    assert second.redelivered is True
    assert (props.headers or {}).get("x-delivery-count") == 1
    ch.basic_ack(second.delivery_tag)


def test_reject_without_requeue_drops(pika_conn: Connect) -> None:
    """basic.reject without requeue does not redeliver the message."""
    conn = pika_conn()
    ch = conn.channel()
    queue = ch.queue_declare(qname()).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"a")
    ch.basic_publish("", queue, b"b")
    [(m1, _, b1)] = take(ch, queue, 1)
    assert b1 == b"a"
    ch.basic_reject(m1.delivery_tag, requeue=False)
    [(m2, _, b2)] = take(ch, queue, 1)
    assert b2 == b"b"
    ch.basic_ack(m2.delivery_tag)
    ch.cancel()
    assert take(ch, queue, 1, timeout=0.5) == []


def test_mandatory_unroutable_is_returned(pika_conn: Connect) -> None:
    """A mandatory publish to a queue nobody declared comes back (basic.return)."""
    ch = pika_conn().channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nobody-" + uuid.uuid4().hex, b"x", mandatory=True)


def test_passive_declare_of_missing_queue_is_404(pika_conn: Connect) -> None:
    """A passive declare of a queue that does not exist closes the channel with 404."""
    ch = pika_conn().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("missing-" + uuid.uuid4().hex, passive=True)
    assert info.value.reply_code == 404


def test_user_id_must_be_the_user(pika_conn: Connect) -> None:
    """A publish whose user-id is not the authenticated user closes the channel (406)."""
    conn = pika_conn()
    ch = conn.channel()
    queue = ch.queue_declare(qname()).method.queue
    ch.basic_publish("", queue, b"x", pika.BasicProperties(user_id="someone-else"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(queue, passive=True)
    assert info.value.reply_code == 406


def test_other_vhost_is_530(pika_conn: Connect) -> None:
    """A virtual host other than / is refused with 530."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika_conn(virtual_host="other")
    assert "(530) 'NOT_ALLOWED" in str(info.value)


def test_unknown_header_gets_the_091_header(broker091: BrokerProcess) -> None:
    """A protocol header that is not AMQP's is answered with AMQP 0.9.1's and closed."""
    with socket.create_connection(("127.0.0.1", broker091.ports["AMQP"]), timeout=10) as s:
        s.sendall(b"HTTP/1.1")
        data = b""
        while True:
            chunk = s.recv(64)
            if not chunk:
                break
            data += chunk
    assert data == b"AMQP\x00\x00\x09\x01"


def test_heartbeats_keep_an_idle_connection(pika_conn: Connect) -> None:
    """With a 1 s heartbeat an idle connection stays open across several intervals."""
    conn = pika_conn(heartbeat=1)
    got: list[int] = []
    conn.call_later(3.5, lambda: got.append(1))
    while not got:
        conn.process_data_events(time_limit=0.5)
    assert conn.is_open
    ch = conn.channel()
    assert ch.is_open


def test_every_property_is_kept_between_091_peers(pika_conn: Connect) -> None:
    """Properties without an MQTT form (priority, message-id, timestamp, type, app-id,
    content-encoding, non-string headers) reach a 0.9.1 consumer as sent."""
    ch = pika_conn().channel()
    queue = ch.queue_declare(qname(), durable=True).method.queue
    ch.confirm_delivery()
    sent = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", priority=3,
        message_id="m-1", timestamp=1700000000, type="task", app_id="app",
        user_id="guest", delivery_mode=2,
        headers={"retries": 2, "timelimit": [None, 30], "nested": {"a": True}})
    ch.basic_publish("", queue, b"{}", sent)
    [(method, props, _)] = take(ch, queue, 1)
    for name in ("content_type", "content_encoding", "priority", "message_id",
                 "timestamp", "type", "app_id", "user_id", "delivery_mode"):
        assert getattr(props, name) == getattr(sent, name), name
    assert props.headers == {"retries": 2, "timelimit": [None, 30], "nested": {"a": True}}
    ch.basic_nack(method.delivery_tag, requeue=True)
    [(again, props2, _)] = take(ch, queue, 1)
    assert again.redelivered and props2.message_id == "m-1"
    assert props2.headers["x-delivery-count"] == 1 and props2.headers["retries"] == 2
    ch.basic_ack(again.delivery_tag)


def test_prefetch_zero_is_unlimited(pika_conn: Connect) -> None:
    """Without basic.qos (prefetch 0, unlimited as in RabbitMQ) a consumer of a durable
    queue gets all 100 ready messages unacknowledged, not the broker's --queue-prefetch
    (16); acknowledged at the end with one multiple ack."""
    ch = pika_conn().channel()
    queue = ch.queue_declare(qname(), durable=True).method.queue
    ch.confirm_delivery()
    for i in range(100):
        ch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    got = take(ch, queue, 100)
    assert len(got) == 100 and got[-1][2] == b"99"
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)   # type: ignore[attr-defined]
    ch.cancel()

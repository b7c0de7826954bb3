"""Publisher confirms keep the durability promise over ``kill -9`` (mqttamqp only).

A pika publisher in confirm mode streams persistent messages through a durable direct
exchange to a durable queue; the broker process is killed with SIGKILL while it does,
and restarted on the same data directory.  Every message the publisher had a
``basic.ack`` for is in the queue afterwards, the exchange and its binding still route
(a marker published through them after the restart arrives last), and nothing arrives
that was never published.  The same promise as MQTT's PUBACK (docs/durability.md).
"""

from __future__ import annotations

import os
import threading

import pika
import pytest
from amqp091_target import ENV_URL, NOT_YET, TIMEOUT, amqp_url, speaks_amqp091, start_broker, uname
from pika.adapters.blocking_connection import BlockingChannel

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(bool(os.environ.get(ENV_URL)), reason="kills mqttamqp's own process"),
    pytest.mark.skipif(not speaks_amqp091(), reason=NOT_YET),
]

N = 2000
KILL_AFTER = 300           # confirmed messages before the kill


class ConfirmingPublisher(threading.Thread):
    """Publishes ``N`` persistent messages one confirm at a time until the connection
    dies; ``confirmed`` holds the bodies the broker acknowledged."""

    def __init__(self, url: str, exchange: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.exchange, self.key = url, exchange, key
        self.confirmed: list[bytes] = []
        self.enough = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(N):
                body = b"m%05d" % i
                ch.basic_publish(self.exchange, self.key, body,
                                 pika.BasicProperties(delivery_mode=2), mandatory=True)
                self.confirmed.append(body)
                if len(self.confirmed) >= KILL_AFTER:
                    self.enough.set()
        except BaseException as e:        # the kill: StreamLostError and the like
            self.error = e
        finally:
            self.enough.set()


def drain(ch: BlockingChannel, queue: str, marker: bytes) -> list[bytes]:
    """Every body on ``queue`` up to and including ``marker`` (acknowledged)."""
    got: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=TIMEOUT):
        assert method is not None, f"no {marker!r} within {TIMEOUT}s after {len(got)} messages"
        ch.basic_ack(method.delivery_tag)
        got.append(body)
        if body == marker:
            ch.cancel()
            return got
    raise AssertionError("consumer cancelled")


def test_confirmed_messages_survive_kill_9(tmp_path: os.PathLike[str]) -> None:
    """Nothing confirmed is lost after kill -9; the durable exchange and binding still route."""
    data = os.path.join(str(tmp_path), "data")
    queue, exchange = uname("dur-q"), uname("dur-x")
    broker = start_broker(data, restartable=True)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct", durable=True)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, "k")
        conn.close()

        publisher = ConfirmingPublisher(amqp_url(broker), exchange, "k")
        publisher.start()
        assert publisher.enough.wait(120), "publisher made no progress"
        broker.kill()
        publisher.join(TIMEOUT)
        assert not publisher.is_alive()
        confirmed = list(publisher.confirmed)
        assert len(confirmed) < N, "the kill came after the last publish: nothing was at risk"

        broker = start_broker(data, restartable=True)
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        ch.confirm_delivery()
        count = ch.queue_declare(queue, durable=True, passive=True).method.message_count
        ch.basic_publish(exchange, "k", b"end", pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
        got = drain(ch, queue, b"end")
        conn.close()
    finally:
        broker.stop()
    lost = sorted(set(confirmed) - set(got))
    assert lost == [], f"{len(lost)} of {len(confirmed)} confirmed messages lost: {lost[:10]}"
    assert count >= len(confirmed), "passive queue.declare's message count after the restart"
    published = {b"m%05d" % i for i in range(N)} | {b"end"}
    assert set(got) <= published
    assert got[-1] == b"end"


def test_durable_exchanges_and_bindings_survive_kill_9(tmp_path: os.PathLike[str]) -> None:
    """A durable exchange (with its type and an exchange-to-exchange binding) and a
    durable queue binding are back after kill -9, a transient exchange is not, and
    the one confirmed message routed through the binding just before the kill is
    in the queue after the restart."""
    data = os.path.join(str(tmp_path), "data")
    queue, exchange = uname("kept-q"), uname("kept-x")
    front, transient = uname("kept-front"), uname("gone-x")
    broker = start_broker(data, restartable=True)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True)
        ch.exchange_declare(front, "fanout", durable=True)
        ch.exchange_declare(transient, "direct", durable=False)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, "orders.*")
        ch.exchange_bind(exchange, front, "")
        ch.confirm_delivery()
        ch.basic_publish(exchange, "orders.new", b"before the kill",
                         pika.BasicProperties(delivery_mode=2), mandatory=True)
        broker.kill()   # (right after the confirm: no clean shutdown runs)

        broker = start_broker(data, restartable=True)
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url(broker)))
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True, passive=True)
        ch.exchange_declare(front, "fanout", durable=True, passive=True)
        method, _, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"before the kill"
        ch.confirm_delivery()
        # through the binding, and through the exchange-to-exchange binding
        ch.basic_publish(exchange, "orders.paid", b"after", mandatory=True)
        ch.basic_publish(front, "orders.front", b"via front", mandatory=True)
        got = []
        for _ in range(2):
            method, _, body = ch.basic_get(queue, auto_ack=True)
            assert method is not None, f"only {got} routed after the restart"
            got.append(body)
        assert got == [b"after", b"via front"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.exchange_declare(exchange, "direct", durable=True)   # (its type was kept)
        assert refused.value.reply_code == 406
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.exchange_declare(transient, "direct", passive=True)
        assert missing.value.reply_code == 404
        conn.close()
    finally:
        broker.stop()

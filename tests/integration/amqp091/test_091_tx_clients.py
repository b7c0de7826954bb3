"""The ``tx`` class from the other Python clients (issue 30): aio-pika's
``channel.transaction()`` and py-amqp's ``tx_select``/``tx_commit``/``tx_rollback``
(kombu's transport; kombu and Celery themselves never select tx); and a pika
transaction's publishes through ``amq.topic`` reaching MQTT subscribers at commit.  Each test ran
against RabbitMQ 3.10 first (tests/support/amqp091_target.py); every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlsplit

import aio_pika
import amqp
import pika
import pytest
from amqp091_target import TIMEOUT, Target, target, uname
from pahoclient import PahoClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


def test_aio_pika_transaction_commit_and_rollback(amqp091: Target) -> None:
    """aio-pika: publishes in a transaction are queued at commit; a rolled back
    transaction's are not."""
    name = uname("ap-tx")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            ch = await conn.channel(publisher_confirms=False)
            q = await ch.declare_queue(name, durable=True)
            tx = ch.transaction()
            await asyncio.wait_for(tx.select(), TIMEOUT)
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(b"c%d" % i),
                                                  routing_key=name)
            await ch.default_exchange.publish(aio_pika.Message(b"dropped"),
                                              routing_key=name)
            await asyncio.wait_for(tx.rollback(), TIMEOUT)
            declared = await asyncio.wait_for(q.declare(), TIMEOUT)
            assert declared.message_count == 0
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(b"c%d" % i),
                                                  routing_key=name)
            await asyncio.wait_for(tx.commit(), TIMEOUT)
            got = []
            for _ in range(3):
                msg = await asyncio.wait_for(q.get(no_ack=True, fail=False), TIMEOUT)
                assert msg is not None, f"only {got} after the commit"
                got.append(msg.body)
            assert got == [b"c0", b"c1", b"c2"]
            await q.delete(if_unused=False, if_empty=False)

    asyncio.run(scenario())


def test_py_amqp_tx_acks_and_publishes(amqp091: Target) -> None:
    """py-amqp: an ack and a publish in one transaction; rolled back, the message is
    still this channel's; committed, it is gone and the publish is queued."""
    url = urlsplit(amqp091.url)
    source, sink = uname("pa-tx-in"), uname("pa-tx-out")
    conn = amqp.Connection(f"{url.hostname}:{url.port}", userid="guest", password="guest",
                           connect_timeout=TIMEOUT, read_timeout=TIMEOUT)
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(source, auto_delete=False)
        ch.queue_declare(sink, auto_delete=False)
        ch.basic_publish(amqp.Message(b"job"), routing_key=source)
        ch.tx_select()
        ch.tx_commit()      # (the publish above was before select: already queued)
        msg = ch.basic_get(source, no_ack=False)
        assert msg is not None and msg.body == b"job"
        ch.basic_publish(amqp.Message(b"result"), routing_key=sink)
        ch.basic_ack(msg.delivery_tag)
        ch.tx_rollback()
        _, ready_out, _ = ch.queue_declare(sink, passive=True)
        _, ready_in, _ = ch.queue_declare(source, passive=True)
        assert (ready_out, ready_in) == (0, 0)   # (job: still unacked on this channel)
        ch.basic_publish(amqp.Message(b"result"), routing_key=sink)
        ch.basic_ack(msg.delivery_tag)
        ch.tx_commit()
        ch.close()
        ch = conn.channel()
        out = ch.basic_get(sink, no_ack=True)
        assert out is not None and out.body == b"result"
        assert ch.basic_get(source, no_ack=True) is None
        ch.queue_delete(source)
        ch.queue_delete(sink)
    finally:
        conn.close()


def test_tx_publishes_reach_mqtt_subscribers_at_commit(amqp091: Target) -> None:
    """Publishes to amq.topic in a transaction reach an MQTT subscriber at commit:
    a marker published outside the transaction afterwards arrives first."""
    amqp091.require("mqtt")
    assert amqp091.mqtt_port is not None
    level = uname("txm")
    sub = PahoClient(amqp091.mqtt_port, uname("txsub")[:23])
    conn = pika.BlockingConnection(pika.URLParameters(amqp091.url))
    try:
        assert sub.subscribe((f"{level}/#", 1)) == [1]
        tx, plain = conn.channel(), conn.channel()
        tx.tx_select()
        tx.basic_publish("amq.topic", f"{level}.held", b"in-tx",
                         pika.BasicProperties(delivery_mode=2))
        tx.queue_declare(uname("txm-sync"), exclusive=True)   # (the publish arrived)
        plain.confirm_delivery()
        plain.basic_publish("amq.topic", f"{level}.marker", b"marker")
        first = sub.get()
        assert (first.topic, first.payload) == (f"{level}/marker", b"marker")
        tx.tx_commit()
        second = sub.get()
        assert (second.topic, second.payload, second.qos) == (f"{level}/held", b"in-tx", 1)
    finally:
        sub.stop()
        if conn.is_open:
            conn.close()

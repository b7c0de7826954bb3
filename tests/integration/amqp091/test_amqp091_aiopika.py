"""aio-pika (asyncio, over aiormq and pamqp) against the broker's AMQP 0.9.1.

Connect, declare, publish with publisher confirms, consume, ack, nack with and without
requeue, and a mandatory publish that no queue takes coming back as basic.return.
Each test runs its own event loop (``asyncio.run``) with every wait bounded by
``asyncio.wait_for``.  Validated against RabbitMQ 3.10 first
(tests/support/amqp091_target.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import ConfirmationFrameType
from amqp091_target import TIMEOUT, Target, target, uname
from pamqp.commands import Basic

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


async def next_message(it: aio_pika.abc.AbstractQueueIterator) -> AbstractIncomingMessage:
    return await asyncio.wait_for(it.__anext__(), TIMEOUT)


def test_publish_with_confirms_consume_and_ack(amqp091: Target) -> None:
    """Ten persistent messages confirmed (Basic.Ack) into a durable queue, consumed in
    order with their properties and acknowledged; the queue is empty afterwards."""
    name = uname("ap-basic")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.set_qos(prefetch_count=10)
            q = await ch.declare_queue(name, durable=True)
            for i in range(10):
                confirm: ConfirmationFrameType | None = await asyncio.wait_for(
                    ch.default_exchange.publish(
                        aio_pika.Message(f"m{i}".encode(), content_type="text/plain",
                                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                         headers={"seq": i}, message_id=f"id-{i}"),
                        routing_key=name), TIMEOUT)
                assert isinstance(confirm, Basic.Ack), confirm
            got = []
            async with q.iterator() as it:
                for _ in range(10):
                    msg = await next_message(it)
                    got.append(msg)
                    await msg.ack()
            assert [(m.body, m.content_type, m.delivery_mode, m.redelivered) for m in got] == [
                (f"m{i}".encode(), "text/plain", aio_pika.DeliveryMode.PERSISTENT, False)
                for i in range(10)]
            again = await ch.declare_queue(name, durable=True, passive=True)
            assert again.declaration_result.message_count == 0
            await q.delete()
            assert [(m.headers.get("seq"), m.message_id) for m in got] == [
                (i, f"id-{i}") for i in range(10)]

    asyncio.run(scenario())


def test_nack_requeue_redelivers_and_nack_drop_discards(amqp091: Target) -> None:
    """nack(requeue=True) brings the message back redelivered; nack(requeue=False)
    discards it, so the marker published after it is the next delivery."""
    name = uname("ap-nack")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.set_qos(prefetch_count=1)
            q = await ch.declare_queue(name, durable=True)
            await ch.default_exchange.publish(aio_pika.Message(b"job"), routing_key=name)
            async with q.iterator() as it:
                first = await next_message(it)
                assert (first.body, first.redelivered) == (b"job", False)
                await first.nack(requeue=True)
                second = await next_message(it)
                assert (second.body, second.redelivered) == (b"job", True)
                await second.nack(requeue=False)
                await ch.default_exchange.publish(aio_pika.Message(b"marker"), routing_key=name)
                third = await next_message(it)
                assert third.body == b"marker"
                await third.ack()
            await q.delete()

    asyncio.run(scenario())


def test_mandatory_unroutable_publish_is_returned(amqp091: Target) -> None:
    """A mandatory publish to a routing key no queue has comes back as basic.return
    (312 NO_ROUTE), and the confirm still arrives."""
    key = uname("ap-nowhere")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=False)
            returned: asyncio.Future[AbstractIncomingMessage] = (
                asyncio.get_running_loop().create_future())
            ch.return_callbacks.add(
                lambda _ch, msg: returned.done() or returned.set_result(msg))
            await ch.default_exchange.publish(aio_pika.Message(b"lost?"), routing_key=key,
                                              mandatory=True)
            back = await asyncio.wait_for(returned, TIMEOUT)
            assert back.body == b"lost?"
            assert back.routing_key == key

    asyncio.run(scenario())


def test_delete_if_empty_leaves_out_unacknowledged_deliveries(amqp091: Target) -> None:
    """queue.delete with if-empty (aio-pika's default) counts ready messages only, as
    RabbitMQ's backing queue does (its len, not its depth): a queue whose messages a
    consumer holds unacknowledged is deleted (delete-ok says 0); one with a ready
    message more is not (406 "not empty", which RabbitMQ checks before if-unused's
    "in use": aio-pika's delete asks both by default)."""
    name = uname("ap-ifempty")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            pub = await conn.channel(publisher_confirms=True)
            q = await pub.declare_queue(name, durable=True)
            for i in range(3):
                await pub.default_exchange.publish(aio_pika.Message(b"%d" % i),
                                                   routing_key=name)
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=2)
            mine = await ch.get_queue(name, ensure=False)
            held: list[AbstractIncomingMessage] = []
            two = asyncio.Event()

            async def on_message(msg: AbstractIncomingMessage) -> None:
                held.append(msg)
                if len(held) == 2:
                    two.set()

            await mine.consume(on_message)
            await asyncio.wait_for(two.wait(), TIMEOUT)
            other = await conn.channel()
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed,
                               match="not empty"):
                await (await other.get_queue(name, ensure=False)).delete(if_empty=True)
            third = await pub.get_queue(name, ensure=False)
            assert (await third.get(no_ack=True, timeout=TIMEOUT)).body == b"2"
            result = await q.delete(if_unused=False, if_empty=True)
            assert result.message_count == 0, result

    asyncio.run(scenario())


def test_consumers_on_two_channels_share_a_queue(amqp091: Target) -> None:
    """Two consumers of one queue on two channels (prefetch 1 each) compete: every
    message goes to exactly one of them."""
    name = uname("ap-compete")

    async def scenario() -> None:
        conn = await asyncio.wait_for(aio_pika.connect(amqp091.url), TIMEOUT)
        async with conn:
            pub = await conn.channel(publisher_confirms=True)
            q = await pub.declare_queue(name, durable=True)
            seen: dict[str, list[bytes]] = {"a": [], "b": []}
            all_in = asyncio.Event()

            async def consume(tag: str) -> None:
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=1)
                mine = await ch.get_queue(name, ensure=False)

                async def on_message(msg: AbstractIncomingMessage) -> None:
                    seen[tag].append(msg.body)
                    await msg.ack()
                    if len(seen["a"]) + len(seen["b"]) == 20:
                        all_in.set()

                await mine.consume(on_message)

            await consume("a")
            await consume("b")
            for i in range(20):
                await pub.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=name)
            await asyncio.wait_for(all_in.wait(), TIMEOUT)
            assert sorted(seen["a"] + seen["b"], key=int) == [b"%d" % i for i in range(20)]
            assert seen["a"] and seen["b"], seen
            await q.delete(if_unused=False)

    asyncio.run(scenario())

"""AMQP 0.9.1's ``tx`` class with pika (issue 30): ``tx.select``, ``tx.commit``,
``tx.rollback`` over publishes and acknowledgements, the spec's 406s, mandatory
returns at commit, a channel's close rolling back, and the work bound.

Each test ran against RabbitMQ 3.10 first (``MQTTAMQP_TEST_AMQP091_URL``, see
tests/support/amqp091_target.py) to show it is right.  Where mqttamqp differs on
purpose it says so: ``--max-transaction-bytes`` is ours (RabbitMQ holds a
transaction's work without a bound), so that test is mqttamqp's only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pika
import pytest
from amqp091_target import TIMEOUT, Target, target, uname
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

pytestmark = pytest.mark.timeout(120)

MAX_TX_BYTES = 4096
Connect = Callable[[], BlockingConnection]


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request, "--max-transaction-bytes", str(MAX_TX_BYTES)) as t:
        yield t


@pytest.fixture
def connect(amqp091: Target) -> Iterator[Connect]:
    """``connect()`` opens a pika connection to the target, closed after the test."""
    made: list[BlockingConnection] = []

    def open_one() -> BlockingConnection:
        conn = BlockingConnection(pika.URLParameters(amqp091.url))
        made.append(conn)
        return conn

    yield open_one
    for conn in made:
        if conn.is_open:
            try:
                conn.close()
            except Exception:
                pass


def ready(conn: BlockingConnection, queue: str) -> int:
    """Messages ready on ``queue`` (a passive declare on a channel of its own)."""
    ch = conn.channel()
    try:
        return int(ch.queue_declare(queue, passive=True).method.message_count)
    finally:
        ch.close()


def get_all(ch: BlockingChannel, queue: str, limit: int = 100) -> list[bytes]:
    """Every ready message of ``queue``, auto-acknowledged (bounded by ``limit``)."""
    bodies: list[bytes] = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    return bodies


def fill(conn: BlockingConnection, queue: str, *bodies: bytes) -> None:
    """Publish ``bodies`` to ``queue`` with confirms, outside any transaction."""
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body)
    ch.close()


def take(ch: BlockingChannel, queue: str, n: int) -> list[tuple[int, bytes, bool]]:
    """``n`` messages of ``queue`` by ``basic.get`` without auto-ack: (tag, body,
    redelivered)."""
    got = []
    for _ in range(n):
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        assert method is not None, f"only {len(got)} of {n} messages on {queue}"
        got.append((method.delivery_tag, body, bool(method.redelivered)))
    return got


def test_publishes_are_seen_only_after_commit(connect: Connect) -> None:
    """Publishes in tx mode reach the queue at tx.commit, in order, not before."""
    conn, watcher = connect(), connect()
    ch = conn.channel()
    queue = ch.queue_declare(uname("tx-pub")).method.queue
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", queue, b"m%d" % i)
    assert ready(watcher, queue) == 0
    ch.tx_commit()
    assert ready(watcher, queue) == 3
    assert get_all(watcher.channel(), queue) == [b"m0", b"m1", b"m2"]
    # the channel stays transactional: the next publish waits for the next commit
    ch.basic_publish("", queue, b"m3")
    assert ready(watcher, queue) == 0
    ch.tx_commit()
    assert get_all(watcher.channel(), queue) == [b"m3"]


def test_rollback_drops_the_publishes(connect: Connect) -> None:
    """tx.rollback leaves nothing of the publishes since the last commit; later ones commit."""
    conn, watcher = connect(), connect()
    ch = conn.channel()
    queue = ch.queue_declare(uname("tx-rb")).method.queue
    ch.tx_select()
    ch.basic_publish("", queue, b"dropped-1")
    ch.basic_publish("", queue, b"dropped-2")
    ch.tx_rollback()
    ch.tx_commit()      # (nothing left to commit)
    assert ready(watcher, queue) == 0
    ch.basic_publish("", queue, b"kept")
    ch.tx_commit()
    assert get_all(watcher.channel(), queue) == [b"kept"]


def test_rolled_back_acks_leave_the_messages_unacked(connect: Connect) -> None:
    """Acks rolled back are forgotten: the messages stay unacked on the channel,
    can be acked again, and come back (redelivered) when the channel closes."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-ackrb")).method.queue
    fill(watcher, queue, b"a", b"b")
    ch = conn.channel()
    ch.tx_select()
    (tag_a, _, _), (tag_b, _, _) = take(ch, queue, 2)
    ch.basic_ack(tag_b, multiple=True)
    ch.tx_rollback()
    # still held by this channel: not ready for anyone else
    assert ready(watcher, queue) == 0
    # the tags are the channel's again: acking one of them is no error
    ch.basic_ack(tag_a)
    ch.tx_rollback()
    ch.close()
    back = take(watcher.channel(), queue, 2)
    assert [(body, redelivered) for _, body, redelivered in back] == [(b"a", True), (b"b", True)]


def test_committed_acks_are_not_redelivered(connect: Connect) -> None:
    """Acks committed are final: closing the connection gives nothing back; the
    acks of one channel wait for its commit, not a moment earlier (acked, then the
    channel closed before tx.commit: all three come back)."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-ackc")).method.queue
    fill(watcher, queue, b"a", b"b", b"c")
    early = conn.channel()
    early.tx_select()
    got = take(early, queue, 3)
    early.basic_ack(got[1][0], multiple=True)    # a and b, never committed
    early.close()
    assert ready(watcher, queue) == 3            # (nothing of the acks was applied)
    ch = conn.channel()
    ch.tx_select()
    got = take(ch, queue, 3)
    assert [(body, redelivered) for _, body, redelivered in got] == [
        (b"a", True), (b"b", True), (b"c", True)]
    ch.basic_ack(got[1][0], multiple=True)    # a and b
    ch.tx_commit()
    conn.close()
    back = take(watcher.channel(), queue, 1)
    assert [(body, redelivered) for _, body, redelivered in back] == [(b"c", True)]
    assert ready(watcher, queue) == 0


def test_an_ack_twice_in_one_transaction_is_406(connect: Connect) -> None:
    """A delivery tag acked in the open transaction is no longer the channel's: a
    second ack of it is an unknown delivery tag (406), as outside a transaction."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-twice")).method.queue
    fill(watcher, queue, b"a")
    ch = conn.channel()
    ch.tx_select()
    [(tag, _, _)] = take(ch, queue, 1)
    ch.basic_ack(tag)
    ch.basic_ack(tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.tx_commit()
    assert closed.value.reply_code == 406
    # the channel's end rolled the transaction back: the message is back
    back = take(watcher.channel(), queue, 1)
    assert [(body, redelivered) for _, body, redelivered in back] == [(b"a", True)]


def test_publish_and_ack_commit_together(connect: Connect) -> None:
    """A consume-transform-publish step: the ack of the input and the publish of the
    output take effect in one commit, or (rolled back) neither."""
    conn, watcher = connect(), connect()
    wch = watcher.channel()
    source = wch.queue_declare(uname("tx-in")).method.queue
    sink = wch.queue_declare(uname("tx-out")).method.queue
    fill(watcher, source, b"job-1", b"job-2")
    ch = conn.channel()
    ch.tx_select()
    [(tag, body, _)] = take(ch, source, 1)
    ch.basic_publish("", sink, body + b"-done")
    ch.basic_ack(tag)
    ch.tx_rollback()
    assert ready(watcher, sink) == 0
    # job-1 is still this channel's, unacked; do it again and commit
    ch.basic_publish("", sink, body + b"-done")
    ch.basic_ack(tag)
    ch.tx_commit()
    assert get_all(wch, sink) == [b"job-1-done"]
    conn.close()
    # only job-2 is left (job-1's ack was committed)
    back = take(wch, source, 1)
    assert [b for _, b, _ in back] == [b"job-2"]
    assert ready(watcher, source) == 0


def test_nack_with_requeue_applies_at_commit(connect: Connect) -> None:
    """basic.nack (requeue) and basic.reject in tx mode wait for the commit too."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-nack")).method.queue
    fill(watcher, queue, b"a", b"b")
    ch = conn.channel()
    ch.tx_select()
    (tag_a, _, _), (tag_b, _, _) = take(ch, queue, 2)
    ch.basic_nack(tag_a, requeue=True)
    ch.basic_reject(tag_b, requeue=True)
    assert ready(watcher, queue) == 0
    ch.tx_commit()
    assert ready(watcher, queue) == 2
    back = take(watcher.channel(), queue, 2)
    assert sorted(body for _, body, _ in back) == [b"a", b"b"]


def test_commit_and_rollback_without_select_are_406(connect: Connect) -> None:
    """tx.commit and tx.rollback on a channel not in tx mode: 406 PRECONDITION_FAILED."""
    conn = connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as commit:
        conn.channel().tx_commit()
    assert commit.value.reply_code == 406
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as rollback:
        conn.channel().tx_rollback()
    assert rollback.value.reply_code == 406
    assert conn.is_open    # (channel errors, not the connection's)


def test_confirm_and_tx_on_one_channel_are_406(connect: Connect) -> None:
    """confirm.select on a tx channel, and tx.select on a confirm channel: 406."""
    conn = connect()
    ch = conn.channel()
    ch.tx_select()
    ch.tx_select()       # (again: no error)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as confirm:
        ch.confirm_delivery()
    assert confirm.value.reply_code == 406
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as tx:
        ch.tx_select()
    assert tx.value.reply_code == 406


def test_mandatory_return_comes_at_commit(connect: Connect) -> None:
    """An unroutable mandatory publish in tx mode is returned when it is committed
    (before commit-ok), not when it is published; a rolled back one never."""
    conn = connect()
    ch = conn.channel()
    returned: list[tuple[int, bytes]] = []
    ch.add_on_return_callback(
        lambda _ch, method, _props, body: returned.append((method.reply_code, body)))
    ch.tx_select()
    ch.basic_publish("", uname("tx-nowhere"), b"lost-1", mandatory=True)
    ch.queue_declare(uname("tx-sync"), exclusive=True)   # (a round trip: a return would be here)
    conn.process_data_events(time_limit=0)
    assert returned == []
    ch.tx_commit()
    conn.process_data_events(time_limit=0)
    assert returned == [(312, b"lost-1")]
    ch.basic_publish("", uname("tx-nowhere"), b"lost-2", mandatory=True)
    ch.tx_rollback()
    ch.tx_commit()
    conn.process_data_events(time_limit=0)
    assert returned == [(312, b"lost-1")]


def test_channel_close_rolls_back(connect: Connect) -> None:
    """A channel closed (or a connection dropped) with a transaction open: its
    publishes are gone and its acked messages come back."""
    conn, watcher = connect(), connect()
    wch = watcher.channel()
    source = wch.queue_declare(uname("tx-cl-in")).method.queue
    sink = wch.queue_declare(uname("tx-cl-out")).method.queue
    fill(watcher, source, b"a")
    ch = conn.channel()
    ch.tx_select()
    [(tag, _, _)] = take(ch, source, 1)
    ch.basic_publish("", sink, b"never")
    ch.basic_ack(tag)
    ch.close()
    assert ready(watcher, sink) == 0
    back = take(wch, source, 1)
    assert [(b, r) for _, b, r in back] == [(b"a", True)]
    wch.basic_nack(back[0][0], requeue=True)
    # the same with the connection dropped
    ch = conn.channel() if conn.is_open else connect().channel()
    ch.tx_select()
    [(tag, _, _)] = take(ch, source, 1)
    ch.basic_publish("", sink, b"never")
    ch.basic_ack(tag)
    ch.connection.close()
    assert ready(watcher, sink) == 0
    assert ready(watcher, source) == 1


def test_a_consumer_in_tx_mode(connect: Connect) -> None:
    """basic.consume deliveries acked in tx mode are settled by the commit."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-cons")).method.queue
    fill(watcher, queue, b"a", b"b")
    ch = conn.channel()
    ch.tx_select()
    tags = []
    for method, _props, _body in ch.consume(queue, inactivity_timeout=TIMEOUT):
        assert method is not None, "no delivery"
        tags.append(method.delivery_tag)
        if len(tags) == 2:
            break
    ch.basic_ack(tags[-1], multiple=True)
    ch.tx_commit()
    ch.cancel()
    conn.close()
    assert ready(watcher, queue) == 0


def test_an_ack_held_across_basic_cancel_applies_at_commit(connect: Connect) -> None:
    """Acked in a transaction, the consumer then cancelled, then tx.commit: the ack
    applies (gone for good, nothing comes back when the connection closes)."""
    conn, watcher = connect(), connect()
    queue = watcher.channel().queue_declare(uname("tx-cancel")).method.queue
    fill(watcher, queue, b"a")
    ch = conn.channel()
    ch.tx_select()
    for method, _props, _body in ch.consume(queue, inactivity_timeout=TIMEOUT):
        assert method is not None, "no delivery"
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()
    ch.tx_commit()
    conn.close()
    assert ready(watcher, queue) == 0


def test_work_over_max_transaction_bytes_is_a_channel_error(amqp091: Target,
                                                           connect: Connect) -> None:
    """Publishes held in one transaction past --max-transaction-bytes: the channel
    is closed with a clear reason naming the option, the transaction rolled back,
    and the connection stays usable (mqttamqp's bound; RabbitMQ has none)."""
    amqp091.require("mqttamqp")
    conn, watcher = connect(), connect()
    ch = conn.channel()
    queue = ch.queue_declare(uname("tx-big")).method.queue
    ch.tx_select()
    ch.basic_publish("", queue, b"x" * (MAX_TX_BYTES // 2))
    ch.basic_publish("", queue, b"x" * (MAX_TX_BYTES // 2 + 1))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.tx_commit()
    assert closed.value.reply_code == 406
    assert "max-transaction-bytes" in closed.value.reply_text
    assert ready(watcher, queue) == 0
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", queue, b"small")
    ch.tx_commit()
    assert get_all(watcher.channel(), queue) == [b"small"]


def test_a_queue_refusing_at_commit_is_406(connect: Connect) -> None:
    """A queue that would refuse a committed publish (x-overflow reject-publish)
    fails the commit before any of it runs: 406 on the channel, nothing applied
    (where RabbitMQ applies the rest: "partial tx completion")."""
    conn, watcher = connect(), connect()
    ch = conn.channel()
    queue = ch.queue_declare(uname("tx-full"), arguments={
        "x-max-length": 1, "x-overflow": "reject-publish"}).method.queue
    ch.tx_select()
    ch.basic_publish("", queue, b"fits")
    ch.basic_publish("", queue, b"refused")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.tx_commit()
    assert closed.value.reply_code == 406
    assert "reject-publish" in closed.value.reply_text
    assert "nothing of it was applied" in closed.value.reply_text
    assert get_all(watcher.channel(), queue) == []
    assert conn.is_open


def test_the_broker_logged_no_traceback(amqp091: Target) -> None:
    """After the tests above, the broker's log has no traceback or critical line."""
    assert amqp091.bad_log_lines() == []

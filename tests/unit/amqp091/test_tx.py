"""AMQP 0.9.1's ``tx`` class in process (amqp091/transactions.py): a connection on a
fake transport, a ``Clock`` and an in-memory broker whose store answers when told."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core_broker import make_broker
from fakes import NullStore
from pamqp import commands
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, content_frames, method_frame
from mqttamqp.amqp091.handshake import Settings
from mqttamqp.amqp091.inspect import details
from mqttamqp.core.persistence import Op

C, B, Q, T = commands.Connection, commands.Basic, commands.Queue, commands.Tx


class HeldStore(NullStore):
    """A store whose commits wait for ``release`` (``held``: True) and that
    records each submission apart."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False
        self.submissions: list[list[Op]] = []
        self.waiting: list[Deferred[None]] = []

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        self.submissions.append(list(ops))
        if not self.held:
            return super().submit(ops)
        d: Deferred[None] = Deferred()
        self.waiting.append(d)
        return d

    def release(self) -> None:
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)


def frames_of(transport: StringTransport) -> list[Any]:
    data = transport.value()
    transport.clear()
    return [f for _, f in FrameReader(1 << 20).feed(data)]


def names(transport: StringTransport) -> list[str]:
    return [f.name for f in frames_of(transport)]


def opened(store: NullStore | None = None, channels: int = 1, **limits: Any
           ) -> tuple[Any, StringTransport, Any]:
    broker, clock, _ = make_broker(store, **limits)
    factory = AMQP091Factory(broker, clock, Settings())
    conn = factory.buildProtocol(None)
    transport = StringTransport()
    conn.makeConnection(transport)
    conn.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + b"".join(method_frame(n, commands.Channel.Open()) for n in range(1, channels + 1))
        + method_frame(1, Q.Declare(queue="q", durable=True))
        + method_frame(1, Q.Declare(queue="out", durable=True)))
    frames_of(transport)
    return conn, transport, broker


def publish(conn: Any, body: bytes, queue: str = "q", channel: int = 1,
            mandatory: bool = False) -> None:
    conn.dataReceived(content_frames(channel, B.Publish(exchange="", routing_key=queue,
                                                        mandatory=mandatory),
                                     b"\x00\x00", body, 131072))


def queued(broker: Any, queue: str = "q") -> list[bytes]:
    return [m.payload for m in broker.queues.queues[queue].log.values()]


def got(conn: Any, transport: StringTransport, n: int, queue: str = "q") -> list[int]:
    """``n`` messages of ``queue`` by basic.get (unacked): their delivery tags."""
    tags = []
    for _ in range(n):
        conn.dataReceived(method_frame(1, B.Get(queue=queue)))
        [ok] = [f for f in frames_of(transport) if f.name == "Basic.GetOk"]
        tags.append(ok.delivery_tag)
    return tags


def test_publishes_are_routed_at_commit_and_answered_once_durable() -> None:
    """Publishes in tx mode touch nothing until tx.commit; commit-ok waits for the
    store, and the commit's work reaches it in one submission."""
    store = HeldStore()
    conn, t, broker = opened(store)
    conn.dataReceived(method_frame(1, T.Select()))
    assert names(t) == ["Tx.SelectOk"]
    before = len(store.submissions)
    publish(conn, b"a")
    publish(conn, b"b")
    assert queued(broker) == [] and len(store.submissions) == before
    store.held = True
    conn.dataReceived(method_frame(1, T.Commit()))
    assert queued(broker) == [b"a", b"b"]
    assert names(t) == []                       # (not durable yet)
    assert len(store.submissions) == before + 1
    store.release()
    assert names(t) == ["Tx.CommitOk"]
    assert broker.transactions.committed == 1


def test_publish_and_ack_commit_in_one_submission() -> None:
    """An ack and a publish of one transaction are stored by one submission, and
    the ack is held (the message unacked, not settled) until then."""
    store = HeldStore()
    conn, t, broker = opened(store)
    publish(conn, b"in")
    [tag] = got(conn, t, 1)
    conn.dataReceived(method_frame(1, T.Select()))
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=tag)))
    publish(conn, b"result", queue="out")
    channel = conn.channels[1]
    assert channel.tx.held == 1 and not channel.unacked
    # (a publish counts its body and its raw properties: 2 bytes of empty flags)
    assert channel.tx.info() == (1, 1, len(b"result") + 2 + 2 * 64)
    store.held = True
    before = len(store.submissions)
    conn.dataReceived(method_frame(1, T.Commit()))
    assert len(store.submissions) == before + 1
    store.release()
    assert names(t) == ["Tx.CommitOk"]
    assert queued(broker, "out") == [b"result"] and queued(broker) == []
    assert channel.tx.held == 0


def test_rollback_gives_the_tags_back_in_order() -> None:
    """tx.rollback drops held publishes and puts acked tags back on the channel, in
    tag order; the held tags count against a global prefetch meanwhile."""
    conn, t, broker = opened()
    for body in (b"1", b"2", b"3"):
        publish(conn, body)
    tags = got(conn, t, 3)
    conn.dataReceived(method_frame(1, B.Qos(prefetch_count=3, global_=True))
                      + method_frame(1, T.Select()))
    frames_of(t)
    channel = conn.channels[1]
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=tags[0]))
                      + method_frame(1, B.Ack(delivery_tag=tags[2])))
    publish(conn, b"x", queue="out")
    assert list(channel.unacked) == [tags[1]] and channel.at_limit()
    conn.dataReceived(method_frame(1, T.Rollback()))
    assert names(t) == ["Tx.RollbackOk"]
    assert list(channel.unacked) == tags and channel.tx.held == 0
    assert queued(broker, "out") == []
    assert broker.transactions.rolled_back == 1
    conn.dataReceived(method_frame(1, T.Commit()))
    assert names(t) == ["Tx.CommitOk"]
    assert list(channel.unacked) == tags


def test_an_ack_of_a_tag_held_by_the_transaction_is_406() -> None:
    """A tag acked in the open transaction is no longer the channel's (RabbitMQ's
    rule): acking it again is 406, and the channel's end rolls back."""
    conn, t, broker = opened()
    publish(conn, b"1")
    [tag] = got(conn, t, 1)
    conn.dataReceived(method_frame(1, T.Select()) + method_frame(1, B.Ack(delivery_tag=tag))
                      + method_frame(1, B.Ack(delivery_tag=tag)))
    got_frames = frames_of(t)
    assert [(f.name, getattr(f, "reply_code", None)) for f in got_frames][-1] == (
        "Channel.Close", 406)
    assert broker.transactions.open_count == 0


def test_commit_and_rollback_without_select_are_406() -> None:
    """tx.commit and tx.rollback on a channel not in tx mode close it with 406."""
    conn, t, _ = opened(channels=2)
    conn.dataReceived(method_frame(1, T.Commit()) + method_frame(2, T.Rollback()))
    closes = [(f.name, f.reply_code, f.reply_text) for f in frames_of(t)]
    assert closes == [("Channel.Close", 406,
                       "PRECONDITION_FAILED - channel is not transactional")] * 2


def test_tx_and_confirm_exclude_each_other() -> None:
    """confirm.select on a tx channel and tx.select on a confirm channel: 406."""
    conn, t, _ = opened(channels=2)
    conn.dataReceived(method_frame(1, T.Select()) + method_frame(1, commands.Confirm.Select())
                      + method_frame(2, commands.Confirm.Select())
                      + method_frame(2, T.Select()))
    got_frames = frames_of(t)
    assert [(f.name, getattr(f, "reply_code", None)) for f in got_frames] == [
        ("Tx.SelectOk", None), ("Channel.Close", 406),
        ("Confirm.SelectOk", None), ("Channel.Close", 406)]


def test_mandatory_return_is_sent_at_commit_before_commit_ok() -> None:
    """An unroutable mandatory publish in tx mode comes back at commit, before
    commit-ok; rolled back, never."""
    conn, t, _ = opened()
    conn.dataReceived(method_frame(1, T.Select()))
    frames_of(t)
    publish(conn, b"lost", queue="nowhere", mandatory=True)
    assert names(t) == []
    conn.dataReceived(method_frame(1, T.Commit()))
    assert names(t) == ["Basic.Return", "ContentHeader", "ContentBody", "Tx.CommitOk"]
    publish(conn, b"lost", queue="nowhere", mandatory=True)
    conn.dataReceived(method_frame(1, T.Rollback()) + method_frame(1, T.Commit()))
    assert names(t) == ["Tx.RollbackOk", "Tx.CommitOk"]


def test_a_missing_exchange_is_404_at_publish() -> None:
    """A publish in tx mode to an exchange that does not exist closes the channel
    at once (404), as outside a transaction."""
    conn, t, _ = opened()
    conn.dataReceived(method_frame(1, T.Select()))
    frames_of(t)
    conn.dataReceived(content_frames(1, B.Publish(exchange="nope", routing_key="k"),
                                     b"\x00\x00", b"x", 131072))
    [close] = frames_of(t)
    assert (close.name, close.reply_code) == ("Channel.Close", 404)


def test_work_over_max_transaction_bytes_closes_the_channel() -> None:
    """Past --max-transaction-bytes the channel closes with 406 naming the option;
    nothing of it was routed; the refusal is counted and the transaction gone."""
    conn, t, broker = opened(max_transaction_bytes=1000)
    conn.dataReceived(method_frame(1, T.Select()))
    frames_of(t)
    publish(conn, b"x" * 500)
    publish(conn, b"x" * 500)
    [close] = frames_of(t)
    assert (close.name, close.reply_code) == ("Channel.Close", 406)
    assert "--max-transaction-bytes" in close.reply_text
    assert queued(broker) == []
    assert broker.transactions.refused == 1 and broker.transactions.open_count == 0


def test_transactional_channels_per_connection_are_bounded() -> None:
    """tx.select past --max-transactions-per-connection: 406 on that channel only;
    a commit does not count twice (the next transaction replaces it)."""
    conn, t, broker = opened(channels=2, max_transactions_per_connection=1)
    conn.dataReceived(method_frame(1, T.Select()) + method_frame(1, T.Commit()))
    assert names(t) == ["Tx.SelectOk", "Tx.CommitOk"]
    conn.dataReceived(method_frame(2, T.Select()))
    got_frames = frames_of(t)
    assert [(f.name, f.reply_code) for f in got_frames] == [("Channel.Close", 406)]
    assert "--max-transactions-per-connection" in got_frames[-1].reply_text
    assert broker.transactions.open_count == 1


def test_channel_close_and_connection_loss_roll_back() -> None:
    """A channel closed, or its connection lost, with a transaction open: rolled
    back, nothing routed, no transaction left open."""
    conn, _, broker = opened(channels=2)
    for n in (1, 2):
        conn.dataReceived(method_frame(n, T.Select()))
        publish(conn, b"never", channel=n)
    conn.dataReceived(method_frame(1, commands.Channel.Close(200, "bye", 0, 0)))
    assert broker.transactions.rolled_back == 1 and broker.transactions.open_count == 1
    conn.connectionLost(None)
    assert broker.transactions.rolled_back == 2 and broker.transactions.open_count == 0
    assert queued(broker) == []


def test_console_shows_tx_mode_and_pending_work() -> None:
    """The console's view of a channel says it is transactional and what it holds."""
    conn, _, _ = opened(channels=2)
    conn.dataReceived(method_frame(1, T.Select()))
    publish(conn, b"abc")
    first, second = details(conn).channels
    assert (first.transactional, first.tx_publishes, first.tx_acks) == (True, 1, 0)
    assert first.tx_bytes == 3 + 2 + 64   # (body, raw properties, the action)
    assert (second.transactional, second.tx_publishes) == (False, 0)


def test_a_commit_the_store_fails_closes_the_connection_with_541() -> None:
    """A transaction's commit that is not stored is never answered commit-ok: the
    connection is closed with 541 (as a failed declaration's)."""
    store = HeldStore()
    conn, t, broker = opened(store)
    conn.dataReceived(method_frame(1, T.Select()))
    publish(conn, b"a")
    frames_of(t)
    store.held = True
    conn.dataReceived(method_frame(1, T.Commit()))
    waiting, store.waiting = store.waiting, []
    for d in waiting:
        d.errback(RuntimeError("disk full"))
    got_frames = frames_of(t)
    assert [(f.name, f.reply_code) for f in got_frames] == [("Connection.Close", 541)]
    assert broker.transactions.failed == 1

"""Publisher confirms of copies to one durable queue wait on the batch's commit round
(``core.commits.CommitRound``), through the real channel: acked once the commit
holding them is done, as one ``basic.ack`` with ``multiple``; nacked, every one,
when it fails."""

from __future__ import annotations

from typing import Any

from core_broker import make_broker
from fakes import ManualMemoryStore
from pamqp import commands
from test_connection import frames_of
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import content_frames, method_frame
from mqttamqp.amqp091.handshake import Settings

B, C, Q = commands.Basic, commands.Connection, commands.Queue


def _publisher(store: ManualMemoryStore) -> tuple[Any, StringTransport, Any]:
    """A confirming channel 1 and a durable queue ``c``, every setup commit done."""
    broker, clock, _ = make_broker(store)
    factory = AMQP091Factory(broker, clock, Settings())
    conn = factory.buildProtocol(None)
    t = StringTransport()
    conn.makeConnection(t)
    conn.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open())
        + method_frame(1, Q.Declare(queue="c", durable=True))
        + method_frame(1, commands.Confirm.Select()))
    store.commit_all()
    clock.advance(1)
    frames_of(t)
    return conn, t, clock


def _publish(n: int) -> bytes:
    return b"".join(content_frames(1, B.Publish(exchange="", routing_key="c"),
                                   B.Properties(delivery_mode=2).marshal(), b"m%d" % i,
                                   131072) for i in range(n))


def _confirms(t: StringTransport) -> list[tuple[str, int, bool]]:
    return [(f.name, f.delivery_tag, f.multiple) for f in frames_of(t)
            if f.name in ("Basic.Ack", "Basic.Nack")]


def test_two_publishes_in_one_batch_are_one_ack_after_their_commit() -> None:
    """Two publishes read together: nothing before their commit, then one ack
    with multiple for both."""
    store = ManualMemoryStore()
    conn, t, clock = _publisher(store)
    conn.dataReceived(_publish(2))
    clock.advance(1)
    assert _confirms(t) == []
    assert len(store.pending) == 1
    store.commit_all()
    clock.advance(1)
    assert _confirms(t) == [("Basic.Ack", 2, True)]


def test_two_publishes_in_a_failed_commit_are_both_nacked() -> None:
    """The commit holding two publishes fails: neither is acked, both are nacked."""
    store = ManualMemoryStore()
    conn, t, clock = _publisher(store)
    conn.dataReceived(_publish(2))
    [(_, d)] = store.pending
    store.pending.clear()
    d.errback(Failure(OSError("disk full")))
    clock.advance(1)
    assert _confirms(t) == [("Basic.Nack", 1, False), ("Basic.Nack", 2, False)]



def test_a_publish_its_consumer_finished_first_is_confirmed_before_the_commit() -> None:
    """A consumer acknowledging a publish before its commit answers the confirm at
    once (the message is safe: consumed), while the commit is still pending."""
    store = ManualMemoryStore()
    conn, t, clock = _publisher(store)
    conn.dataReceived(method_frame(1, B.Consume(queue="c", consumer_tag="k")))
    store.commit_all()
    conn.dataReceived(_publish(1))     # (the first delivery waits for a watermark)
    store.commit_all()
    clock.advance(1)
    [first] = [f for f in frames_of(t) if f.name == "Basic.Deliver"]
    conn.dataReceived(method_frame(1, B.Ack(first.delivery_tag)))
    store.commit_all()
    clock.advance(1)
    frames_of(t)
    conn.dataReceived(_publish(1))
    assert store.pending
    [deliver] = [f for f in frames_of(t) if f.name == "Basic.Deliver"]
    conn.dataReceived(method_frame(1, B.Ack(deliver.delivery_tag)))
    clock.advance(1)
    assert store.pending                 # (the publish's commit is not done)
    assert _confirms(t) == [("Basic.Ack", 2, True)]


def _to(key: str) -> bytes:
    return content_frames(1, B.Publish(exchange="", routing_key=key),
                          B.Properties(delivery_mode=2).marshal(), b"m", 131072)


def test_confirms_stay_in_order_when_rounds_commit_out_of_order() -> None:
    """A later round committed first confirms nothing; the earlier one's commit
    then confirms both with one ack, and a publish confirmed at once (routed
    nowhere) between a round's publishes is acked with them, never before."""
    store = ManualMemoryStore()
    conn, t, clock = _publisher(store)
    # (1, 2 in the round; 3 routed nowhere, kept at once; 4 in the same round)
    conn.dataReceived(_to("c") + _to("c") + _to("nowhere") + _to("c"))
    conn.dataReceived(_publish(2))   # (5, 6: the next round)
    clock.advance(1)
    assert _confirms(t) == []
    [(_, first), (_, second)] = store.pending
    store.pending.clear()
    second.callback(None)   # (the later commit's outcome first)
    clock.advance(1)
    assert _confirms(t) == []
    first.callback(None)
    clock.advance(1)
    assert _confirms(t) == [("Basic.Ack", 6, True)]
    conn.dataReceived(_publish(1))   # (7: a round whose publishes are the oldest)
    store.commit_all()
    clock.advance(1)
    assert _confirms(t) == [("Basic.Ack", 7, True)]


def test_a_publish_after_another_keeps_the_channel_rules() -> None:
    """A basic.publish on a channel whose assembler is idle (it published before) is
    still refused with immediate=true (540, a connection error), and one sent after
    it, while the connection closes, is discarded, not published."""
    store = ManualMemoryStore()
    conn, t, clock = _publisher(store)
    conn.dataReceived(_publish(1))
    store.commit_all()
    clock.advance(1)
    assert _confirms(t) == [("Basic.Ack", 1, True)]
    immediate = content_frames(1, B.Publish(exchange="", routing_key="c", immediate=True),
                               B.Properties(delivery_mode=2).marshal(), b"i", 131072)
    conn.dataReceived(immediate + _publish(1))
    store.commit_all()
    clock.advance(1)
    [close] = [f for f in frames_of(t) if f.name != "Basic.Ack"]
    assert close.name == "Connection.Close" and close.reply_code == 540
    assert conn.broker.queues.queues["c"].published == 1
    assert conn._assemblers[1].method is None   # (not started on a closing connection)

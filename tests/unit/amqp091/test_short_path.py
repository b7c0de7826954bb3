"""The short settlement path of AMQP 0.9.1's ``basic.ack`` (``Settlement.accept_many``):
a batch of acknowledgements finished in place and pumped once, with the generic
path's results at its edges.  A channel in process against an in-memory broker, a
fake transport and a ``Clock``."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands
from test_amqp091_review import bodies, frames_of, opened

from mqttamqp.amqp091.frames import method_frame
from mqttamqp.core.message import Message
from mqttamqp.core.routing.settlement import Settlement
from mqttamqp.core.sessions.session import Session

B, Q = commands.Basic, commands.Queue


def _published(broker: Any, clock: Any, n: int, queue: str = "q") -> None:
    for i in range(n):
        broker.publish(Message("$queue/" + queue, b"m%d" % i, 1, False, "p",
                               clock.seconds()))
    clock.advance(0.1)


def _group(broker: Any, queue: str = "q") -> Any:
    (group,) = broker.queues.queues[queue].groups.values()
    return group


def _tags(frames: list[Any]) -> list[tuple[str, int, bool]]:
    return [(f.consumer_tag, f.delivery_tag, f.redelivered) for f in frames
            if f.name == "Basic.Deliver"]


def _consume(conn: Any, tag: str, prefetch: int = 0, queue: str = "q") -> None:
    if prefetch:
        conn.dataReceived(method_frame(1, B.Qos(prefetch_count=prefetch)))
    conn.dataReceived(method_frame(1, B.Consume(queue=queue, consumer_tag=tag)))


def _consuming(tag: str, prefetch: int) -> tuple[Any, Any, Any, Any]:
    """An opened connection whose channel 1 consumes the durable queue ``q`` as
    ``tag`` with ``prefetch``, what was written so far read: (connection,
    transport, broker, clock)."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="q", durable=True)))
    _consume(conn, tag, prefetch=prefetch)
    frames_of(t)
    return conn, t, broker, clock


def _paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of each path a queue delivery and its ack may take: the
    short ones (``send_credited``, ``accept_many``) and the generic ones
    (``Session.deliver``, ``Settlement.settle``)."""
    calls = {"send_credited": 0, "deliver": 0, "accept_many": 0, "settle": 0}
    def counting(name: str, real: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)
        return counted

    for cls, name in ((Session, "send_credited"), (Session, "deliver"),
                      (Settlement, "accept_many"), (Settlement, "settle")):
        monkeypatch.setattr(cls, name, counting(name, getattr(cls, name)))
    return calls


def test_credit_running_out_mid_batch_is_refilled_once_the_batch_is_acked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefetch 5, 12 messages: 5 go out; an ack (multiple) of 3 frees exactly 3
    (the pump after the batch sees the freed credit), and the batch's done records are
    stored; then the rest follow acks — every delivery by the short path, every ack
    by one ``accept_many``."""
    calls = _paths(monkeypatch)
    conn, t, broker, clock = _consuming("c", 5)
    _published(broker, clock, 12)
    assert bodies(frames_of(t)) == [b"m%d" % i for i in range(5)]
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=3, multiple=True)))
    assert bodies(frames_of(t)) == [b"m5", b"m6", b"m7"]
    group = _group(broker)
    assert sorted(p.offset for p in group.pending.values()) == [3, 4, 5, 6, 7]
    assert group.acked == 3
    assert not broker.queues._unsaved   # (the done records went to storage)
    assert broker.queues.queues["q"].first == 3   # (and the acked left the log)
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=8, multiple=True)))
    assert bodies(frames_of(t)) == [b"m8", b"m9", b"m10", b"m11"]
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    assert not group.pending and group.acked == 12
    assert broker.queues.queues["q"].acked == 12
    (member,) = group.members
    assert member.outstanding == 0
    assert calls == {"send_credited": 12, "deliver": 0, "accept_many": 3, "settle": 0}


def test_a_second_consumer_joining_shares_the_queue_and_one_ack_settles_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two consumers of one channel, the second joining after the first has
    deliveries: round-robin hands both some, and one ack (multiple) of every tag
    finishes every delivery of both (each consumer's unacked count back to 0), by
    the short paths."""
    calls = _paths(monkeypatch)
    conn, t, broker, clock = _consuming("a", 4)
    _published(broker, clock, 2)
    _consume(conn, "b")
    frames_of(t)
    _published(broker, clock, 6)
    tags = _tags(frames_of(t))
    assert {tag for tag, _, _ in tags} == {"a", "b"}
    channel = conn.channels[1]
    assert sum(c.unacked for c in channel.consumers.values()) == 8
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    assert [c.unacked for c in channel.consumers.values()] == [0, 0]
    group = _group(broker)
    assert not group.pending and group.acked == 8
    assert all(m.outstanding == 0 for m in group.members)
    assert not channel.unacked
    assert calls == {"send_credited": 8, "deliver": 0, "accept_many": 1, "settle": 0}


def test_cancel_with_unacked_then_ack_leaves_and_nothing_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """basic.cancel with deliveries unacknowledged: they stay the channel's; the ack
    of all of them (one ``accept_many``) finishes them for good (not redelivered to
    the next consumer) and the cancelled consumer then leaves its group."""
    calls = _paths(monkeypatch)
    conn, t, broker, clock = _consuming("a", 10)
    _published(broker, clock, 4)
    assert len(bodies(frames_of(t))) == 4
    conn.dataReceived(method_frame(1, B.Cancel(consumer_tag="a")))
    frames_of(t)
    group = _group(broker)
    assert len(group.members) == 1
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    clock.advance(0.1)
    assert not group.members
    assert not group.pending and group.acked == 4
    _consume(conn, "b")
    clock.advance(0.1)
    assert bodies(frames_of(t)) == []
    assert calls == {"send_credited": 4, "deliver": 0, "accept_many": 1, "settle": 0}


def test_a_requeued_delivery_comes_back_redelivered_and_its_ack_finishes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """basic.nack (requeue) of one of a batch (the generic ``settle``): it comes
    back, by the short path, with the redelivered flag and an x-delivery-count of
    1; the ack of the batch (one ``accept_many``) finishes the rest and the
    redelivery alike."""
    calls = _paths(monkeypatch)
    conn, t, broker, clock = _consuming("a", 10)
    _published(broker, clock, 3)
    assert [r for _, _, r in _tags(frames_of(t))] == [False, False, False]
    conn.dataReceived(method_frame(1, B.Nack(delivery_tag=2, multiple=False, requeue=True)))
    clock.advance(0.1)
    frames = frames_of(t)
    assert _tags(frames) == [("a", 4, True)]
    headers = [f.properties.headers or {} for f in frames if f.name == "ContentHeader"]
    assert headers[0].get("x-delivery-count") == 1
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    group = _group(broker)
    assert not group.pending and group.acked == 3
    assert group.redelivered == 1
    assert calls == {"send_credited": 4, "deliver": 0, "accept_many": 1, "settle": 1}


def test_what_is_not_the_common_case_takes_the_generic_settle() -> None:
    """``accept_many`` given a delivery that is no durable queue's (a topic
    subscription's QoS 1 entry) or no longer in flight settles it as ``settle``
    does: the topic delivery acknowledged, the unknown id ignored.  (Which delivery
    took which way is told by the common case's call into the queues, interpreted:
    compiled ``accept_many`` calls its ``settle`` past a patched instance.)"""
    conn, t, broker, clock = _consuming("a", 10)
    _published(broker, clock, 1)
    frames_of(t)
    (member,) = conn.channels[1].consumers.values()
    session = member.session
    # a topic's QoS 1 delivery in the same session: no queue receipt
    entry = session.deliver(Message("t", b"x", 1, False, "p", clock.seconds()), 1, False)
    assert entry is not None and entry.receipt is None
    queued = [pid for pid, e in session.inflight.items() if e.receipt is not None]
    receipt = session.inflight[queued[0]].receipt
    quiet: list[Any] = []
    accepted_quietly = broker.queues.accepted_quietly
    broker.queues.accepted_quietly = lambda r: (quiet.append(r), accepted_quietly(r))[1]
    acked: list[Any] = []
    transport_ack = broker.queues.transport_ack
    broker.queues.transport_ack = lambda r: (acked.append(r), transport_ack(r))[1]
    broker.settlement.accept_many([(session, queued[0]), (session, entry.packet_id),
                                   (session, 60000)])
    assert quiet == [receipt]   # (the common case: the other two took ``settle``)
    assert acked == []          # (not through settle's transport ack)
    assert not session.inflight
    assert _group(broker).acked == 1
    assert not broker.queues._unsaved   # (its done record stored by the batch's end)


@pytest.mark.parametrize("method", [
    B.Ack(delivery_tag=2, multiple=True),
    B.Ack(delivery_tag=99, multiple=True),
    B.Ack(delivery_tag=99),
    B.Ack(delivery_tag=0),
    B.Nack(delivery_tag=2, multiple=True),
    B.Nack(delivery_tag=99, multiple=True, requeue=False),
    B.Reject(delivery_tag=2),
    B.Reject(delivery_tag=99),
], ids=["ack-multiple-acked", "ack-multiple-never", "ack-never", "ack-zero",
        "nack-multiple-acked", "nack-multiple-never", "reject-acked", "reject-never"])
def test_a_tag_not_outstanding_closes_the_channel_before_anything_is_settled(
        method: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """basic.ack/nack/reject of a tag that is not outstanding (acknowledged already,
    or never issued), multiple or not: the channel is closed with 406 "unknown
    delivery tag N", as RabbitMQ does, and none of the outstanding deliveries below
    it was settled by it (the close gives them back to the queue)."""
    conn, t, broker, clock = _consuming("c", 10)
    _published(broker, clock, 3)
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=2)))
    frames_of(t)
    calls = _paths(monkeypatch)
    conn.dataReceived(method_frame(1, method))
    (close,) = [f for f in frames_of(t) if f.name == "Channel.Close"]
    assert close.reply_code == 406
    assert f"unknown delivery tag {method.delivery_tag}" in close.reply_text
    assert calls["accept_many"] == 0
    group = _group(broker)
    assert group.acked == 1
    assert sorted(group.ready) == [0, 2] and not group.pending   # (back in the queue)


def test_ack_of_tag_zero_with_multiple_settles_everything_outstanding() -> None:
    """Tag 0 with multiple is every outstanding delivery (RabbitMQ's reading), even
    after some were acknowledged singly; with none outstanding it is no error."""
    conn, t, broker, clock = _consuming("c", 10)
    _published(broker, clock, 3)
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=2)))
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    assert not [f for f in frames_of(t) if f.name == "Channel.Close"]
    group = _group(broker)
    assert group.acked == 3 and not group.pending


"""A publish routed to several queues (``QueueManager.publish_copies``): one commit
and one Deferred for all its copies, the confirm only once that commit is durable
(even when the consumers finished every copy first), each copy at its consumer
before that commit, refusals per queue, and each copy back after a crash
(``ManualMemoryStore``)."""

from __future__ import annotations

from typing import Any

from exchange_facade import consume, declared, message
from fakes import ManualMemoryStore
from queue_facade import make

from mqttamqp.core.exchanges.exchanges import PublishRefused
from mqttamqp.core.persistence import PutQueueMessage
from mqttamqp.core.routing.settlement import Outcome


def fanout(broker: Any, *queues: str) -> None:
    ex = broker.exchanges
    declared(broker, *queues)
    ex.declare_exchange("fan", "fanout", durable=True)
    for q in queues:
        ex.bind_queue(q, "fan")


def test_a_fanout_publish_is_one_submission_and_confirmed_after_it() -> None:
    """Three queues' copies go to the store in one submission; the confirm fires only
    when that commit is durable, and a broker restarted from what was committed has
    every copy (what was confirmed is not lost)."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    fanout(broker, "a", "b", "c")
    store.commit_all()
    # (outside a batch: before, each copy was a submission of its own)
    routed, confirm = broker.exchanges.publish(message(b"m1", broker=broker), "fan", "k")
    assert routed and confirm is not None
    fired: list[object] = []
    confirm.addCallback(fired.append)
    assert len(store.pending) == 1
    puts = [op for op in store.pending[0][0] if isinstance(op, PutQueueMessage)]
    assert sorted(op.queue for op in puts) == ["a", "b", "c"]
    assert not fired
    store.commit_next()
    assert fired == [None]
    again, _, _ = make(store)
    assert [[m.payload for m in again.queues.queues[q].log.values()] for q in "abc"] == [
        [b"m1"]] * 3


def test_a_fanout_finished_by_its_consumers_is_confirmed_only_at_its_commit() -> None:
    """Consumers on queues a and b accept their copies before the writer commits: the
    confirm still waits for the commit (it promises the message is stored), and fires
    when it is durable."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    fanout(broker, "a", "b")
    session_a, link_a = consume(broker, "a", owner="ca", key="ta")
    session_b, link_b = consume(broker, "b", owner="cb", key="tb")
    # (a warm-up publish, committed, so each group's dispatch watermark is durable
    # and the next copies go to the consumers as they are appended)
    broker.exchanges.publish(message(b"warm", broker=broker), "fan", "k")
    store.commit_all()
    for session, link in ((session_a, link_a), (session_b, link_b)):
        [(_, _, pid, *_)] = [p for p in link.published() if p[0].payload == b"warm"]
        broker.settle(session, pid, Outcome.ACCEPTED)
    store.commit_all()
    _, confirm = broker.exchanges.publish(message(b"m5", broker=broker), "fan", "k")
    assert confirm is not None
    fired: list[object] = []
    confirm.addCallback(fired.append)
    for session, link in ((session_a, link_a), (session_b, link_b)):
        [(_, _, pid, *_)] = [p for p in link.published() if p[0].payload == b"m5"]
        broker.settle(session, pid, Outcome.ACCEPTED)
    assert store.pending and not fired
    store.commit_all()
    assert fired == [None]


def test_an_unconfirmed_fanout_copy_is_not_kept_and_not_confirmed() -> None:
    """Before its commit a fanout publish is neither confirmed nor stored: a crash then
    (the pending commit never applied) leaves no copy in any queue."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    fanout(broker, "a", "b")
    store.commit_all()
    _, confirm = broker.exchanges.publish(message(b"m2", broker=broker), "fan", "k")
    assert confirm is not None and not confirm.called
    again, _, _ = make(store)
    assert [len(again.queues.queues[q].log) for q in "ab"] == [0, 0]


def test_a_fanout_copy_refused_by_one_queue_fails_the_confirm_only() -> None:
    """A queue at its bound with x-overflow reject-publish refuses its copy: the
    confirm fails with PublishRefused, the other queues take theirs."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "a", "b")
    ex.declare_queue("full", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ex.declare_exchange("fan", "fanout", durable=True)
    for q in ("a", "b", "full"):
        ex.bind_queue(q, "fan")
    ex.publish(message(b"1", broker=broker), "fan", "")
    _, confirm = ex.publish(message(b"2", broker=broker), "fan", "")
    assert confirm is not None
    failures: list[Any] = []
    confirm.addErrback(failures.append)
    assert failures and failures[0].check(PublishRefused)
    assert "full" in str(failures[0].value)
    logs = broker.queues.queues
    assert [[m.payload for m in logs[q].log.values()] for q in ("a", "b", "full")] == [
        [b"1", b"2"], [b"1", b"2"], [b"1"]]


def test_fanout_copies_reach_consumers_of_each_queue_at_once() -> None:
    """Each queue's consumer gets its copy as the publish is appended, before its
    commit is durable (QoS 1, as a single-queue publish), with the queue's own topic."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    fanout(broker, "a", "b")
    _, link_a = consume(broker, "a", owner="ca", key="ta")
    _, link_b = consume(broker, "b", owner="cb", key="tb")
    # (a warm-up publish, committed, so each group's dispatch watermark is durable:
    # a delivery waits for none of its own)
    broker.exchanges.publish(message(b"warm", broker=broker), "fan", "k")
    store.commit_all()
    broker.exchanges.publish(message(b"m3", broker=broker), "fan", "k")
    assert store.pending   # (the copies' commit is not durable yet)
    for link, q in ((link_a, "a"), (link_b, "b")):
        sent = [m for m, *_ in link.published() if m.payload == b"m3"]
        assert len(sent) == 1 and sent[0].topic.startswith(f"$queue/{q}/")

"""The batch's early acknowledgements (MQTT QoS 1 PUBACKs) on its ``CommitRound``
(``core.commits``; it was a ``Waiter`` of their own) and how
``CommitBatcher.persist_early`` feeds it: one answer for every callback, each
called on its own, success at the commit or once every delivery is acknowledged
after the batch was submitted, and a failed commit failing them all; and the
``PutQueued.first`` mark the router gives a new delivery's put."""

from __future__ import annotations

from typing import Any

import pytest
from compiled import logged_failures
from fakes import ManualStore
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitBatcher, CommitRound
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op
from mqttamqp.core.queues.addresses import QueueAddress
from mqttamqp.core.sessions.entries import OutEntry


def _entry(seq: int) -> OutEntry:
    return OutEntry(seq, Message("t", b"x", 1), 1, False, seq)


def _batch(commits: CommitBatcher, *entries: OutEntry) -> CommitRound:
    """One batch of ``persist_early`` calls, one per entry; the waiter they share."""
    commits.begin()
    assert commits.batching
    waiters = {id(commits.persist_early([_op(e)], [e])) for e in entries}
    waiter = commits.persist_early([], [])
    commits.end()
    assert waiters == {id(waiter)}
    return waiter


def test_deliveries_and_queue_appends_of_a_batch_share_one_round() -> None:
    """An MQTT publish's early acknowledgement and a queue append in the same batch
    wait on one round: its answer needs both finished (or the commit), while
    ``when_done`` waits for the commit whatever was finished."""
    from queue_facade import ack, last, warm_member

    store = ManualStore()
    broker, worker, link = warm_member(store)   # (the queue and its group stored, quiet)
    commits = broker.queues.commits
    commits.begin()
    entry = _entry(1)
    waiter = commits.persist_early([_op(entry)], [entry])
    r, _ = broker.queues.publish(Message("$queue/jobs", b"m", 1), QueueAddress("jobs", ""),
                                 "p", in_round=True)
    assert waiter is not None and r is waiter and r is commits.commit_round()
    answers, done = _Outcomes(), _Outcomes()
    r.when_answered(answers, "ack")
    r.when_done(done, "durable")
    commits.end()
    waiter()                    # the delivery was acknowledged: the append was not
    assert answers.seen == [] and not r.answered
    ack(broker, worker, last(link))     # the append's message was consumed
    assert answers.seen == [("ok", "ack")] and done.seen == []
    store.commit_all()
    assert done.seen == [("ok", "durable")] and answers.seen == [("ok", "ack")]


def _op(entry: OutEntry) -> Op:
    return entry.put_op("s")


class _Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, outcome: Failure | None, arg: Any) -> None:
        self.seen.append(("ok" if outcome is None else outcome.getErrorMessage(), arg))


def test_the_commit_succeeds_every_callback_once() -> None:
    """The batch's commit gives every callback success, once, with its own argument."""
    store = ManualStore()
    commits = CommitBatcher(store)
    waiter = _batch(commits, _entry(1), _entry(2))
    seen = _Outcomes()
    waiter.when_answered(seen, 1)
    waiter.when_answered(seen, 2)
    assert seen.seen == [] and len(store.pending) == 1
    store.commit_all()
    assert seen.seen == [("ok", 1), ("ok", 2)]
    waiter.when_answered(seen, 3)    # (known already: called at once)
    assert seen.seen[-1] == ("ok", 3)


def test_a_failed_commit_fails_every_callback_whatever_the_first_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first callback swallowing the failure (returning None) or raising does not
    turn the failure into success for the next ones."""
    store = ManualStore()
    commits = CommitBatcher(store)
    logged_failures(monkeypatch)
    waiter = _batch(commits, _entry(1), _entry(2))
    seen = _Outcomes()

    def swallow(outcome: Failure | None, arg: Any) -> None:
        seen(outcome, arg)
        return None

    def raises(outcome: Failure | None, arg: Any) -> None:
        seen(outcome, arg)
        raise RuntimeError("a consumer's bug")

    waiter.when_answered(swallow, 1)
    waiter.when_answered(raises, 2)
    waiter.when_answered(seen, 3)
    _ops, commit = store.pending.pop(0)
    commit.errback(Failure(OSError(28, "No space left on device")))
    assert [arg for _, arg in seen.seen] == [1, 2, 3]
    assert all(what != "ok" for what, _ in seen.seen)
    assert "No space left" in seen.seen[2][0]


def test_every_delivery_acknowledged_succeeds_before_the_commit() -> None:
    """Once every delivery the batch's early acknowledgements stand for is
    acknowledged, the waiter succeeds; the commit after it changes nothing."""
    store = ManualStore()
    commits = CommitBatcher(store)
    a, b = _entry(1), _entry(2)
    waiter = _batch(commits, a, b)
    seen = _Outcomes()
    waiter.when_answered(seen, "x")
    assert a.on_done is waiter and b.on_done is waiter and waiter.outstanding == 2
    waiter()
    assert seen.seen == [] and not waiter.answered
    waiter()
    assert seen.seen == [("ok", "x")]
    store.commit_all()
    assert seen.seen == [("ok", "x")]


def test_acknowledged_inside_the_batch_waits_for_its_end() -> None:
    """Deliveries acknowledged before the batch is submitted settle nothing yet:
    another publish of the same batch may still join."""
    store = ManualStore()
    commits = CommitBatcher(store)
    commits.begin()
    first = _entry(1)
    waiter = commits.persist_early([_op(first)], [first])
    waiter()
    assert not waiter.answered
    second = _entry(2)
    assert commits.persist_early([_op(second)], [second]) is waiter
    commits.end()
    assert not waiter.answered
    waiter()
    assert waiter.answered


def test_a_failure_after_an_early_success_is_logged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit failing after every delivery was acknowledged is logged, and no
    callback is called again."""
    store = ManualStore()
    commits = CommitBatcher(store)
    logged = logged_failures(monkeypatch)
    entry = _entry(1)
    waiter = _batch(commits, entry)
    seen = _Outcomes()
    waiter.when_answered(seen, 0)
    waiter()
    _ops, commit = store.pending.pop(0)
    commit.errback(Failure(OSError(28, "No space left on device")))
    assert seen.seen == [("ok", 0)]
    assert logged == ["storing messages that were already acknowledged"]


def test_no_waiter_outside_a_batch_or_while_stopping() -> None:
    """``batching`` is False outside a batch and while stopping (the router then
    takes the Deferred path)."""
    commits = CommitBatcher(ManualStore())
    assert not commits.batching
    commits.begin()
    assert commits.batching
    commits.stopping = True
    assert not commits.batching
    commits.end()


def test_a_routed_delivery_is_a_first_put_and_a_later_state_is_not() -> None:
    """The router's put of a new delivery says ``first`` (its seq is new: a delete in
    the same commit has nothing to remove); the put of a later state (PUBREC) does
    not."""
    from core_broker import connect, make_broker, pub, subscribe

    from mqttamqp.core.persistence import PutQueued

    broker, _clock, store = make_broker()
    s, _link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 2))
    pub(broker, "a", b"m", qos=2)
    puts = [op for op in store.submitted if isinstance(op, PutQueued)]
    assert [op.first for op in puts] == [True]
    broker.received(s, 1)
    puts = [op for op in store.submitted if isinstance(op, PutQueued)]
    assert [op.first for op in puts] == [True, False]


def test_the_router_marks_online_only_a_qos1_put_sent_at_once() -> None:
    """``PutQueued.online`` (the writer may hold the put over a commit or two) only on
    the first put of a QoS 1 entry sent at once to its online subscriber: not on one
    queued behind its full in-flight window (its subscriber may be stalled: what waits
    on the commit would wait the longest), on a QoS 2 entry (held until stored), nor on
    one queued for an offline session."""
    from core_broker import connect, make_broker, pub, subscribe

    from mqttamqp.core.persistence import PutQueued

    broker, _clock, store = make_broker(max_inflight=1)
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 2))
    pub(broker, "a", b"1", qos=1)
    pub(broker, "a", b"q", qos=1)     # (queued: the window of one is full)
    pub(broker, "a", b"2", qos=2)
    assert s.queue
    broker.end_session(link, s, clean=True, reason="bye")
    pub(broker, "a", b"3", qos=1)
    puts = [op for op in store.submitted if isinstance(op, PutQueued)]
    assert [(op.entry.message.payload, op.first, op.online) for op in puts] == [
        (b"1", True, True), (b"q", True, False), (b"2", True, False),
        (b"3", True, False)]


def test_no_put_is_marked_online_for_a_publish_that_commits_more_than_its_deliveries(
        ) -> None:
    """No put is held for a publish that stores more than its deliveries (as when the
    writer committed the rest of a submit before a held put): not for a will (its
    ``DeleteWill`` would be durable without the delivery: lost after kill -9), nor
    for an inbound QoS 2 publish (its stored packet id would make the re-sent
    PUBLISH a duplicate, never routed again; and its gated deliveries go out only
    after that commit, so no acknowledgement can cancel the put first), nor for a
    retained message.  (Review finding, session 19: the first two lost messages
    after kill -9.)"""
    from core_broker import connect, make_broker, pub, subscribe, will

    from mqttamqp.core.auth import Identity
    from mqttamqp.core.message import Message
    from mqttamqp.core.persistence import PutQueued

    broker, _clock, store = make_broker()
    s, _link, _ = connect(broker, "s", clean=False)
    subscribe(broker, s, ("a", 1), ("b", 1), ("r", 1))
    s2, _link2, _ = connect(broker, "s2", clean=False)   # (nothing gated before)
    subscribe(broker, s2, ("b", 1), ("r", 1), ("x", 1))
    p, _plink, _ = connect(broker, "p", clean=False)
    broker.publish_qos2(p, Message("a", b"q2", 2, False, "p", 0.0), Identity("p"), 7)
    w, wlink, _ = connect(broker, "w", will=will("w", "b", b"will", 1))
    broker.end_session(wlink, w, clean=False, reason="socket lost")
    pub(broker, "r", b"kept", qos=1, retain=True)
    pub(broker, "x", b"plain", qos=1)
    assert s2.inflight and not s2.queue     # (all of them sent at once to s2)
    puts = [op for op in store.submitted if isinstance(op, PutQueued) and op.first]
    assert [(op.client_id, op.entry.message.payload, op.online) for op in puts] == [
        ("s", b"q2", False), ("s", b"will", False), ("s2", b"will", False),
        ("s", b"kept", False), ("s2", b"kept", False), ("s2", b"plain", True)]


def test_stopping_before_the_batch_ends_stores_nothing_and_only_acks_complete() -> None:
    """Shutdown begun inside the batch: nothing is submitted; the waiter succeeds only
    once every delivery is acknowledged (as the Deferred path's early completion)."""
    store = ManualStore()
    commits = CommitBatcher(store)
    commits.begin()
    entry = _entry(1)
    waiter = commits.persist_early([_op(entry)], [entry])
    assert waiter is not None
    commits.stopping = True
    commits.end()
    assert store.pending == [] and not waiter.answered
    waiter()
    assert waiter.answered


def test_a_waiter_complete_inside_its_batch_fires_after_the_batch_is_submitted() -> None:
    """Review finding: the batch's waiter was sealed before its ops went to the store,
    so a callback that stores something (a resumed read's batch) got there first."""
    from mqttamqp.core.persistence import PutSession

    store = ManualStore()
    commits = CommitBatcher(store)
    commits.begin()
    entry = _entry(1)
    waiter = commits.persist_early([entry.put_op("s", True)], [entry])
    assert waiter is not None
    entry.on_done = None
    waiter()                       # acknowledged within the batch
    later = PutSession("other", 1.0)
    waiter.when_answered(lambda outcome, arg: commits.persist([later]), None)
    commits.end()
    order = [ops for ops, _ in store.pending]
    assert order[0] != [later] and order[-1] == [later]


def test_a_put_after_a_first_put_and_its_delete_is_not_a_first_one() -> None:
    """Review finding: a key stayed "first" after its delete was skipped with its
    first put, so the delete of a later put of the key in the same commit was skipped
    too and that put's record would have stayed stored."""
    from mqttamqp.core.persistence import DeleteQueued, PutQueued
    from mqttamqp.store.applying import superseded_puts

    stored = _entry(1).put_op("c", True).entry
    put1 = PutQueued("c", 1, stored, first=True)
    delete1 = DeleteQueued("c", 1)
    put2 = PutQueued("c", 1, stored)
    delete2 = DeleteQueued("c", 1)
    skip = superseded_puts([([put1, delete1, put2, delete2], None)])
    assert id(put1) in skip and id(delete1) in skip and id(put2) in skip
    assert id(delete2) not in skip

"""Local transactions (``mqttamqp.core.transactions``) through ``Broker.transactions``,
with fake links, ``task.Clock`` and in-memory stores: bounds, commit in one
submission, rollback, the owner's end, and what a crash at each stage leaves."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FailingStore, ManualMemoryStore, ManualStore
from queue_facade import client, join, make, send
from twisted.internet.defer import Deferred, fail

from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.persistence import QueueDone
from mqttamqp.core.transactions import ACTION_OVERHEAD, PartiallyApplied, TransactionRefused


def results(d: Deferred[Any]) -> list[Any]:
    """What ``d`` fired with so far ([] while pending): a value or a Failure."""
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def publisher(broker: Broker, topic: str, payload: bytes) -> Any:
    """A held publish as an adapter captures it: its routing call, its Deferred."""
    return lambda: send(broker, topic, payload).durable


def test_open_is_bounded_per_owner_and_counted() -> None:
    """Past --max-transactions-per-connection an owner's open is refused with the
    option named; another owner may still open; counters follow."""
    broker, _, _ = make(max_transactions_per_connection=2)
    txs = broker.transactions
    txs.open("a")
    txs.open("a")
    with pytest.raises(TransactionRefused) as refused:
        txs.open("a")
    assert "--max-transactions-per-connection" in refused.value.reason
    txs.open("b")
    assert (txs.opened, txs.refused, txs.open_count) == (3, 1, 3)


def test_commit_runs_the_work_in_one_submission_and_fires_once_durable() -> None:
    """Held publishes reach nobody before commit; commit routes them in one
    submission and its Deferred fires only once that is durable."""
    store = ManualStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    store.commit_all()
    tx = broker.transactions.open("conn")
    for i in range(3):
        tx.add_publish(1, publisher(broker, "$queue/jobs/t", b"m%d" % i))
    assert tx.size == 3 * (1 + ACTION_OVERHEAD)
    assert not store.pending and not link.published()
    fired = results(tx.commit())
    assert len(store.pending) == 1 and not fired
    store.commit_next()
    assert fired == [None]
    store.commit_all()
    assert [m.payload for m, *_ in link.published()] == [b"m0", b"m1", b"m2"]
    txs = broker.transactions
    assert (txs.committed, txs.open_count) == (1, 0)


def test_commit_inside_a_socket_batch_is_still_one_submission() -> None:
    """A discharge arrives inside the batch of a socket read: the transaction's work
    joins that batch's one submission."""
    store = ManualStore()
    broker, _, _ = make(store)
    tx = broker.transactions.open("conn")
    tx.add_publish(1, publisher(broker, "$queue/jobs/t", b"a"))
    tx.add_publish(1, publisher(broker, "$queue/jobs/t", b"b"))
    broker.begin_batch()
    fired = results(tx.commit())
    assert not store.pending
    broker.end_batch()
    assert len(store.pending) == 1 and not fired
    store.commit_next()
    assert fired == [None]


def test_acknowledgements_are_durable_in_the_commit_of_the_transaction() -> None:
    """An acknowledgement held in a transaction changes nothing before commit; at
    commit its queue's QueueDone is in the same submission as the transaction's
    publish (not the end-of-batch one), so the Deferred means it is stored."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    store.commit_all()
    send(broker, "$queue/jobs/t", b"in")
    store.commit_all()
    (_, _, packet_id, *_), = link.published()
    tx = broker.transactions.open("conn")
    # (the publish first: a queue publish after it would store the ack anyway)
    tx.add_publish(3, publisher(broker, "$queue/out/t", b"out"))
    tx.add_settle(lambda: broker.settle(worker, packet_id, Outcome.ACCEPTED))
    assert packet_id in worker.inflight           # still acquired
    broker.begin_batch()
    fired = results(tx.commit())
    broker.end_batch()
    first = store.pending[0][0]
    assert any(isinstance(op, QueueDone) and op.queue == "jobs" for op in first)
    store.commit_next()
    assert fired == [None]
    # a crash now: the acknowledged message is not redelivered, the publish is kept
    store.pending.clear()
    again, _, _ = make(store)
    w2, link2 = client(again, "w-1")
    join(again, w2, "$queue/jobs/#")
    o2, out = client(again, "o-1")
    join(again, o2, "$queue/out/#")
    store.commit_all()
    assert not link2.published()
    assert [m.payload for m, *_ in out.published()] == [b"out"]


def test_a_crash_before_commit_leaves_nothing_of_the_transaction() -> None:
    """Work held in an open transaction is never submitted: after a crash the
    acknowledged-in-transaction message comes back and no publish exists."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    store.commit_all()
    send(broker, "$queue/jobs/t", b"in")
    store.commit_all()
    (_, _, packet_id, *_), = link.published()
    tx = broker.transactions.open("conn")
    tx.add_settle(lambda: broker.settle(worker, packet_id, Outcome.ACCEPTED))
    tx.add_publish(3, publisher(broker, "$queue/out/t", b"out"))
    assert not store.pending
    again, _, _ = make(store)                       # the crash
    w2, link2 = client(again, "w-1")
    join(again, w2, "$queue/jobs/#")
    o2, out = client(again, "o-1")
    join(again, o2, "$queue/out/#")
    store.commit_all()
    assert [m.payload for m, *_ in link2.published()] == [b"in"]
    assert not out.published()


def test_rollback_drops_publishes_and_runs_the_undos() -> None:
    """Rollback routes nothing, runs each undo once, counts, and ends the
    transaction (later work on it is refused, commit fails)."""
    store = ManualStore()
    broker, _, _ = make(store)
    undone: list[int] = []
    ran: list[str] = []
    tx = broker.transactions.open("conn")
    tx.add_publish(1, lambda: ran.append("publish"))  # type: ignore[func-returns-value]
    tx.add_settle(lambda: ran.append("settle"), lambda: undone.append(1))
    tx.rollback()
    tx.rollback()
    assert (ran, undone, store.pending) == ([], [1], [])
    assert broker.transactions.rolled_back == 1
    with pytest.raises(TransactionRefused):
        tx.add_publish(1, lambda: None)
    fired = results(tx.commit())
    assert fired[0].check(TransactionRefused)


def test_the_owner_gone_rolls_back_its_open_transactions_only() -> None:
    """``owner_gone`` rolls back every open transaction of that owner and no other's."""
    broker, _, _ = make()
    txs = broker.transactions
    undone: list[str] = []
    for owner in ("a", "a", "b"):
        txs.open(owner).add_settle(lambda: None, lambda o=owner: undone.append(o))
    txs.owner_gone("a")
    txs.owner_gone("nobody")
    assert sorted(undone) == ["a", "a"]
    assert (txs.rolled_back, txs.open_count, len(txs.of("b"))) == (2, 1, 1)


def test_over_the_byte_bound_the_transaction_can_only_roll_back() -> None:
    """Work past --max-transaction-bytes is refused with the option named; a commit
    afterwards fails with the same reason, runs nothing and runs the undos."""
    store = ManualStore()
    broker, _, _ = make(store, max_transaction_bytes=1000)
    ran: list[str] = []
    undone: list[str] = []
    tx = broker.transactions.open("conn")
    tx.add_settle(lambda: ran.append("settle"), lambda: undone.append("settle"))
    with pytest.raises(TransactionRefused) as refused:
        tx.add_publish(2000, lambda: None)
    assert "--max-transaction-bytes" in refused.value.reason
    assert tx.doomed == refused.value.reason
    with pytest.raises(TransactionRefused):
        tx.add_publish(1, lambda: None)
    fired = results(tx.commit())
    assert fired[0].check(TransactionRefused)
    assert (ran, undone, store.pending) == ([], ["settle"], [])
    txs = broker.transactions
    assert (txs.failed, txs.refused, txs.committed) == (1, 1, 0)


def test_a_commit_the_store_refuses_fails_the_transaction() -> None:
    """A store failure under the commit fails its Deferred (AMQP: the client gets
    amqp:transaction:rollback) and is counted as failed, not committed."""
    store = FailingStore()
    broker, _, _ = make(store)
    tx = broker.transactions.open("conn")
    tx.add_publish(1, publisher(broker, "$queue/jobs/t", b"a"))
    store.failing = True
    fired = results(tx.commit())
    assert fired and fired[0].check(OSError)
    assert (broker.transactions.failed, broker.transactions.committed) == (1, 0)


def test_work_that_raises_fails_the_commit_and_the_rest_still_runs() -> None:
    """A fault in one held action is logged and fails the commit as partially
    applied (not a rollback); the actions after it still run (nothing is left
    half-held)."""
    broker, _, _ = make()
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("bug")

    tx = broker.transactions.open("conn")
    tx.add_settle(broken)
    tx.add_settle(lambda: ran.append("after"))
    fired = results(tx.commit())
    assert fired[0].check(PartiallyApplied) and ran == ["after"]
    assert fired[0].value.reason == "running its work failed"
    assert broker.transactions.failed == 1


def test_a_failing_check_refuses_the_commit_with_nothing_applied() -> None:
    """A held action whose check fails at commit refuses the whole commit before
    any work runs: no publish, no settle; the undos run and nothing is stored."""
    store = ManualStore()
    broker, _, _ = make(store)
    ran: list[str] = []
    tx = broker.transactions.open("conn")
    tx.add_publish(1, lambda: ran.append("publish") or None, lambda: None)
    tx.add_settle(lambda: ran.append("settle"), lambda: ran.append("undo"),
                  lambda: "delivery 7 is no longer held")
    fired = results(tx.commit())
    assert fired and fired[0].check(TransactionRefused)
    assert fired[0].value.reason == "delivery 7 is no longer held"
    assert ran == ["undo"] and not store.pending
    assert (broker.transactions.failed, broker.transactions.committed) == (1, 0)


def test_a_publish_refused_after_its_check_passed_is_partially_applied() -> None:
    """A publish whose Deferred fails with a refusal at commit (what the check
    could not foresee) fails the commit as ``PartiallyApplied``, not a rollback."""
    broker, _, _ = make()
    tx = broker.transactions.open("conn")
    tx.add_publish(1, lambda: fail(TransactionRefused("queue q is full")))
    fired = results(tx.commit())
    assert fired and fired[0].check(PartiallyApplied)
    assert "queue q is full" in fired[0].value.reason


def test_find_knows_only_the_owners_open_transactions() -> None:
    """``find`` answers an owner's open transaction by id, None for another owner's
    and once it ended."""
    broker, _, _ = make()
    txs = broker.transactions
    tx = txs.open("a")
    assert txs.find("a", tx.id) is tx
    assert txs.find("b", tx.id) is None
    tx.commit()
    assert txs.find("a", tx.id) is None


def test_a_held_token_names_the_delivery_not_its_packet_id() -> None:
    """``Settlement.still_held`` answers for the delivery held: once it is
    acknowledged otherwise it no longer holds, and an entry put at its packet id
    (as a reused id would be) is not it."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/t", b"first")
    [(_, _, packet_id, *_)] = link.published()
    settlement = broker.settlement
    token = settlement.hold(worker, packet_id)
    assert settlement.still_held(worker, packet_id, token)
    broker.settle(worker, packet_id, Outcome.ACCEPTED)   # (outside the transaction)
    settlement.unhold(token)
    assert not settlement.still_held(worker, packet_id, token)
    send(broker, "$queue/jobs/t", b"second")
    [next_id] = list(worker.inflight)
    entry = worker.inflight.pop(next_id)
    entry.packet_id = packet_id                        # (the id reused)
    worker.inflight[packet_id] = entry
    assert not settlement.still_held(worker, packet_id, token)
    assert settlement.still_held(worker, packet_id, settlement.hold(worker, packet_id))


def test_no_put_of_a_transaction_is_marked_online() -> None:
    """A transaction's ops are committed in one store transaction: the writer may not
    hold back a put of it (``PutQueued.online``) while committing its acknowledgements,
    as it may an ordinary publish's put for an online subscriber.  (Review finding,
    session 19: a transaction split across two commits by kill -9.)"""
    from mqttamqp.core.persistence import PutQueued

    store = ManualStore()
    broker, _, _ = make(store)
    sub, _link = client(broker, "s", clean=False)
    join(broker, sub, "t")
    store.commit_all()
    send(broker, "t", b"plain")
    tx = broker.transactions.open("conn")
    tx.add_publish(1, publisher(broker, "t", b"tx"))
    tx.commit()
    puts = [op for op in store.submitted if isinstance(op, PutQueued)]
    assert [(op.entry.message.payload, op.online) for op in puts] == [
        (b"plain", True), (b"tx", False)]

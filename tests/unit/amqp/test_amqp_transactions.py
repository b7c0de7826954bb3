"""AMQP 1.0 local transactions in memory (``amqp_memory.Net``, a ``task.Clock``): the
coordinator link, declare and discharge, transactional transfers to topics and
queues, transactional outcomes on queue and topic receivers, rollback on the end of
the coordinator link or the connection, the bounds and the errors."""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import ACCEPTED, REJECTED, AmqpPeer, Net, outcome
from fakes import ManualStore, MemoryStore
from proton import Data, Delivery, Described, Link, Message, Terminus, symbol, ulong

pytestmark = pytest.mark.timeout(120)

DECLARED = 0x33
TRANSACTIONAL = 0x34


def coordinator(app: AmqpPeer, capability: str = "amqp:local-transactions") -> Link:
    link = app.session.sender(f"txn-ctrl-{capability}")
    link.target.type = Terminus.COORDINATOR
    caps: Data = link.target.capabilities
    caps.put_array(False, Data.SYMBOL)
    caps.enter()
    caps.put_symbol(symbol(capability))
    caps.exit()
    link.open()
    app.net.pump()
    return link


def declare(app: AmqpPeer, ctrl: Link) -> bytes:
    dlv = app.send(ctrl, Message(body=Described(symbol("amqp:declare:list"), [None])))
    assert dlv.remote_state == DECLARED and dlv.settled
    return bytes(dlv.remote.data[0])


def discharge(app: AmqpPeer, ctrl: Link, txn: bytes, fail: bool = False) -> Delivery:
    return app.send(ctrl, Message(body=Described(symbol("amqp:discharge:list"), [txn, fail])))


def send_in(app: AmqpPeer, link: Link, txn: bytes, body: Any) -> Delivery:
    """A transfer whose state is transactional-state(txn), as proton's
    ``Transaction.send`` makes it."""
    dlv = link.delivery(f"tx-{body}")
    link.send(Message(body=body).encode())
    link.advance()
    dlv.local.data = [txn]
    dlv.update(TRANSACTIONAL)
    app.net.pump()
    return dlv


def accept_in(app: AmqpPeer, dlv: Delivery, txn: bytes, state: int = ACCEPTED) -> None:
    """transactional-state(txn, outcome) on a received delivery, unsettled, as
    proton's ``Transaction.accept``."""
    dlv.local.data = [txn, Described(ulong(state), [])]
    dlv.update(TRANSACTIONAL)
    app.net.pump()


def test_the_coordinator_attaches_with_local_transactions_only() -> None:
    """A coordinator target asking for local transactions attaches, and the answer
    says so; one asking only for distributed ones is refused with
    amqp:not-implemented and the connection carries on."""
    net = Net()
    app = net.amqp()
    ctrl = coordinator(app)
    assert ctrl.remote_condition is None
    assert ctrl.remote_target.type == Terminus.COORDINATOR
    caps = ctrl.remote_target.capabilities
    caps.rewind()
    caps.next()
    assert "amqp:local-transactions" in [str(c) for c in caps.get_object().elements]
    other = coordinator(app, "amqp:distributed-transactions")
    assert other.remote_condition is not None
    assert other.remote_condition.name == "amqp:not-implemented"
    assert declare(app, ctrl)


def test_transfers_are_routed_at_commit_and_answered_transactionally() -> None:
    """Transfers under a transaction are answered with transactional-state(Accepted),
    reach no subscriber before the discharge, and all of them after it commits."""
    net = Net()
    app = net.amqp()
    sub = net.mqtt("watch")
    assert sub.subscribe(("tx/t", 1)) == (1,)
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("tx/t")
    sent = [send_in(app, snd, txn, f"m{i}") for i in range(3)]
    for dlv in sent:
        assert dlv.remote_state == TRANSACTIONAL
        assert bytes(dlv.remote.data[0]) == txn
        assert int(dlv.remote.data[1].descriptor) == ACCEPTED
    assert sub.publishes() == []
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert [p.payload for p in sub.publishes()] == [b"m0", b"m1", b"m2"]
    assert net.broker.transactions.committed == 1


def test_rollback_routes_nothing() -> None:
    """A discharge with fail=true is accepted and nothing of the transaction is routed."""
    net = Net()
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/r", 1))
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("tx/r")
    send_in(app, snd, txn, "gone")
    assert outcome(discharge(app, ctrl, txn, fail=True)) == (ACCEPTED, None)
    assert sub.publishes() == []
    assert net.broker.transactions.rolled_back == 1


def test_unknown_ids_are_refused_with_the_spec_condition() -> None:
    """A discharge or a transfer naming a transaction that does not exist (or was
    discharged) is Rejected with amqp:transaction:unknown-id."""
    net = Net()
    app = net.amqp()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    assert outcome(discharge(app, ctrl, b"nope")) == (REJECTED, "amqp:transaction:unknown-id")
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert outcome(discharge(app, ctrl, txn)) == (REJECTED, "amqp:transaction:unknown-id")
    snd = app.sender("tx/u")
    assert outcome(send_in(app, snd, txn, "late")) == (REJECTED,
                                                       "amqp:transaction:unknown-id")


def test_open_transactions_are_bounded_per_connection() -> None:
    """Past --max-transactions-per-connection a declare is Rejected with
    amqp:resource-limit-exceeded; another connection may still declare."""
    net = Net(max_transactions_per_connection=1)
    app = net.amqp()
    ctrl = coordinator(app)
    declare(app, ctrl)
    dlv = app.send(ctrl, Message(body=Described(symbol("amqp:declare:list"), [None])))
    assert outcome(dlv) == (REJECTED, "amqp:resource-limit-exceeded")
    other = net.amqp()
    assert declare(other, coordinator(other))


def test_work_over_the_byte_bound_dooms_the_transaction() -> None:
    """A transfer past --max-transaction-bytes is Rejected; the discharge then fails
    with amqp:transaction:rollback and nothing is routed."""
    net = Net(max_transaction_bytes=300)
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/b", 1))
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("tx/b")
    assert send_in(app, snd, txn, "small").remote_state == TRANSACTIONAL
    assert outcome(send_in(app, snd, txn, "x" * 400)) == (
        REJECTED, "amqp:resource-limit-exceeded")
    assert outcome(discharge(app, ctrl, txn)) == (REJECTED, "amqp:transaction:rollback")
    assert sub.publishes() == []


def test_the_discharge_is_answered_after_the_commit_is_durable() -> None:
    """The commit's Accepted waits for the store: nothing is answered while the one
    submission holding the transaction is not durable."""
    store = ManualStore()
    net = Net(store=store)
    app = net.amqp()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("$queue/durable")
    store.commit_all()
    send_in(app, snd, txn, "a")
    send_in(app, snd, txn, "b")
    assert not store.pending
    dlv = discharge(app, ctrl, txn)
    assert dlv.remote_state == 0 and len(store.pending) == 1
    store.commit_next()
    net.pump()
    assert outcome(dlv) == (ACCEPTED, None)


def _queue_with(net: Net, app: AmqpPeer, name: str, bodies: list[str]) -> Any:
    snd = app.sender(f"$queue/{name}")
    for body in bodies:
        assert outcome(app.send(snd, Message(body=body)))[0] == ACCEPTED
    return app.receiver(f"$queue/{name}", credit=len(bodies))


def _group(net: Net, name: str) -> Any:
    return next(iter(net.broker.queues.queues[name].groups.values()))


def test_queue_outcomes_apply_at_commit() -> None:
    """Accepted under a transaction keeps a queue's deliveries pending until the
    discharge; the commit acknowledges them."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    rcv = _queue_with(net, app, "jobs", ["a", "b"])
    got = rcv.new()
    assert [m.body for m, _ in got] == ["a", "b"]
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    for _, dlv in got:
        accept_in(app, dlv, txn)
    group = _group(net, "jobs")
    assert len(group.pending) == 2 and group.acked == 0
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert len(group.pending) == 0 and group.acked == 2
    assert all(dlv.settled for _, dlv in got)   # (settled by the broker)


def test_a_rollback_releases_queue_deliveries() -> None:
    """Rolled back, a transaction's accepted deliveries go back to the queue and are
    delivered again."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    rcv = _queue_with(net, app, "again", ["a"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    assert outcome(discharge(app, ctrl, txn, fail=True)) == (ACCEPTED, None)
    rcv.link.flow(1)
    net.pump()
    assert [m.body for m, _ in rcv.new()] == ["a"]
    assert _group(net, "again").acked == 0


def test_topic_receiver_outcomes_apply_at_commit() -> None:
    """On a topic receiver (QoS 1 deliveries) a transactional Accepted finishes the
    delivery at commit: until then it stays in flight."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("tx/topic", credit=5)
    pub = app.sender("tx/topic")
    app.send(pub, Message(body="one"))
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    session = next(iter(net.broker.link_subscribers.values()))
    assert len(session.inflight) == 1
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert len(session.inflight) == 0


def _settled_in_txn_without_outcome(net: Net, app: AmqpPeer, address: str) -> Any:
    """A topic receiver's QoS 1 delivery settled with transactional-state and no
    outcome; returns (receiver, coordinator, txn-id)."""
    rcv = app.receiver(address, credit=5)
    net.mqtt(f"{address}-pub").publish(address, b"x", qos=1)
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    dlv.local.data = [txn]          # transactional-state, no outcome
    dlv.update(TRANSACTIONAL)
    dlv.settle()
    net.pump()
    return rcv, ctrl, txn


def test_settled_in_a_transaction_without_an_outcome_is_consumed_at_commit() -> None:
    """A delivery settled with transactional-state and no outcome (none can come)
    takes the link's default outcome at commit: consumed on a topic receiver, its
    in-flight slot freed, not sent again."""
    net = Net()
    app = net.amqp()
    rcv, ctrl, txn = _settled_in_txn_without_outcome(net, app, "txo/t")
    session = next(iter(net.broker.link_subscribers.values()))
    assert len(session.inflight) == 1          # held by the transaction until then
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert len(session.inflight) == 0
    assert rcv.new() == []
    assert net.broker.stats.settled_without_outcome == 1


def test_settled_in_a_transaction_without_an_outcome_is_released_at_rollback() -> None:
    """The same delivery rolled back is released: sent again, unchanged."""
    net = Net()
    app = net.amqp()
    rcv, ctrl, txn = _settled_in_txn_without_outcome(net, app, "txr/t")
    assert outcome(discharge(app, ctrl, txn, fail=True)) == (ACCEPTED, None)
    [(again, _)] = rcv.new()
    assert (bytes(again.body), again.delivery_count) == (b"x", 0)


def test_the_coordinator_link_ending_rolls_back_its_transactions() -> None:
    """Detaching the coordinator rolls back its open transactions: the held publish
    is never routed, the held acknowledgement is released."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/d", 1))
    rcv = _queue_with(net, app, "held", ["h"])
    [(_, got)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    send_in(app, app.sender("tx/d"), txn, "never")
    accept_in(app, got, txn)
    ctrl.close()
    net.pump()
    assert sub.publishes() == []
    assert net.broker.transactions.rolled_back == 1
    assert _group(net, "held").acked == 0
    rcv.link.flow(1)
    net.pump()
    assert [m.body for m, _ in rcv.new()] == ["h"]


def test_the_connection_ending_rolls_back_its_transactions() -> None:
    """A connection lost with an open transaction rolls it back; nothing is routed."""
    net = Net()
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/k", 1))
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    send_in(app, app.sender("tx/k"), txn, "never")
    app.kill()
    assert sub.publishes() == []
    txs = net.broker.transactions
    assert (txs.rolled_back, txs.open_count) == (1, 0)


def test_a_cause_repeated_is_logged_once_and_every_refusal_answered() -> None:
    """Transfers naming an unknown transaction, in a loop: each is Rejected with
    amqp:transaction:unknown-id, and the log has one line for the cause."""
    from twisted.logger import formatEvent, globalLogPublisher

    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        net = Net()
        app = net.amqp()
        coordinator(app)
        snd = app.sender("tx/loop")
        answers = [outcome(send_in(app, snd, b"no-such-%d" % i, f"m{i}")) for i in range(20)]
    finally:
        globalLogPublisher.removeObserver(observe)
    assert answers == [(REJECTED, "amqp:transaction:unknown-id")] * 20
    assert len([line for line in lines if "unknown transaction" in line]) == 1


def test_a_connection_lost_while_its_commit_is_stored_is_no_harm() -> None:
    """The connection dies between the discharge and its durable commit: the commit
    completes (all of it stored, counted) and answering nobody raises nothing."""
    store = ManualStore()
    net = Net(store=store)
    app = net.amqp()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("$queue/lost")
    store.commit_all()
    send_in(app, snd, txn, "kept")
    discharge(app, ctrl, txn)
    assert len(store.pending) == 1
    app.kill()
    store.commit_all()
    net.pump()
    assert net.broker.transactions.committed == 1
    assert any(getattr(op, "queue", None) == "lost" for op in store.submitted)

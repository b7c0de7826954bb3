"""AMQP 1.0 transactions in memory (``amqp_memory.Net``, a ``task.Clock``), the review
of issue #30: an outcome a transaction holds keeps its delivery claimed (no
visibility timeout, no takeover) and a commit whose held outcome is no longer
valid is refused with nothing applied; the byte bound counts all of a message;
a transactional transfer without a coordinator, or on a service link, is refused
and never carried out."""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import ACCEPTED, REJECTED, AmqpPeer, Net, outcome
from amqp_messages import control
from fakes import MemoryStore
from proton import Delivery, Described, Link, Message, ulong
from test_amqp_transactions import TRANSACTIONAL, accept_in, coordinator, declare, discharge

pytestmark = pytest.mark.timeout(120)


def send_in(app: AmqpPeer, link: Link, txn: bytes, message: Message) -> Delivery:
    """``message`` under transactional-state(txn), as proton's ``Transaction.send``."""
    dlv = link.delivery(f"tx-{id(message)}")
    link.send(message.encode())
    link.advance()
    dlv.local.data = [txn]
    dlv.update(TRANSACTIONAL)
    app.net.pump()
    return dlv


def _queue_receiver(app: AmqpPeer, name: str, bodies: list[str]) -> Any:
    snd = app.sender(f"$queue/{name}")
    for body in bodies:
        assert outcome(app.send(snd, Message(body=body)))[0] == ACCEPTED
    return app.receiver(f"$queue/{name}", credit=len(bodies))


def _group(net: Net, name: str) -> Any:
    return next(iter(net.broker.queues.queues[name].groups.values()))


def test_a_held_delivery_is_neither_timed_out_nor_taken_over() -> None:
    """A delivery accepted under an open transaction stays with its receiver past the
    visibility timeout, an idle receiver waiting; the commit acknowledges it."""
    net = Net(store=MemoryStore(), queue_visibility_timeout=4.0)
    app = net.amqp()
    rcv = _queue_receiver(app, "tk", ["job"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    other = net.amqp()
    idle = other.receiver("$queue/tk", credit=5)
    net.advance(12)
    assert idle.new() == []
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    group = _group(net, "tk")
    assert group.acked == 1 and not group.pending
    net.advance(12)
    assert idle.new() == []


def test_a_rollback_releases_the_held_delivery_to_others() -> None:
    """Once its transaction rolled back, a held delivery is released (visible
    again, no longer exempt): another receiver gets it."""
    net = Net(store=MemoryStore(), queue_visibility_timeout=4.0)
    app = net.amqp()
    rcv = _queue_receiver(app, "rb", ["job"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    assert outcome(discharge(app, ctrl, txn, fail=True)) == (ACCEPTED, None)
    other = net.amqp()
    idle = other.receiver("$queue/rb", credit=5)
    net.advance(1)
    assert [m.body for m, _ in idle.new()] == ["job"]


def test_a_queue_delivery_stays_claimed_after_its_link_ends() -> None:
    """The receiving link detaches before the discharge: the accepted delivery is
    not given back; the commit acknowledges it (Accepted) and routes the held
    publish, and the queue holds nothing more."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/out", 1))
    rcv = _queue_receiver(app, "dq", ["job"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    pub = app.sender("tx/out")
    assert send_in(app, pub, txn, Message(body="result")).remote_state == TRANSACTIONAL
    rcv.link.close()
    net.pump()
    other = net.amqp().receiver("$queue/dq", credit=5)
    assert other.new() == []
    assert outcome(discharge(app, ctrl, txn)) == (ACCEPTED, None)
    assert [p.payload for p in sub.publishes()] == [b"result"]
    group = _group(net, "dq")
    assert group.acked == 1 and not group.pending
    assert other.new() == []


def test_a_kept_delivery_goes_back_when_its_transaction_rolls_back() -> None:
    """A delivery kept claimed after its link ended is visible again once its
    transaction rolls back (the coordinator's detach)."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    rcv = _queue_receiver(app, "kb", ["job"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    rcv.link.close()
    net.pump()
    other = net.amqp().receiver("$queue/kb", credit=5)
    assert other.new() == []
    ctrl.close()
    net.pump()
    assert [m.body for m, _ in other.new()] == ["job"]
    assert _group(net, "kb").acked == 0


def test_a_commit_whose_held_outcome_is_void_applies_nothing() -> None:
    """A topic receiver's delivery accepted under a transaction goes with its link:
    the commit is refused (amqp:transaction:rollback, saying why) before any of
    its work runs: its held publish reaches nobody."""
    net = Net()
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/out", 1))
    rcv = app.receiver("tx/in", credit=5)
    app.send(app.sender("tx/in"), Message(body="one"))
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    accept_in(app, dlv, txn)
    pub = app.sender("tx/out")
    assert send_in(app, pub, txn, Message(body="result")).remote_state == TRANSACTIONAL
    rcv.link.close()
    net.pump()
    done = discharge(app, ctrl, txn)
    assert outcome(done) == (REJECTED, "amqp:transaction:rollback")
    assert "no longer held" in done.remote.condition.description
    assert sub.publishes() == []
    assert net.broker.transactions.failed == 1


def test_the_byte_bound_counts_properties_and_the_native_form() -> None:
    """A tiny body with large application properties counts all of its bytes
    against --max-transaction-bytes: the second such transfer is Rejected."""
    net = Net(max_transaction_bytes=3000)
    app = net.amqp()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("tx/big")
    heavy = Message(body="s", properties={"p": "y" * 2000})
    assert send_in(app, snd, txn, heavy).remote_state == TRANSACTIONAL
    assert outcome(send_in(app, snd, txn, heavy)) == (REJECTED,
                                                       "amqp:resource-limit-exceeded")
    assert outcome(discharge(app, ctrl, txn)) == (REJECTED, "amqp:transaction:rollback")


def test_a_transactional_transfer_without_a_coordinator_is_refused() -> None:
    """On a connection that never attached a coordinator a transactional transfer is
    Rejected with amqp:transaction:unknown-id and routed to nobody."""
    net = Net()
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/nc", 1))
    snd = app.sender("tx/nc")
    assert outcome(send_in(app, snd, b"999", Message(body="sneaky"))) == (
        REJECTED, "amqp:transaction:unknown-id")
    assert sub.publishes() == []


def test_service_links_refuse_transactional_transfers() -> None:
    """A request to the subscription service under a (declared) transaction is
    Rejected with amqp:not-implemented and not carried out."""
    net = Net()
    fe = net.fe("dev-1")
    ctrl = coordinator(fe.peer)
    txn = declare(fe.peer, ctrl)
    request = control("subscribe", "dev-1", body={"svc/t": 1})
    dlv = send_in(fe.peer, fe.ss, txn, request)
    assert outcome(dlv) == (REJECTED, "amqp:not-implemented")
    assert fe.list() == {}
    assert outcome(discharge(fe.peer, ctrl, txn)) == (ACCEPTED, None)
    assert fe.list() == {}


def _full_queue(net: Net, name: str, count: int) -> None:
    """Queue ``name`` with x-overflow reject-publish at ``count`` messages."""
    queue, _ = net.broker.queues.declare(name)
    assert queue is not None
    queue.reject_above = (count, None)


def test_a_queue_that_would_refuse_fails_the_commit_with_nothing_applied() -> None:
    """Two held publishes to a queue with room for one (reject-publish): the
    discharge is refused with amqp:transaction:rollback naming the queue, and
    neither they nor the transaction's other publish are applied."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    sub = net.mqtt("watch")
    sub.subscribe(("tx/side", 1))
    _full_queue(net, "full", 1)
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    side = app.sender("tx/side")
    send_in(app, side, txn, Message(body="side"))
    snd = app.sender("$queue/full")
    for body in ("fits", "refused"):
        assert send_in(app, snd, txn, Message(body=body)).remote_state == TRANSACTIONAL
    done = discharge(app, ctrl, txn)
    assert outcome(done) == (REJECTED, "amqp:transaction:rollback")
    assert "reject-publish" in done.remote.condition.description
    assert sub.publishes() == []
    assert not net.broker.queues.queues["full"].log


def test_a_refusal_the_check_missed_is_partially_applied_not_rollback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a publish be refused once the commit's work runs (here the room
    check is made to miss it), the discharge is Rejected with amqp:internal-error
    "partially applied", never amqp:transaction:rollback."""
    net = Net(store=MemoryStore())
    app = net.amqp()
    _full_queue(net, "full2", 1)
    monkeypatch.setattr(net.broker.queues, "room_problem", lambda *a: None)
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("$queue/full2")
    for body in ("fits", "refused"):
        send_in(app, snd, txn, Message(body=body))
    done = discharge(app, ctrl, txn)
    assert outcome(done) == (REJECTED, "amqp:internal-error")
    assert "partially applied" in done.remote.condition.description
    assert len(net.broker.queues.queues["full2"].log) == 1


@pytest.mark.parametrize("with_outcome", [True, False], ids=["accepted", "no-outcome"])
def test_a_settled_delivery_a_doomed_transaction_refuses_is_released(
        with_outcome: bool) -> None:
    """A queue delivery settled under transactional-state of a transaction that can
    only roll back is released at once (another receiver gets it), not put back to
    await an outcome its settled delivery can never bring."""
    net = Net(store=MemoryStore(), max_transaction_bytes=3000)
    app = net.amqp()
    rcv = _queue_receiver(app, "dm", ["job"])
    [(_, dlv)] = rcv.new()
    ctrl = coordinator(app)
    txn = declare(app, ctrl)
    snd = app.sender("tx/doom")
    heavy = Message(body="s", properties={"p": "y" * 2000})
    assert send_in(app, snd, txn, heavy).remote_state == TRANSACTIONAL
    assert outcome(send_in(app, snd, txn, heavy))[0] == REJECTED   # (now doomed)
    dlv.local.data = [txn, Described(ulong(ACCEPTED), [])] if with_outcome else [txn]
    dlv.update(TRANSACTIONAL)
    dlv.settle()
    net.pump()
    other = net.amqp()
    idle = other.receiver("$queue/dm", credit=5)
    net.pump()
    assert [m.body for m, _ in idle.new()] == ["job"]
    group = _group(net, "dm")
    assert group.acked == 0

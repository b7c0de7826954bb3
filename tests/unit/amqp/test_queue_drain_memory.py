"""A drain on a queue receiver whose deliveries wait for storage, in memory (a
``ManualStore`` whose commits the test fires, the ``Clock`` moved by hand): the
drain is answered after the queue's messages once the commit is done, and after at
most ``_DRAIN_WAIT_MAX`` if it never is."""

from __future__ import annotations

from amqp_memory import Net
from fakes import ManualStore
from proton import Message

from mqttamqp.amqp.queuelinks import _DRAIN_WAIT_MAX


def _queue_of_two() -> tuple[Net, ManualStore]:
    store = ManualStore()
    net = Net(store)
    app = net.amqp()
    snd = app.sender("$queue/jobs/k")
    for body in (b"a", b"b"):
        app.send(snd, Message(body=body))
    net.pump()
    store.commit_all()
    net.pump()
    return net, store


def test_a_drain_waits_for_the_watermark_commit_then_sends_and_drains() -> None:
    """A new group's first deliveries wait for its watermark's commit: the drain is
    not answered before it; once it is done, both messages, then credit 0."""
    net, store = _queue_of_two()
    app = net.amqp()
    rcv = app.receiver("$queue/jobs", credit=0)
    rcv.link.drain(5)
    net.pump()
    assert rcv.new() == [] and rcv.link.credit == 5     # (waiting, not drained)
    store.commit_all()
    net.advance(0.1, step=0.01)
    assert [bytes(m.body) for m, _ in rcv.new()] == [b"a", b"b"]
    assert rcv.link.credit == 0


def test_a_drain_waits_no_longer_than_its_bound() -> None:
    """A commit that never comes: the drain is answered (nothing sent, credit 0)
    after the bound, not before."""
    net, _store = _queue_of_two()
    app = net.amqp()
    rcv = app.receiver("$queue/jobs", credit=0)
    rcv.link.drain(5)
    net.advance(_DRAIN_WAIT_MAX - 0.5, step=0.25)
    assert rcv.link.credit == 5
    net.advance(1.0, step=0.25)
    assert rcv.new() == [] and rcv.link.credit == 0

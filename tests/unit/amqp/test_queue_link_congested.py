"""A durable queue's AMQP link is congested with no credit or a full socket, in both
builds, whoever reads it: the queue's dispatch by name, ``Session.deliver`` and
``InflightWindow.pump`` (session 24's review: in the compiled build of 70bb1f1e both
tests failed; before session 24 the second did)."""
from __future__ import annotations

from amqp_memory import Net
from fakes import MemoryStore
from proton import Message as PMessage

from mqttamqp.amqp.queuelinks import QueueSubscription
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.net.rawproton import link_credit


def _queue_link(net: Net, credit: int) -> tuple[object, QueueSubscription]:
    app = net.amqp()
    snd = app.sender("$queue/q")
    app.receiver("$queue/q", credit=credit)
    net.pump()
    sessions = list(net.broker.link_subscribers.values())
    [link] = [s.link for s in sessions if isinstance(s.link, QueueSubscription)]
    return (app, snd), link


def test_a_queue_link_without_credit_gets_nothing_more_from_its_session() -> None:
    net = Net(store=MemoryStore())
    (app, snd), link = _queue_link(net, credit=1)
    app.send(snd, PMessage(body="first"))
    net.pump()
    session = link.session
    assert link_credit(link.impl) == 0 and link.congested
    # (a message with properties takes the session's queue, then ``pump``)
    session.deliver(Message("$queue/q", b"x", 1, False, "p", 0.0,
                            props=MessageProperties(payload_format=1)), 1, False)
    assert len(session.queue) == 1 and len(session.inflight) == 1
    assert link.plink.queued == 0


def test_a_queue_link_with_a_full_socket_is_congested() -> None:
    net = Net(store=MemoryStore())
    _, link = _queue_link(net, credit=10)
    link.host.write_blocked = True
    link.on_blocked()
    assert link.congested

"""Queue links of the AMQP adapter in memory (``amqp_memory.Net``, a ``task.Clock``): the
queue capability on a plain address, address patterns, attach properties (group, mode,
stream offset), presettled receivers, a detached member's unsettled messages."""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import ACCEPTED as MEM_ACCEPTED
from amqp_memory import REJECTED as MEM_REJECTED
from amqp_memory import Net, Receiver, outcome
from amqp_messages import meta
from fakes import MemoryStore
from proton import Data, Link, Message, symbol

pytestmark = pytest.mark.timeout(120)



def _net() -> Net:
    return Net(store=MemoryStore(), amqp_queues=("orders*",))


def _capability_link(peer: Any, address: str, sender: bool) -> Any:
    link = peer.session.sender(f"s-{address}") if sender else \
        peer.session.receiver(f"r-{address}")
    terminus = link.target if sender else link.source
    terminus.address = address
    caps = terminus.capabilities
    caps.put_array(False, Data.SYMBOL)
    caps.enter()
    caps.put_symbol(symbol("queue"))
    caps.exit()
    return link


def test_queue_capability_makes_a_plain_address_a_queue() -> None:
    """A plain address with the queue capability is a queue, for senders and receivers."""
    net = _net()
    app = net.amqp()
    snd = _capability_link(app, "jobs", sender=True)
    snd.open()
    net.pump()
    assert outcome(app.send(snd, Message(body="j"))) == (MEM_ACCEPTED, None)
    link = _capability_link(app, "jobs", sender=False)
    link.open()
    link.flow(1)
    rcv = Receiver(link)
    app.receivers.append(rcv)
    net.pump()
    [(msg, _)] = rcv.new()
    assert meta(msg)["x-opt-message-id"] == "jobs:0" and msg.body == "j"


def test_amqp_queue_patterns_match_level_by_level() -> None:
    """--amqp-queue patterns match addresses level by level, never $SYS."""
    from mqttamqp.amqp.addresses import matches_queue_pattern, queue_topic
    assert matches_queue_pattern("orders", "*")
    assert not matches_queue_pattern("a/b", "*")
    assert matches_queue_pattern("a/b", "a/*")
    assert queue_topic("orders-eu", False, ("orders*",)) == "$queue/orders-eu"
    assert queue_topic("$SYS/x", True, ("*",)) is None


def test_bad_attach_properties_refuse_the_link_only() -> None:
    """A bad consumer-mode attach property refuses that link with amqp:invalid-field; the
    connection goes on."""
    net = _net()
    app = net.amqp()
    link = app.session.receiver("bad-mode")
    link.source.address = "$queue/q1"
    link.properties = {symbol("consumer-mode"): "sideways"}
    link.open()
    net.pump()
    assert link.remote_condition is not None
    assert link.remote_condition.name == "amqp:invalid-field"
    assert "consumer-mode" in link.remote_condition.description
    snd = app.sender("orders-x")     # the connection goes on
    assert outcome(app.send(snd, Message(body="o"))) == (MEM_ACCEPTED, None)


def test_sender_properties_keep_their_types_and_values() -> None:
    """An AMQP sender's own application properties keep their types and values, also
    under the names of the queue's metadata (which is in the annotations)."""
    net = _net()
    app = net.amqp()
    snd = app.sender("$queue/typed")
    app.send(snd, Message(body=b"\x00", properties={"n": 7, "queue": "fake"}))
    rcv = app.receiver("$queue/typed", credit=1)
    [(msg, _)] = rcv.new()
    assert msg.properties == {"n": 7, "queue": "fake"}
    assert meta(msg)["x-opt-queue"] == "typed"
    assert outcome(app.send(app.sender("$queue/typed/$nack"), Message(body="x")))[0] \
        == MEM_REJECTED


def test_presettled_receiver_is_acknowledged_on_send() -> None:
    """snd-settle-mode settled: QoS 0, acknowledged as it is sent (at most once)."""
    net = _net()
    app = net.amqp()
    snd = app.sender("$queue/fast")
    for body in ("a", "b"):
        app.send(snd, Message(body=body))
    rcv = app.receiver("$queue/fast", credit=1, snd_settle_mode=Link.SND_SETTLED)
    [(msg, dlv)] = rcv.new()
    assert msg.body == "a" and dlv.settled
    view = {v.name: v for v in net.broker.queues.views()}["fast"]
    assert view.acknowledged == 1


def test_stream_reader_from_attach_properties() -> None:
    """consumer-mode stream with stream-offset: reads from that offset, claiming
    nothing (a classic group still gets every message)."""
    net = _net()
    app = net.amqp()
    snd = app.sender("$queue/log")
    for i in range(3):
        app.send(snd, Message(body=f"e{i}"))
    link = app.session.receiver("reader")
    link.source.address = "$queue/log"
    link.properties = {symbol("consumer-group"): "audit", symbol("consumer-mode"): "stream",
                       symbol("stream-offset"): "1"}
    link.open()
    link.flow(10)
    reader = Receiver(link)
    app.receivers.append(reader)
    net.pump()
    assert [m.body for m, _ in reader.new()] == ["e1", "e2"]
    classic = app.receiver("$queue/log", credit=10)
    assert [m.body for m, _ in classic.new()] == ["e0", "e1", "e2"]


def test_a_detached_member_gives_its_unsettled_messages_back() -> None:
    """A member's link that detaches gives its unsettled messages to the next member,
    counted as a redelivery."""
    net = _net()
    app = net.amqp()
    snd = app.sender("$queue/back")
    app.send(snd, Message(body="m"))
    first = app.receiver("$queue/back", credit=5)
    assert [m.body for m, _ in first.new()] == ["m"]
    second = app.receiver("$queue/back", credit=5)
    assert second.new() == []
    first.link.close()
    net.pump()
    [(msg, _)] = second.new()
    assert msg.body == "m" and msg.delivery_count == 1 and msg.first_acquirer is False


def test_joining_a_group_in_another_mode_refuses_the_link() -> None:
    """A link that would join a group in another mode is refused with the reason."""
    net = _net()
    app = net.amqp()
    app.receiver("$queue/mixed", credit=1)
    link = app.session.receiver("streamer")
    link.source.address = "$queue/mixed"
    link.properties = {symbol("consumer-mode"): "stream"}
    link.open()
    net.pump()
    assert link.remote_condition is not None
    assert "could not join group 'mixed'" in link.remote_condition.description

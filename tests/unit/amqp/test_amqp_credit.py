"""The credit a topic sender gets (issue 15, AMQP): a window of 100, topped up in
steps of half of it as deliveries are answered, and given back at once when the
peer is out of credit.  The broker keeps what it still owes the peer without
reading the engine's credit on every answer; these tests pin that the flows it
sends are the ones the window rule gives, also when transfers are aborted (they
take credit and are never answered).  A receiver's credit is counted by the broker
too (proton is asked only when that count runs out): what waits past it is bounded
alike however the credit ended.

In memory, black box: a proton client engine on ``amqp_memory.Net``; what is
observed is the credit the client's engine holds after each exchange.
"""

from __future__ import annotations

import struct

from amqp_memory import ACCEPTED, AmqpPeer, Net, outcome
from amqp_messages import drain as engine_output
from proton import Data, Link, Message

WINDOW = 100


def sender(net: Net) -> tuple[AmqpPeer, Link]:
    peer = net.amqp("credit-sender")
    link = peer.sender("credit/t")
    assert link.credit == WINDOW
    return peer, link


def send(peer: AmqpPeer, link: Link, n: int) -> None:
    for _ in range(n):
        dlv = peer.send(link, Message(body=b"x"))   # unsettled, not durable: Accepted at once
        assert outcome(dlv) == (ACCEPTED, None)


def abort(peer: AmqpPeer, link: Link, n: int) -> None:
    for i in range(n):
        dlv = link.delivery(f"a{i}")
        link.send(b"\x00Su\xa0")   # the start of a message, on the wire ...
        peer.net.pump()
        dlv.abort()                 # ... and never finished
        peer.net.pump()


def test_credit_comes_back_in_steps_of_half_the_window() -> None:
    """A topic sender's credit is topped up to the window once half of it is answered,
    never beyond."""
    net = Net()
    peer, link = sender(net)
    send(peer, link, WINDOW // 2 - 1)
    assert link.credit == WINDOW // 2 + 1      # not yet: fewer than half answered
    send(peer, link, 1)
    assert link.credit == WINDOW               # half answered: topped up to the window
    send(peer, link, 3 * WINDOW + 7)           # and so on, never more than the window
    assert WINDOW // 2 < link.credit <= WINDOW


def test_aborted_transfers_use_credit_and_are_topped_up_like_answers() -> None:
    """Aborted transfers use credit and are topped up as answered ones are."""
    net = Net()
    peer, link = sender(net)
    abort(peer, link, WINDOW // 2 - 1)
    assert link.credit == WINDOW // 2 + 1      # fewer than half: no flow yet
    abort(peer, link, 11)                      # the 50th: a refill's worth owed
    assert link.credit == WINDOW - 10
    send(peer, link, 1)
    assert link.credit == WINDOW - 11


def test_a_sender_whose_last_transfers_are_aborted_keeps_credit() -> None:
    """Before, an abort was owed back but never topped up: a sender that aborted its
    whole window was left with no credit and nothing to answer."""
    net = Net()
    peer, link = sender(net)
    abort(peer, link, WINDOW)                  # topped up at the 50th and the 100th
    assert link.credit == WINDOW
    abort(peer, link, WINDOW - 10)
    assert link.credit == WINDOW - 40          # topped up at the 50th, 40 since
    send(peer, link, 9)                        # answers count on from there: 49 owed
    assert link.credit == WINDOW - 49
    send(peer, link, 1)
    assert link.credit == WINDOW



def _publish(net: Net, n: int) -> None:
    from mqttamqp.core.message import Message as CoreMessage

    for i in range(n):
        net.broker.publish(CoreMessage("credit/q", b"x" * 100, 0, False, f"c{i}"))
    net.pump()


def test_a_receivers_credit_used_up_or_drained_bounds_what_waits_alike() -> None:
    """QoS 0 messages past a receiver's credit wait up to the same bound whether its
    credit ran out by transfers or was given back by a drain (the broker's own count
    of the credit follows both)."""
    waited = []
    for drain in (False, True):
        net = Net(congested_qos0_bytes=1000)
        peer = net.amqp(f"credit-rx-{drain}")
        receiver = peer.receiver("credit/q", credit=0)
        if drain:
            receiver.link.drain(5)     # answered at once: nothing to send, credit 0
            net.pump()
        else:
            receiver.link.flow(5)
            net.pump()
            _publish(net, 5)           # uses the 5 credits up
        assert receiver.link.credit == 0
        receiver.new()
        _publish(net, 40)              # past the credit: some wait, the rest dropped
        receiver.link.flow(40)
        net.pump()
        waited.append(len(receiver.new()))
        assert net.broker.registry.drops.dropped_total() > 0
    assert waited[0] == waited[1] and 0 < waited[0] < 40


def _flow_frame(handle: int, delivery_count: int, credit: int, next_outgoing: int) -> bytes:
    """A flow frame (AMQP 1.0 §2.7.4) on channel 0 setting a link's credit, as a peer
    that lowers it would send; proton's client API only adds credit."""
    body = Data()
    body.put_described()
    body.enter()
    body.put_ulong(0x13)          # flow
    body.put_list()
    body.enter()
    body.put_null()               # next-incoming-id (the window below is absolute)
    body.put_uint(2**31 - 1)      # incoming-window
    body.put_uint(next_outgoing)  # next-outgoing-id
    body.put_uint(2**31 - 1)      # outgoing-window
    body.put_uint(handle)
    body.put_uint(delivery_count)
    body.put_uint(credit)
    body.exit()
    body.exit()
    encoded = body.encode()
    return struct.pack(">IBBH", 8 + len(encoded), 2, 0, 0) + encoded


def test_credit_lowered_in_the_read_that_brings_messages_bounds_what_waits() -> None:
    """One read with this connection's QoS 0 publishes to its own receiver and then a
    flow that takes that receiver's credit away: proton's count drops during the read,
    before the messages are routed, and what waits past it is bounded all the same
    (the broker's own count of the credit is not trusted across new input)."""
    net = Net(congested_qos0_bytes=1000)
    peer = net.amqp("credit-lowered")
    receiver = peer.receiver("credit/low", credit=5)    # handle 0: the first link
    link = peer.sender("credit/low")
    assert receiver.link.credit == 5
    for i in range(4):                                   # four 600-byte QoS 0 messages
        dlv = link.delivery(f"low{i}")
        link.send(Message(body=b"x" * 600).encode())
        link.advance()
        dlv.settle()
    read = engine_output(peer.transport) + _flow_frame(0, 0, 0, 4)
    dropped = net.broker.registry.drops.dropped_total()
    peer.server.dataReceived(read)                       # one socket read
    net.pump()
    # Past the credit: the first two wait (up to the 1000-byte bound), two dropped.
    assert net.broker.registry.drops.dropped_total() - dropped == 2
    assert receiver.new() == []


def test_a_service_links_window_is_its_own() -> None:
    """The service links' credit window (``services._ServiceLink.max_window``, 20) is
    honoured in the compiled build too, where a native class's plain attribute would
    be read from the instance and the interpreted subclass's value never seen."""
    net = Net()
    peer = net.amqp("svc")
    assert peer.sender("$mqtt.subscriptionservice").credit == 20
    assert peer.sender("$mqtt.willservice").credit == 20
    assert peer.sender("credit/t").credit == WINDOW

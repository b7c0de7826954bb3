"""The AMQP header and annotations a queue or topic receiver gets, in memory
(``amqp_memory.Net``): first-acquirer and delivery-count across redeliveries, members
leaving, stream reads, dead-letter metadata, and messages stored before priority was kept."""

from __future__ import annotations

import pytest
from amqp_memory import RELEASED, Net, Receiver
from fakes import MemoryStore
from proton import Delivery, Message

pytestmark = pytest.mark.timeout(120)



def _queue_net() -> Net:
    return Net(store=MemoryStore())


def test_queue_first_acquirer_and_delivery_count_across_redeliveries() -> None:
    """A queue's first delivery: first-acquirer true, delivery-count 0; after a
    Released (not counted) first-acquirer is false and the count still 0; after a
    Modified(delivery-failed) it is false and the count 1."""
    net = _queue_net()
    app = net.amqp()
    snd = app.sender("$queue/fa")
    sent = Message(id=3, body="x", priority=6)
    sent.first_acquirer = True
    app.send(snd, sent)
    rcv = app.receiver("$queue/fa", credit=1)
    seen = []
    for state, failed in ((RELEASED, False), (Delivery.MODIFIED, True), (None, False)):
        [(msg, dlv)] = rcv.new()
        seen.append((msg.first_acquirer, msg.delivery_count, msg.id, msg.priority))
        if state is None:
            break
        dlv.local.failed = failed
        dlv.update(state)
        dlv.settle()
        rcv.link.flow(1)
        net.pump()
    assert seen == [(True, 0, 3, 6), (False, 0, 3, 6), (False, 1, 3, 6)]


def test_queue_member_leaving_makes_the_next_delivery_not_first() -> None:
    """A message given back by a member that left goes to the next member with
    first-acquirer false and its delivery counted."""
    net = _queue_net()
    app = net.amqp()
    app.send(app.sender("$queue/back"), Message(body="m"))
    first = app.receiver("$queue/back", credit=5)
    [(msg, _)] = first.new()
    assert msg.first_acquirer is True
    second = app.receiver("$queue/back", credit=5)
    first.link.close()
    net.pump()
    [(msg, _)] = second.new()
    assert (msg.first_acquirer, msg.delivery_count) == (False, 1)


def test_a_stream_read_is_never_first_acquirer() -> None:
    """A stream group reads without claiming (every reader of the stream gets the
    message): first-acquirer false, while a classic group's first delivery of the
    same message is true."""
    from proton import symbol

    net = _queue_net()
    app = net.amqp()
    app.send(app.sender("$queue/log"), Message(body="e0"))
    link = app.session.receiver("reader")
    link.source.address = "$queue/log"
    link.properties = {symbol("consumer-group"): "audit", symbol("consumer-mode"): "stream"}
    link.open()
    link.flow(1)
    reader = Receiver(link)
    app.receivers.append(reader)
    net.pump()
    [(read, _)] = reader.new()
    [(claimed, _)] = app.receiver("$queue/log", credit=1).new()
    assert (read.body, read.first_acquirer) == ("e0", False)
    assert (claimed.body, claimed.first_acquirer) == ("e0", True)


def test_topic_redelivery_is_not_first_acquirer() -> None:
    """On a topic address: the first delivery is first-acquirer true; a Released one
    comes again as sent (delivery-count 0, priority kept) with first-acquirer false."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("fa/t", credit=5)
    app.send(app.sender("fa/t"), Message(body="x", priority=2))
    [(msg, dlv)] = rcv.new()
    assert (msg.first_acquirer, msg.delivery_count, msg.priority) == (True, 0, 2)
    dlv.update(RELEASED)
    dlv.settle()
    net.pump()
    [(msg, _)] = rcv.new()
    assert (msg.first_acquirer, msg.delivery_count, msg.priority) == (False, 0, 2)


def test_dead_letter_metadata_is_in_message_annotations() -> None:
    """A dead letter read from ``$dlq/<name>`` keeps the bare message as sent; why it
    died and where it came from are message annotations."""
    net = _queue_net()
    app = net.amqp()
    app.send(app.sender("$queue/dl/k"), Message(id="order-1", body="x", properties={"a": 1}))
    rcv = app.receiver("$queue/dl", credit=1)
    [(_, dlv)] = rcv.new()
    dlv.local.condition = None
    dlv.update(Delivery.REJECTED)
    dlv.settle()
    net.pump()
    dead = app.receiver("$dlq/dl/#", credit=1)
    [(msg, _)] = dead.new()
    assert (msg.id, msg.address, msg.properties, msg.body) == ("order-1", None, {"a": 1}, "x")
    ann = {str(k): v for k, v in msg.annotations.items()}
    assert {k: ann.get(k) for k in ("x-opt-message-id", "x-opt-queue", "x-opt-origin-queue",
                                     "x-opt-origin-offset", "x-opt-origin-group",
                                     "x-opt-topic")} == {
        "x-opt-message-id": "$dlq/dl:0", "x-opt-queue": "$dlq/dl", "x-opt-origin-queue": "dl",
        "x-opt-origin-offset": 0, "x-opt-origin-group": "dl", "x-opt-topic": "$dlq/dl/k"}
    assert ann["x-opt-reason"]


def test_a_native_message_stored_before_priority_was_kept_still_reads() -> None:
    """Retained and queued records written before this change hold a native form
    starting with a bare durable byte (0 or 1): it still encodes to the message as
    sent, with the default priority."""
    from mqttamqp.amqp.codec.encode import encode_native
    from mqttamqp.amqp.codec.native import native_header
    from mqttamqp.amqp.codec.sections import decode_message

    data = bytes(Message(id=9, body="old", properties={"k": "v"}).encode())
    sections = data[decode_message(data).bare_start:]   # properties onwards
    for flag, durable in ((b"\x01", True), (b"\x00", False)):
        native = flag + sections
        assert native_header(native) == (durable, None, 1)
        got = Message()
        got.decode(encode_native(native, 1, False, 0, "pub", None, True))
        assert (got.id, got.body, got.properties, got.durable, got.priority) == (
            9, "old", {"k": "v"}, durable, 4)

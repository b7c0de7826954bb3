"""The core's side of the gateway contract in memory (``amqp_memory.Net``): what a
publisher's DUP does to a subscriber's delivery, and what a delivery on
``$mqtt.to.<id>.publish`` (or a topic or queue receiver) that the peer settles
without an outcome counts as, and how far it is sent again (issue #29 §1, the core's
findings and their review)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_memory import ACCEPTED, FE, MODIFIED, RELEASED, Net, annotation, publish_message
from proton import Message, int32, ulong

from mqttamqp.mqtt.packets import Puback, Publish

pytestmark = pytest.mark.timeout(120)


def _subscribed_fe(net: Net, client_id: str, topic_filter: str, qos: int = 2) -> FE:
    """An FE for ``client_id``: AMQP_LIST, AMQP_SUBSCRIBE, then ``.publish``."""
    fe = net.fe(client_id)
    fe.list()
    fe.attach_publish()
    dlv = fe.subscribe({topic_filter: int32(qos)})
    assert dlv.remote_state == ACCEPTED
    return fe


def _dup_publish(topic: str, payload: bytes, qos: int) -> Message:
    """AMQP_PUBLISH as an FE sends a PUBLISH that had DUP set (delivery-count 1)."""
    msg = publish_message(topic, payload, qos=qos)
    msg.delivery_count = 1
    return msg


@pytest.mark.parametrize("qos", [1, 2])
def test_a_publishers_dup_is_not_a_redelivery_to_subscribers(qos: int) -> None:
    """A message an FE sends with delivery-count 1 (its client's DUP) reaches a
    ``.publish`` receiver and a topic receiver as a first delivery: delivery-count 0,
    first-acquirer true (MQTT 3.1.1 §3.3.1.1: DUP is not propagated)."""
    net = Net()
    fe = _subscribed_fe(net, "dup-sub", "dup/#")
    app = net.amqp()
    topic_rcv = app.receiver("dup/#")
    publisher = net.fe("dup-pub")
    sender = publisher.peer.sender(None)
    dlv = publisher.peer.send(sender, _dup_publish("dup/t", b"once", qos))
    assert dlv.remote_state == ACCEPTED
    assert fe.publish is not None
    [(got, _)] = fe.publish.new()
    assert (bytes(got.body), got.delivery_count, got.first_acquirer) == (b"once", 0, True)
    assert annotation(got, "x-opt-mqtt-qos") == qos
    [(native, _)] = topic_rcv.new()
    assert (native.delivery_count, native.first_acquirer) == (0, True)


def test_an_mqtt_publishers_dup_is_not_a_redelivery_on_publish() -> None:
    """A PUBLISH with DUP set from an MQTT client reaches an FE's ``.publish`` with
    delivery-count 0 (the FE would otherwise set DUP on a first delivery)."""
    net = Net()
    fe = _subscribed_fe(net, "mdup-sub", "mdup/#")
    mq = net.mqtt("mdup-pub")
    mq.send(Publish("mdup/t", b"m", 1, False, True, 7))
    assert [p.packet_id for p in mq.take(Puback)] == [7]
    assert fe.publish is not None
    [(got, _)] = fe.publish.new()
    assert (got.delivery_count, got.first_acquirer) == (0, True)


def test_a_real_redelivery_still_counts_after_a_dup_publish() -> None:
    """The fix keeps what a redelivery says: after Modified(delivery-failed) the same
    message comes again with delivery-count 1 and first-acquirer false."""
    net = Net()
    fe = _subscribed_fe(net, "red-sub", "red/#")
    publisher = net.fe("red-pub")
    publisher.peer.send(publisher.peer.sender(None), _dup_publish("red/t", b"r", 1))
    assert fe.publish is not None
    [(_, dlv)] = fe.publish.new()
    fe.peer.settle(dlv, MODIFIED, failed=True)
    [(again, _)] = fe.publish.new()
    assert (bytes(again.body), again.delivery_count, again.first_acquirer) == (
        b"r", 1, False)


def _release(fe: FE, packet_id: int) -> None:
    """AMQP_PUBREL to ``$mqtt.<id>.pubrel`` (the client's PUBREC), Accepted."""
    rel = fe.peer.sender(f"$mqtt.{fe.client_id}.pubrel")
    dlv = fe.peer.send(rel, Message(subject="pubrel", id=ulong(packet_id)))
    assert dlv.remote_state == ACCEPTED


@pytest.mark.parametrize("qos", [1, 2])
def test_publish_delivery_settled_without_outcome_is_sent_again(qos: int) -> None:
    """A ``.publish`` delivery at QoS 1/2 that the FE settles with no outcome is not
    consumed: the source's default outcome, modified(delivery-failed), sends it again
    with delivery-count 1; Accepted then ends it."""
    net = Net()
    fe = _subscribed_fe(net, "nout", "nout/#")
    mq = net.mqtt("nout-pub")
    mq.publish("nout/t", b"keep", qos=qos)
    assert fe.publish is not None
    [(first, dlv)] = fe.publish.new()
    assert first.delivery_count == 0
    dlv.settle()                 # no outcome
    net.pump()
    [(again, dlv2)] = fe.publish.new()
    assert (bytes(again.body), again.delivery_count, again.first_acquirer) == (
        b"keep", 1, False)
    if qos == 2:
        _release(fe, int(again.id))
    fe.peer.settle(dlv2, ACCEPTED)
    if qos == 2:
        [(pubrel, rdlv)] = fe.publish.new()
        assert (pubrel.subject, int(pubrel.id)) == ("pubrel", int(again.id))
        fe.peer.settle(rdlv, ACCEPTED)
    assert fe.publish.new() == []
    assert not net.broker.sessions["nout"].inflight


def test_pubrel_settled_without_outcome_is_sent_again() -> None:
    """An AMQP_PUBREL on ``.publish`` settled with no outcome does not complete the
    QoS 2 exchange: it comes again, and Accepted completes it."""
    net = Net()
    fe = _subscribed_fe(net, "nrel", "nrel/#")
    net.mqtt("nrel-pub").publish("nrel/t", b"two", qos=2)
    assert fe.publish is not None
    [(m, dlv)] = fe.publish.new()
    _release(fe, int(m.id))
    fe.peer.settle(dlv, ACCEPTED)
    [(pubrel, rdlv)] = fe.publish.new()
    assert pubrel.subject == "pubrel"
    rdlv.settle()                # no outcome
    net.pump()
    [(again, rdlv2)] = fe.publish.new()
    assert (again.subject, int(again.id)) == ("pubrel", int(pubrel.id))
    fe.peer.settle(rdlv2, ACCEPTED)
    assert fe.publish.new() == []
    assert not net.broker.sessions["nrel"].inflight


def test_topic_delivery_settled_without_outcome_is_consumed() -> None:
    """On a plain topic receiver a delivery settled with no outcome is consumed, as
    before the gateway contract's rule (which is ``.publish``'s only): not sent
    again; the settlement is counted."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("tno/t")
    net.mqtt("tno-pub").publish("tno/t", b"x", qos=1)
    [(_, dlv)] = rcv.new()
    dlv.settle()
    net.pump()
    assert rcv.new() == []
    assert all(not s.inflight for s in net.broker.link_subscribers.values())
    assert net.broker.stats.settled_without_outcome == 1


def test_queue_delivery_settled_without_outcome_is_acknowledged() -> None:
    """On a durable queue's receiver a delivery settled with no outcome is
    acknowledged (consumed), not made visible again."""
    from fakes import MemoryStore

    net = Net(store=MemoryStore())
    app = net.amqp()
    app.send(app.sender("$queue/nq"), Message(body="m"))
    rcv = app.receiver("$queue/nq", credit=5)
    [(_, dlv)] = rcv.new()
    dlv.settle()
    net.pump()
    assert rcv.new() == []
    view = {v.name: v for v in net.broker.queues.views()}["nq"]
    assert view.acknowledged == 1


@pytest.mark.parametrize("queue", [False, True], ids=["topic", "queue"])
@pytest.mark.parametrize("how", ["none", "released", "modified"])
def test_a_released_qos2_delivery_is_not_sent_again(how: str, queue: bool) -> None:
    """Once the FE's AMQP_PUBREL is accepted (its client has the message), a
    non-Accepted settlement of the message's own delivery (none, Released, Modified)
    does not send the message again, from a topic or a durable queue: the PUBREL's
    settle completes it (exactly once)."""
    from fakes import MemoryStore

    net = Net(store=MemoryStore()) if queue else Net()
    topic = "$queue/jobs/t" if queue else "q2/t"
    fe = _subscribed_fe(net, "q2", "$queue/jobs/#" if queue else "q2/#")
    net.mqtt("q2-pub").publish(topic, b"two", qos=2)
    net.pump()
    assert fe.publish is not None
    [(m, dlv)] = fe.publish.new()
    _release(fe, int(m.id))
    if how == "none":
        dlv.settle()
        net.pump()
    else:
        fe.peer.settle(dlv, RELEASED if how == "released" else MODIFIED)
    got = fe.publish.new()
    assert [x.subject for x, _ in got] == ["pubrel"]
    fe.peer.settle(got[0][1], ACCEPTED)
    net.pump()
    assert fe.publish.new() == []
    assert not net.broker.sessions["q2"].inflight
    if queue:
        view = {v.name: v for v in net.broker.queues.views()}["jobs"]
        assert view.acknowledged == 1


def test_a_publish_delivery_never_given_an_outcome_is_dropped_at_the_bound(
        log_events: list[dict[str, Any]]) -> None:
    """A ``.publish`` peer that always settles without an outcome gets the message
    --amqp-max-default-outcomes + 1 times, then it is dropped as rejected, counted,
    one log line; the settlements are counted."""
    from twisted.logger import formatEvent

    net = Net(amqp_max_default_outcomes=3)
    fe = _subscribed_fe(net, "loop", "loop/#")
    net.mqtt("loop-pub").publish("loop/t", b"x", qos=1)
    assert fe.publish is not None
    counts = []
    for _ in range(10):
        got = fe.publish.new()
        if not got:
            break
        [(msg, dlv)] = got
        counts.append(msg.delivery_count)
        dlv.settle()
        net.pump()
    assert counts == [0, 1, 2, 3]
    assert not net.broker.sessions["loop"].inflight
    assert net.broker.stats.messages_rejected == 1
    assert net.broker.stats.settled_without_outcome == 4
    lines = [formatEvent(e) for e in log_events]
    assert len([x for x in lines if "--amqp-max-default-outcomes" in x]) == 1, lines


def test_a_pubrel_never_given_an_outcome_is_dropped_at_the_bound() -> None:
    """An AMQP_PUBREL always settled without an outcome is resent
    --amqp-max-default-outcomes times, then the exchange is dropped as rejected."""
    net = Net(amqp_max_default_outcomes=2)
    fe = _subscribed_fe(net, "lrel", "lrel/#")
    net.mqtt("lrel-pub").publish("lrel/t", b"two", qos=2)
    assert fe.publish is not None
    [(m, dlv)] = fe.publish.new()
    _release(fe, int(m.id))
    fe.peer.settle(dlv, ACCEPTED)
    sent = 0
    for _ in range(10):
        got = fe.publish.new()
        if not got:
            break
        assert got[0][0].subject == "pubrel"
        sent += 1
        got[0][1].settle()
        net.pump()
    assert sent == 3
    assert not net.broker.sessions["lrel"].inflight
    assert net.broker.stats.messages_rejected == 1


@pytest.fixture
def log_events() -> Iterator[list[dict[str, Any]]]:
    from twisted.logger import globalLogPublisher

    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)

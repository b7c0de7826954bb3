"""The durable queues' short delivery path (``InflightWindow.send_credited`` from
``Dispatch._deliver``): a QoS 1 member with credit and window room gets the message
sent at once; every other case takes ``Session.deliver`` and its queue.  Through the
broker's façade with fake links and a ``Clock``."""

from __future__ import annotations

from typing import Any

import pytest
from queue_facade import ack, client, join, make, send

from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.persistence import QueuedState
from mqttamqp.core.sessions.session import Session


def test_a_credited_delivery_is_in_flight_at_once_and_its_puback_finishes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A QoS 1 member of an idle session: the queue's message is sent at once by the
    short path, ``Session.deliver`` never called (in flight, SENT, any later send of
    it a duplicate), and its PUBACK acknowledges it in the queue."""
    def not_this_path(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the queue's delivery took Session.deliver")

    monkeypatch.setattr(Session, "deliver", not_this_path)
    broker, clock, _ = make()
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs")
    send(broker, "$queue/jobs", b"a")
    clock.advance(0.1)
    ((message, qos, packet_id, dup, _),) = link.published()
    assert (message.payload, qos, dup) == (b"a", 1, False)
    entry = session.inflight[packet_id]
    assert entry.state == QueuedState.SENT and entry.dup and entry.receipt is not None
    assert not session.has_queued
    broker.acknowledged(session, packet_id)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert group.acked == 1 and not group.pending and not session.inflight


def test_a_full_window_sends_the_queue_message_only_after_an_ack() -> None:
    """The session's window is full of topic deliveries (the queue's credit counts
    only its own): the queue's message waits in the session's queue, not sent past
    the window, and goes out once a PUBACK frees a place."""
    broker, clock, _ = make()
    session, link = client(broker, "w-1")
    session.window = 2
    join(broker, session, "$queue/jobs")
    for i in range(2):
        session.deliver(Message("t", b"t%d" % i, 1, False, "p", clock.seconds()), 1, False)
    assert len(link.published()) == 2
    send(broker, "$queue/jobs", b"q")
    clock.advance(0.1)
    assert len(link.published()) == 2 and session.has_queued
    first = link.published()[0][2]
    broker.acknowledged(session, first)
    assert [m.payload for m, *_ in link.published()] == [b"t0", b"t1", b"q"]
    assert len(session.inflight) == 2


def test_a_message_with_an_expiry_takes_the_session_queue_and_is_counted() -> None:
    """A message with an MQTT 5 expiry interval is delivered by ``Session.deliver``,
    which notes its expiry for the bound's purge of expired messages (the short
    path does not, so it must not take it)."""
    broker, clock, _ = make()
    session, link = client(broker, "w-1", "mqtt5")
    join(broker, session, "$queue/jobs")
    send(broker, "$queue/jobs", b"e", props=MessageProperties(expiry_interval=60))
    clock.advance(0.1)
    [(sent, *_)] = link.published()
    assert sent.payload == b"e"
    assert session.queue.next_expiry == sent.timestamp + 60   # (for the bound's purge)


def test_a_qos0_member_is_not_given_the_short_path() -> None:
    """A QoS 0 member's delivery goes as before (sent, acknowledged on send, nothing
    in flight): the short path is QoS 1's only."""
    broker, clock, _ = make()
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs", qos=0)
    send(broker, "$queue/jobs", b"z")
    clock.advance(0.1)
    assert [(m.payload, q) for m, q, *_ in link.published()] == [(b"z", 0)]
    assert not session.inflight
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert group.acked == 1


def test_an_append_still_drops_a_head_past_its_age_without_a_tick() -> None:
    """``_append`` tests the retention bounds itself before calling
    ``_enforce_retention``: a head older than --queue-max-age is dropped by the next
    append (no timer tick between), and a fresh head is kept."""
    broker, clock, _ = make(queue_max_age=10)
    send(broker, "$queue/jobs", b"old")
    queue = broker.queues.queues["jobs"]
    broker.publish(Message("$queue/jobs", b"fresh", 1, False, "p", clock.seconds() + 5))
    assert [m.payload for m in queue.log.values()] == [b"old", b"fresh"]
    broker.publish(Message("$queue/jobs", b"late", 1, False, "p", clock.seconds() + 11))
    assert [m.payload for m in queue.log.values()] == [b"fresh", b"late"]



def test_the_session_queue_bounds_do_not_hold_back_what_goes_straight_out() -> None:
    """--max-queued-bytes bounds what waits in a session's queue: a queue message
    larger than it, sent straight into a window with room, is delivered (nothing
    waits in the session's queue)."""
    broker, clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs")
    send(broker, "$queue/jobs", b"x" * 11)
    clock.advance(0.1)
    assert [m.payload for m, *_ in link.published()] == [b"x" * 11]
    assert not session.has_queued and session.queued_bytes == 0


def test_a_delivery_the_session_refuses_waits_for_the_next_pump_not_a_spin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window full and the message over --max-queued-bytes: ``Session.deliver``
    refuses it; the queue keeps it visible and stops handing it out in that pump
    (it was handed to the same member again and again, for ever); the next pump
    after a PUBACK freed the window hands it out, first."""
    broker, clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "w-1")
    session.window = 1
    join(broker, session, "$queue/jobs")
    session.deliver(Message("t", b"t", 1, False, "p", clock.seconds()), 1, False)
    calls = [0]
    deliver = Session.deliver

    def counted(self: Session, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 50:
            raise AssertionError("the pump keeps handing the refused message out")
        return deliver(self, *args, **kwargs)

    monkeypatch.setattr(Session, "deliver", counted)
    send(broker, "$queue/jobs", b"x" * 11)
    assert calls[0] == 1 and session.dropped == 0   # (kept in the queue: not dropped)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert not group.pending and group.ready == [0]
    broker.acknowledged(session, link.published()[0][2])
    send(broker, "$queue/jobs", b"y")   # (a queue pump: it goes out now, the window free)
    assert [m.payload for m, *_ in link.published()] == [b"t", b"x" * 11]


@pytest.mark.parametrize("member_qos, props, protocol", [
    (2, None, "mqtt3.1.1"),
    (1, MessageProperties(expiry_interval=600), "mqtt5"),
], ids=["qos2-member", "expiry-interval"])
def test_a_message_over_the_session_bound_is_delivered_when_nothing_waits(
        member_qos: int, props: MessageProperties | None, protocol: str) -> None:
    """A QoS 2 member, or a message with an expiry interval (neither takes the short
    path), and a message larger than --max-queued-bytes with the session's queue
    empty and its window free: delivered, and the messages behind it too (it was
    refused and offered again at every pump, for ever), nothing counted dropped or
    redelivered."""
    broker, clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "w-1", protocol)
    join(broker, session, "$queue/jobs", qos=member_qos)
    send(broker, "$queue/jobs", b"x" * 11, props=props)
    send(broker, "$queue/jobs", b"small")
    clock.advance(1)
    send(broker, "$queue/jobs", b"more")
    assert [m.payload for m, *_ in link.published()] == [b"x" * 11, b"small", b"more"]
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert session.dropped == 0 and group.redelivered == 0
    assert broker.queues.stats.redelivered == 0 and len(group.pending) == 3


def test_a_refused_redelivery_is_not_counted_redelivered() -> None:
    """A $nack'd message over --max-queued-bytes, offered again while the member's
    window is full (it would wait): refused and kept, counted neither dropped nor
    redelivered; once the window frees it goes out, counted redelivered once."""
    broker, clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "w-1", "mqtt5")
    session.window = 1
    join(broker, session, "$queue/jobs")
    send(broker, "$queue/jobs", b"x" * 11)
    (first,) = link.published()
    session.deliver(Message("t", b"t", 1, False, "p", clock.seconds()), 1, False)
    ack(broker, session, first[0], "$nack")
    broker.acknowledged(session, first[2])
    for _ in range(3):
        clock.advance(1)
        send(broker, "$queue/jobs", b"y")
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert [m.payload for m, *_ in link.published()] == [b"x" * 11, b"t"]
    assert group.redelivered == 0 and broker.queues.stats.redelivered == 0
    assert session.dropped == 0 and group.ready == [0]
    broker.acknowledged(session, link.published()[1][2])   # (the window frees)
    send(broker, "$queue/jobs", b"z")
    assert [m.payload for m, *_ in link.published()][2:] == [b"x" * 11]
    assert group.redelivered == 1 and broker.queues.stats.redelivered == 1



def test_a_delivery_one_member_refuses_goes_to_another_in_the_same_pump() -> None:
    """Two members, the first's window full of a topic delivery: a message over
    --max-queued-bytes it would have to queue is refused by it and handed, in the
    same pump, to the idle second member (the pump stopped at the refusal and the
    idle member waited for the next event); the first is not offered it again."""
    broker, clock, _ = make(max_queued_bytes=10)
    busy, busy_link = client(broker, "w-1")
    idle, idle_link = client(broker, "w-2")
    busy.window = 1
    join(broker, busy, "$queue/jobs")
    join(broker, idle, "$queue/jobs")
    busy.deliver(Message("t", b"t", 1, False, "p", clock.seconds()), 1, False)
    send(broker, "$queue/jobs", b"x" * 11)
    assert [m.payload for m, *_ in idle_link.published()] == [b"x" * 11]
    assert [m.payload for m, *_ in busy_link.published()] == [b"t"]
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert busy.dropped == 0 and group.redelivered == 0 and not group.ready


def test_only_dispatch_and_browsing_pump_a_queue() -> None:
    """``Browsing._pump_queue`` repeats ``Dispatch._pump_queue``'s loop instead of a
    ``super()`` call: no other class of the queue manager may define it (it would be
    passed over)."""
    from mqttamqp.core.queues.browsing import Browsing
    from mqttamqp.core.queues.dispatch import Dispatch
    from mqttamqp.core.queues.log import QueueLogs
    from mqttamqp.core.queues.manager import QueueManager

    defining = [cls for cls in QueueManager.__mro__ if "_pump_queue" in vars(cls)]
    assert defining == [Browsing, Dispatch, QueueLogs]


def _one_prefetching_member(broker: Any) -> tuple[Session, Any]:
    """One member with a prefetch of its own (as a 0.9.1 consumer has), the group's
    only one and without a selector: the pump's inline credit test decides."""
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs")
    session.queue_prefetch = 10
    return session, link


def test_one_member_whose_link_is_congested_is_given_nothing() -> None:
    """A congested link (a 0.9.1 channel.flow off, a connection blocked on writes)
    takes nothing from the queue until it drains."""
    broker, clock, _ = make()
    _session, link = _one_prefetching_member(broker)
    link.congested = True
    send(broker, "$queue/jobs", b"a")
    clock.advance(0.1)
    assert link.published() == []


def test_one_member_whose_session_is_leaving_is_given_nothing() -> None:
    """While the queues let a session go (``_leaving``), its member takes nothing."""
    broker, clock, _ = make()
    session, link = _one_prefetching_member(broker)
    broker.queues._leaving = session
    send(broker, "$queue/jobs", b"a")
    clock.advance(0.1)
    assert link.published() == []


def test_one_member_with_entries_queued_in_its_session_waits_for_them() -> None:
    """A member whose session has entries waiting (its window full of topic
    deliveries) is passed over, with the hook that feeds it once they are out: the
    queue's message is not served ahead of them."""
    broker, clock, _ = make()
    session, link = _one_prefetching_member(broker)
    session.window = 1
    for i in range(2):
        session.deliver(Message("t", b"t%d" % i, 1, False, "p", clock.seconds()), 1, False)
    assert session.has_queued and session.queue_waiting is None
    send(broker, "$queue/jobs", b"q")
    clock.advance(0.1)
    assert [m.payload for m, *_ in link.published()] == [b"t0"]
    assert session.queue_waiting is not None

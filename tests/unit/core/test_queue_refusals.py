"""A durable queue's delivery refused by the member's session (--max-queued-messages
/-bytes: it would have waited behind a full window or a queue): kept in its queue
(a stream's cursor goes back to it), offered to the other members with credit in
the same pump, and offered again once the refusing session's window frees.  And
what goes straight to the window is never refused.  Through the broker's façade
with fake links and a ``Clock``."""

from __future__ import annotations

from typing import Any

import pytest
from queue_facade import client, join, make, send

from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.routing.settlement import Outcome
from mqttamqp.core.sessions.session import Session


def _fill_window(now: float, session: Session) -> None:
    """Put one topic delivery (QoS 1) in flight on a session of window 1."""
    session.window = 1
    session.deliver(Message("t", b"t", 1, False, "p", now), 1, False)


def test_a_stream_reader_s_refused_delivery_is_read_again_not_skipped() -> None:
    """A stream reader whose window is full refuses a message over --max-queued-bytes:
    its group's cursor goes back to it (it moved past, and the reader skipped the
    message for good, uncounted); once the PUBACK frees the window the reader gets
    it, then what follows, nothing counted dropped."""
    broker, clock, _ = make(max_queued_bytes=10)
    send(broker, "$queue/jobs", b"a")   # (the queue exists)
    reader, link = client(broker, "r")
    join(broker, reader, "$queue/jobs/#", consumer=Consumer(group="s", mode="stream"))
    broker.acknowledged(reader, link.published()[0][2])   # (``a`` read)
    _fill_window(clock.seconds(), reader)
    send(broker, "$queue/jobs", b"x" * 11)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert [m.payload for m, *_ in link.published()] == [b"a", b"t"]
    assert group.next == 1 and reader.dropped == 0   # (the cursor is back on it)
    broker.acknowledged(reader, link.published()[1][2])
    assert [m.payload for m, *_ in link.published()][2:] == [b"x" * 11]
    broker.acknowledged(reader, link.published()[2][2])
    send(broker, "$queue/jobs", b"after")
    assert [m.payload for m, *_ in link.published()][3:] == [b"after"]
    assert reader.dropped == 0


def _count_offers(monkeypatch: pytest.MonkeyPatch, session: Session) -> list[bytes]:
    """Record each delivery offered to ``session`` through ``Session.deliver`` (a
    refused offer always ends there, its short path ``send_credited`` having
    found no room): the payloads, in order."""
    offers: list[bytes] = []
    deliver = Session.deliver

    def counted(self: Session, message: Message, *args: Any, **kw: Any) -> Any:
        if self is session:
            offers.append(message.payload)
        return deliver(self, message, *args, **kw)

    monkeypatch.setattr(Session, "deliver", counted)
    return offers


def test_a_refusing_member_does_not_stop_the_pump_for_a_qos0_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy member (window full) and an idle QoS 0 member joining while four
    messages over --max-queued-bytes wait: the busy one refuses, the idle one gets
    all four in that pump (the pump stopped when the rotation came back to the
    refusing member: 1 of 4, the rest waiting for the next publish, as a QoS 0
    member never acknowledges); the busy member is not offered them again."""
    broker, clock, _ = make(max_queued_bytes=10)
    busy, busy_link = client(broker, "w-1")
    idle, idle_link = client(broker, "w-2")
    join(broker, busy, "$queue/jobs")
    _fill_window(clock.seconds(), busy)
    for i in range(4):
        send(broker, "$queue/jobs", b"x%d" % i * 6)
    offers = _count_offers(monkeypatch, busy)
    join(broker, idle, "$queue/jobs", qos=0)
    assert [m.payload for m, *_ in idle_link.published()] == [
        b"x%d" % i * 6 for i in range(4)]
    assert [m.payload for m, *_ in busy_link.published()] == [b"t"]
    assert offers == [b"x0" * 6]   # (refused once in that pump, not offered again)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert not group.ready and not group.pending and busy.dropped == 0


def test_a_refusing_member_does_not_stop_the_pump_for_a_qos1_member() -> None:
    """As above with an idle QoS 1 member: it gets the four in one pump."""
    broker, clock, _ = make(max_queued_bytes=10)
    busy, _busy_link = client(broker, "w-1")
    idle, idle_link = client(broker, "w-2")
    join(broker, busy, "$queue/jobs")
    _fill_window(clock.seconds(), busy)
    for i in range(4):
        send(broker, "$queue/jobs", b"x%d" % i * 6)
    join(broker, idle, "$queue/jobs")
    assert len(idle_link.published()) == 4 and busy.dropped == 0


def test_a_refused_message_goes_out_once_a_topic_puback_frees_the_window() -> None:
    """A lone member whose window is full of a topic delivery refuses a queue message
    over --max-queued-bytes; the topic delivery's PUBACK frees the window and the
    queue message goes out at once, with no other publish (it waited for one, for
    ever on a quiet queue)."""
    broker, clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs")
    _fill_window(clock.seconds(), session)
    send(broker, "$queue/jobs", b"x" * 11)
    assert session.queue_waiting is not None
    broker.acknowledged(session, link.published()[0][2])
    assert [m.payload for m, *_ in link.published()] == [b"t", b"x" * 11]
    assert session.queue_waiting is None and session.dropped == 0


def test_a_refused_message_goes_out_once_the_session_queue_drains() -> None:
    """--max-queued-messages 1, the session's queue full behind a full window: a small
    queue message is passed over (no credit while entries wait there); once both
    topic deliveries are acknowledged (the queue drained, the window free) it goes
    out with no other publish."""
    broker, clock, _ = make(max_queued_messages=1)
    session, link = client(broker, "w-1")
    join(broker, session, "$queue/jobs")
    _fill_window(clock.seconds(), session)
    session.deliver(Message("t", b"u", 1, False, "p", clock.seconds()), 1, False)
    send(broker, "$queue/jobs", b"q")
    assert [m.payload for m, *_ in link.published()] == [b"t"]
    broker.acknowledged(session, link.published()[0][2])
    assert [m.payload for m, *_ in link.published()] == [b"t", b"u"]
    broker.acknowledged(session, link.published()[1][2])
    assert [m.payload for m, *_ in link.published()] == [b"t", b"u", b"q"]
    assert session.dropped == 0


def test_a_persistent_qos2_subscriber_gets_a_message_over_the_bytes_bound() -> None:
    """A persistent session's QoS 2 subscription, idle: a message over
    --max-queued-bytes is held only for its own commit, then delivered (it was
    counted as waiting and dropped, every time)."""
    broker, _clock, _ = make(max_queued_bytes=10)
    session, link = client(broker, "s-1", "mqtt3.1.1", clean=False)
    join(broker, session, "t/#", qos=2)
    send(broker, "t/a", b"x" * 11, qos=2)
    assert [(m.payload, qos) for m, qos, *_ in link.published()] == [(b"x" * 11, 2)]
    assert session.dropped == 0


def _one_in_flight_two_refused(**limits: Any) -> tuple[Any, Any, Any]:
    """A session of window 1 in queues one and two, one's delivery in flight, two's
    message (over --max-queued-bytes) refused: (broker, session, its link);
    ``limits``: more ``Limits`` fields."""
    broker, _clock, _ = make(max_queued_bytes=10, **limits)
    session, link = client(broker, "w-1")
    session.window = 1
    join(broker, session, "$queue/one")
    join(broker, session, "$queue/two")
    send(broker, "$queue/one", b"a")
    send(broker, "$queue/two", b"x" * 11)
    assert [m.payload for m, *_ in link.published()] == [b"a"]
    assert session.queue_waiting is not None
    return broker, session, link


def test_a_batch_of_quiet_acceptances_feeds_another_queue_s_refused_message() -> None:
    """A member of two queues, its window full of the first one's delivery, refuses
    the second one's message over --max-queued-bytes; a batch acceptance of the
    first delivery (``Settlement.accept_many``, AMQP 0.9.1 ``basic.ack``) pumps the
    first queue, and at the batch's end the second: its message goes out."""
    broker, session, link = _one_in_flight_two_refused()
    broker.settlement.accept_many([(session, link.published()[0][2])])
    assert [m.payload for m, *_ in link.published()] == [b"a", b"x" * 11]
    assert session.dropped == 0


def test_a_classic_message_a_busy_member_refused_is_not_parked_past_it() -> None:
    """A member that takes everything refuses a message (window full), the other
    member's selector rejects it: it is not parked past the refusing member (it
    never got it); the PUBACK that frees the window hands it over."""
    broker, clock, _ = make(max_queued_bytes=10)
    busy, busy_link = client(broker, "w-1")
    picky, picky_link = client(broker, "w-2")
    join(broker, busy, "$queue/jobs")
    join(broker, picky, "$queue/jobs",
         consumer=Consumer(selector=lambda m: m.payload == b"b"))
    _fill_window(clock.seconds(), busy)
    send(broker, "$queue/jobs", b"x" * 11)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert not group.parked
    broker.acknowledged(busy, busy_link.published()[0][2])
    assert [m.payload for m, *_ in busy_link.published()] == [b"t", b"x" * 11]
    assert picky_link.published() == [] and busy.dropped == 0


def test_a_stream_message_a_busy_reader_refused_is_not_skipped_for_a_selector() -> None:
    """A stream reader refuses a message (window full), the group's other reader's
    selector rejects it: the cursor stays on it (it moved past, skipped for good);
    the PUBACK that frees the window hands it to the reader."""
    broker, clock, _ = make(max_queued_bytes=10)
    send(broker, "$queue/jobs", b"a")   # (the queue exists)
    reader, link = client(broker, "ra")
    picky, picky_link = client(broker, "rb")
    join(broker, reader, "$queue/jobs/#", consumer=Consumer(group="s", mode="stream"))
    join(broker, picky, "$queue/jobs/#", consumer=Consumer(
        group="s", mode="stream", selector=lambda m: m.payload == b"b"))
    broker.acknowledged(reader, link.published()[0][2])   # (``a`` read)
    _fill_window(clock.seconds(), reader)
    send(broker, "$queue/jobs", b"x" * 11)
    (group,) = broker.queues.queues["jobs"].groups.values()
    assert group.next == 1
    broker.acknowledged(reader, link.published()[1][2])
    assert [m.payload for m, *_ in link.published()][2:] == [b"x" * 11]
    assert picky_link.published() == [] and reader.dropped == 0


def _waiting_behind_one(outcome: Outcome | None) -> tuple[list[bytes], int]:
    """A session of window 1 in queues one and two has one's delivery in flight and
    refused two's message (over --max-queued-bytes); ``outcome`` settles one's
    delivery (None: the session unsubscribes from one): what it then got, and
    how many it dropped."""
    broker, session, link = _one_in_flight_two_refused()
    if outcome is None:
        broker.unsubscribe(session, ["$queue/one"])
    else:
        broker.settlement.settle(session, link.published()[0][2], outcome, False, "no")
    return [m.payload for m, *_ in link.published()], session.dropped


def test_a_rejected_queue_delivery_feeds_the_freed_window() -> None:
    """Rejecting a queue's delivery frees its window slot: the message another
    queue's group had to keep (refused) goes out at once."""
    assert _waiting_behind_one(Outcome.REJECTED) == ([b"a", b"x" * 11], 0)


def test_leaving_a_queue_with_a_delivery_in_flight_feeds_the_freed_window() -> None:
    """Unsubscribing from a queue gives its in-flight delivery back: the freed slot
    takes the other queue's refused message."""
    assert _waiting_behind_one(None) == ([b"a", b"x" * 11], 0)


def test_the_queue_waiting_hook_goes_with_the_session() -> None:
    """A session that refused a queue's message holds a hook that refers to it (a
    cycle): it goes when the session goes offline, and when it is forgotten."""
    broker, clock, _ = make(max_queued_bytes=10)
    persistent, _link = client(broker, "s-1", clean=False)
    clean, _clean_link = client(broker, "w-1")
    for session in (persistent, clean):
        join(broker, session, "$queue/jobs")
        _fill_window(clock.seconds(), session)
    send(broker, "$queue/jobs", b"x" * 11)
    send(broker, "$queue/jobs", b"y" * 11)
    assert persistent.queue_waiting is not None and clean.queue_waiting is not None
    broker.queues.member_left(persistent)
    assert persistent.queue_waiting is None
    broker.router.forget_session(clean)
    assert clean.queue_waiting is None


def _busy_and_picky() -> tuple[Any, Any, Any]:
    """``busy`` (takes everything, its window full of a topic message) and
    ``picky`` (selects ``b…``) in queue jobs; ``x…`` (busy refuses it, picky's
    selector rejects it) then ``b…`` published: (broker, busy, picky's link)."""
    broker, clock, _ = make(max_queued_bytes=10)
    busy, _busy_link = client(broker, "w-1")
    picky, picky_link = client(broker, "w-2")
    join(broker, busy, "$queue/jobs")
    join(broker, picky, "$queue/jobs",
         consumer=Consumer(selector=lambda m: m.payload.startswith(b"b")))
    _fill_window(clock.seconds(), busy)
    send(broker, "$queue/jobs", b"x" * 11)
    send(broker, "$queue/jobs", b"b" * 11)
    return broker, busy, picky_link


@pytest.mark.parametrize("leaving", ["offline", "unsubscribe"])
def test_a_refusing_member_leaving_pumps_its_groups(leaving: str) -> None:
    """A classic group waits behind a message only its refusing member wants (the
    others' selectors reject it); that member going (offline, or unsubscribed) with
    nothing of the group's pending pumps the group: the other member gets what it
    selects after it (it waited for the next publish, on a quiet queue for ever)."""
    broker, busy, picky_link = _busy_and_picky()
    assert picky_link.published() == []        # (waits behind x…)
    if leaving == "offline":
        broker.queues.member_left(busy)
    else:
        broker.unsubscribe(busy, ["$queue/jobs"])
    assert [m.payload for m, *_ in picky_link.published()] == [b"b" * 11]


def test_a_stream_reader_leaving_lets_the_others_past_its_refused_message() -> None:
    """A stream group waits behind a message its refusing reader wants (its cursor
    cannot pass it); the reader unsubscribing pumps the group: the other reader
    gets what it selects after it."""
    broker, clock, _ = make(max_queued_bytes=10)
    send(broker, "$queue/jobs", b"a")
    reader, link = client(broker, "ra")
    picky, picky_link = client(broker, "rb")
    join(broker, reader, "$queue/jobs/#", consumer=Consumer(group="s", mode="stream"))
    join(broker, picky, "$queue/jobs/#", consumer=Consumer(
        group="s", mode="stream", selector=lambda m: m.payload.startswith(b"b")))
    broker.acknowledged(reader, link.published()[0][2])
    _fill_window(clock.seconds(), reader)
    send(broker, "$queue/jobs", b"x" * 11)
    send(broker, "$queue/jobs", b"b" * 11)
    assert picky_link.published() == []        # (waits behind x: a stream's cursor)
    broker.unsubscribe(reader, ["$queue/jobs/#"])
    assert [m.payload for m, *_ in picky_link.published()] == [b"b" * 11]


@pytest.mark.parametrize("how", ["rejected", "unsubscribed"])
def test_a_window_freed_by_a_take_back_sends_what_waits_in_the_session(how: str) -> None:
    """A queue delivery in flight (window 1) and a topic message queued behind it:
    rejecting the delivery (dead-lettered: its group is empty) or unsubscribing from
    the queue frees the window, and the topic message goes (it stayed queued)."""
    broker, clock, _ = make()
    session, link = client(broker, "w-1")
    session.window = 1
    join(broker, session, "$queue/one")
    send(broker, "$queue/one", b"a")
    session.deliver(Message("t", b"t", 1, False, "p", clock.seconds()), 1, False)
    assert [m.payload for m, *_ in link.published()] == [b"a"]   # (t queued behind a)
    if how == "rejected":
        broker.settlement.settle(session, link.published()[0][2], Outcome.REJECTED,
                                 False, "no")
    else:
        broker.unsubscribe(session, ["$queue/one"])
    assert [m.payload for m, *_ in link.published()] == [b"a", b"t"]


def test_a_visibility_time_out_feeds_the_stale_members_freed_window() -> None:
    """A member whose delivery times out (another takes it over) has its window
    freed: the message it refused from another queue goes to it then."""
    broker, _slow, link = _one_in_flight_two_refused(queue_visibility_timeout=10.0)
    clock = broker.clock
    idle, idle_link = client(broker, "w-2")
    join(broker, idle, "$queue/one")
    clock.advance(5.0)
    assert [m.payload for m, *_ in idle_link.published()] == [b"a"]
    assert [m.payload for m, *_ in link.published()] == [b"a", b"x" * 11]

"""Unit tests for the session: window, queue, bounds, held entries, redelivery, acks."""

from __future__ import annotations

from collections import deque
from typing import Any

import fakes
import pytest

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.persistence import (
    DeleteInboundQos2,
    DeleteQueued,
    PutInboundQos2,
    PutQueued,
    QueuedState,
    StoredQueued,
)
from mqttamqp.core.sessions.entries import NEVER, EntryQueue
from mqttamqp.core.sessions.session import Session, SessionState


class FakeLink(fakes.FakeLink):
    """Records ("publish", topic, qos, packet_id, dup, retain) and ("pubrel", packet_id)."""

    @property
    def sent(self) -> list[tuple[Any, ...]]:
        return [("publish", c[1].topic, *c[2:]) if c[0] == "publish" else c
                for c in self.calls]

    def publishes(self) -> list[tuple[Any, ...]]:
        return [s for s in self.sent if s[0] == "publish"]


def msg(topic: str, payload: bytes = b"x", qos: int = 1) -> Message:
    return Message(topic, payload, qos, False, "pub", 0.0)


def online(persistent: bool = False, **limits: Any) -> tuple[Session, FakeLink]:
    session = Session("c", persistent, Limits(**limits))
    link = FakeLink()
    session.attach(link)
    return session, link


# --------------------------------------------------------------------------
# window and order


def test_qos1_sent_at_once_on_clean_session() -> None:
    """A QoS 1 message to an online clean session goes out at once with a packet id."""
    session, link = online()
    assert session.enqueue(msg("t"), 1, False) == []
    assert link.sent == [("publish", "t", 1, 1, False, False)]
    assert list(session.inflight) == [1]
    assert not session.queue


def test_window_limits_inflight_and_keeps_order() -> None:
    """No more than max_inflight are in flight; the rest wait and go out in order."""
    session, link = online(max_inflight=2)
    for i in range(5):
        session.enqueue(msg(f"t{i}"), 1, False)
    assert link.topics() == ["t0", "t1"]
    assert len(session.inflight) == 2
    assert [e.message.topic for e in session.queue] == ["t2", "t3", "t4"]
    session.acknowledge(1)
    assert link.topics() == ["t0", "t1", "t2"]
    session.acknowledge(2)
    session.acknowledge(3)
    assert link.topics() == ["t0", "t1", "t2", "t3", "t4"]
    assert len(session.inflight) == 2


def test_congested_link_stops_pump_and_resumes() -> None:
    """Nothing is sent while the link is congested; pump() sends once it is not."""
    session, link = online()
    link.congested = True
    session.enqueue(msg("a"), 1, False)
    session.enqueue(msg("b"), 2, False)
    assert link.sent == []
    link.congested = False
    session.pump()
    assert link.topics() == ["a", "b"]


def test_qos0_goes_straight_to_link_without_packet_id() -> None:
    """QoS 0 bypasses the queue and the window: sent at once, no packet id."""
    session, link = online(max_inflight=1)
    session.enqueue(msg("q1"), 1, False)
    session.enqueue(msg("q0", qos=0), 0, True)
    assert link.sent[-1] == ("publish", "q0", 0, None, False, True)
    assert session.delivered == 1


def test_qos0_not_queued_for_offline_session() -> None:
    """An offline session does not queue QoS 0 and returns no ops."""
    session = Session("c", True, Limits())
    assert session.enqueue(msg("t", qos=0), 0, False) == []
    assert not session.queue
    assert session.queued_bytes == 0


def test_qos0_dropped_when_congested_past_backlog_bound() -> None:
    """QoS 0 to a congested link whose backlog exceeds the bound is dropped and counted."""
    session, link = online(congested_qos0_bytes=10)
    link.congested = True
    link.backlog_bytes = 11
    session.enqueue(msg("t", qos=0), 0, False)
    assert link.sent == []
    assert session.dropped == 1
    link.backlog_bytes = 10
    session.enqueue(msg("t", qos=0), 0, False)
    assert len(link.sent) == 1
    assert session.dropped == 1


# --------------------------------------------------------------------------
# bounds


def test_drops_past_max_queued_messages() -> None:
    """Once max_queued_messages wait (not counting in flight), more are dropped and counted."""
    session = Session("c", False, Limits(max_queued_messages=3))
    for i in range(5):
        session.enqueue(msg(f"t{i}"), 1, False)
    assert [e.message.topic for e in session.queue] == ["t0", "t1", "t2"]
    assert session.dropped == 2


def test_drops_past_max_queued_bytes() -> None:
    """A message that would take queued payload bytes past the bound is dropped and counted."""
    session = Session("c", False, Limits(max_queued_bytes=10))
    session.enqueue(msg("a", b"123456"), 1, False)
    session.enqueue(msg("b", b"12345"), 1, False)
    session.enqueue(msg("c", b"1234"), 1, False)
    assert [e.message.topic for e in session.queue] == ["a", "c"]
    assert session.queued_bytes == 10
    assert session.dropped == 1


def test_queued_bytes_follow_sending() -> None:
    """queued_bytes counts only entries still in the queue, not those in flight."""
    session, _link = online(max_inflight=1)
    session.enqueue(msg("a", b"123"), 1, False)
    session.enqueue(msg("b", b"45"), 1, False)
    assert session.queued_bytes == 2
    session.acknowledge(1)
    assert session.queued_bytes == 0


def test_dropped_entry_takes_no_packet_id() -> None:
    """A dropped message does not use up a packet id."""
    session = Session("c", False, Limits(max_queued_messages=1))
    session.enqueue(msg("a"), 1, False)
    session.enqueue(msg("b"), 1, False)
    link = FakeLink()
    session.attach(link)
    session.acknowledge(1)
    session.enqueue(msg("c"), 1, False)
    assert link.publishes()[-1][3] == 2


# --------------------------------------------------------------------------
# persistent sessions: held until durable


def test_persistent_enqueue_returns_put_queued_and_holds() -> None:
    """A persistent session returns PutQueued and sends nothing until release_held."""
    session, link = online(persistent=True)
    ops = session.enqueue(msg("t", b"p"), 2, True)
    assert ops == [PutQueued("c", 1, StoredQueued(
        Message("t", b"p", 1, True, "pub", 0.0), 2, QueuedState.QUEUED, 1))]
    assert link.sent == []
    session.release_held(1)
    assert link.sent == [("publish", "t", 2, 1, False, True)]


def test_release_held_releases_only_up_to_seq() -> None:
    """release_held(n) lets entries up to seq n go and keeps later ones held."""
    session, link = online(persistent=True)
    seqs = [session.enqueue(msg(t, qos=2), 2, False)[0].seq for t in ("a", "b", "c")]  # type: ignore[union-attr]
    assert seqs == [1, 2, 3]
    session.release_held(2)
    assert link.topics() == ["a", "b"]
    session.release_held(3)
    assert link.topics() == ["a", "b", "c"]


def test_held_head_blocks_later_entries() -> None:
    """Order is kept: a held entry at the head blocks everything behind it."""
    session, link = online(persistent=True)
    session.enqueue(msg("a", qos=2), 2, False)
    session.enqueue(msg("b", qos=2), 2, False)
    session.queue[1].held = False
    session.pump()
    assert link.sent == []


def test_persistent_qos1_is_stored_but_sent_at_once() -> None:
    """QoS 1 to a persistent session is stored (PutQueued) and sent without waiting."""
    session, link = online(persistent=True)
    ops = session.enqueue(msg("a"), 1, False)
    assert [type(op) for op in ops] == [PutQueued]
    assert link.topics() == ["a"]


# --------------------------------------------------------------------------
# attach: redelivery


def test_attach_sends_queue_offline_messages_in_order() -> None:
    """Messages queued while offline go out on attach, in order, without DUP."""
    session = Session("c", False, Limits())
    for t in ("a", "b", "c"):
        session.enqueue(msg(t), 1, False)
    link = FakeLink()
    session.attach(link)
    assert session.state is SessionState.ONLINE
    assert [(s[1], s[3], s[4]) for s in link.sent] == [
        ("a", 1, False), ("b", 2, False), ("c", 3, False)]


def test_attach_redelivers_inflight_first_with_dup_then_queue() -> None:
    """On reattach, in-flight entries go first with DUP in their original order, then the queue."""
    session, link1 = online(max_inflight=2)
    for t in ("a", "b", "c", "d"):
        session.enqueue(msg(t), 1, False)
    assert link1.topics() == ["a", "b"]
    session.detach()
    session.enqueue(msg("e"), 1, False)
    link2 = FakeLink()
    session.attach(link2)
    assert link2.sent == [
        ("publish", "a", 1, 1, True, False),
        ("publish", "b", 1, 2, True, False),
    ]
    session.acknowledge(1)
    session.acknowledge(2)
    session.acknowledge(3)
    session.acknowledge(4)
    assert [(s[1], s[4]) for s in link2.sent[2:]] == [("c", False), ("d", False), ("e", False)]


def test_attach_redelivers_released_qos2_as_pubrel() -> None:
    """A QoS 2 entry whose PUBREC arrived is resumed with PUBREL, not PUBLISH."""
    session, _link1 = online()
    session.enqueue(msg("a", qos=2), 2, False)
    session.enqueue(msg("b", qos=2), 2, False)
    session.received(1)
    session.detach()
    link2 = FakeLink()
    session.attach(link2)
    assert link2.sent == [("pubrel", 1), ("publish", "b", 2, 2, True, False)]


def test_detach_sets_offline() -> None:
    """detach() drops the link and the connection and marks the session offline."""
    session, link = online()
    assert session.connection is link
    session.detach()
    assert session.link is None and session.connection is None
    assert session.state is SessionState.OFFLINE
    session.enqueue(msg("a"), 1, False)
    assert link.sent == []


# --------------------------------------------------------------------------
# acknowledgement flows


def test_acknowledge_qos1_frees_and_returns_delete_for_persistent() -> None:
    """PUBACK for a persistent session's QoS 1 entry returns DeleteQueued and frees the slot."""
    session, _link = online(persistent=True)
    session.enqueue(msg("a"), 1, False)
    session.release_held(1)
    assert session.acknowledge(1) == [DeleteQueued("c", 1)]
    assert session.inflight == {}
    assert session.delivered == 1
    assert session.acknowledge(1) == []


def test_acknowledge_clean_session_returns_no_ops() -> None:
    """A clean session's acknowledgements need nothing stored."""
    session, _link = online()
    session.enqueue(msg("a"), 1, False)
    assert session.acknowledge(1) == []
    assert session.inflight == {}


def test_acknowledge_wrong_kind_or_unknown_is_ignored() -> None:
    """PUBACK for a QoS 2 entry or an unknown id changes nothing."""
    session, _link = online(persistent=True)
    session.enqueue(msg("a", qos=2), 2, False)
    session.release_held(1)
    assert session.acknowledge(1) == []
    assert session.acknowledge(99) == []
    assert list(session.inflight) == [1]
    assert session.completed(1) == [DeleteQueued("c", 1)]


def test_qos2_received_then_completed_flow() -> None:
    """PUBREC stores RELEASED and PUBREL goes only once that is durable; PUBCOMP
    finishes with DeleteQueued."""
    session, link = online(persistent=True)
    session.enqueue(msg("a", b"p", qos=2), 2, False)
    session.release_held(1)
    ops = session.received(1)
    assert ("pubrel", 1) not in link.sent  # not before the RELEASED state is stored
    assert ops == [PutQueued("c", 1, StoredQueued(
        Message("a", b"p", 2, False, "pub", 0.0), 2, QueuedState.RELEASED, 1))]
    assert session.inflight[1].state == QueuedState.RELEASED
    # A repeated PUBREC before the commit stores nothing and sends nothing yet.
    assert session.received(1) == []
    assert ("pubrel", 1) not in link.sent
    session.pubrel_durable(1)
    assert link.sent[-1] == ("pubrel", 1)
    # A repeated PUBREC after the commit is answered again.
    assert session.received(1) == []
    assert link.sent.count(("pubrel", 1)) == 2
    assert session.completed(1) == [DeleteQueued("c", 1)]
    assert session.inflight == {}
    assert session.completed(1) == []


def test_completed_for_qos1_entry_is_ignored() -> None:
    """PUBCOMP for a QoS 1 entry does not finish it."""
    session, _link = online()
    session.enqueue(msg("a"), 1, False)
    assert session.completed(1) == []
    assert list(session.inflight) == [1]


def test_inbound_qos2_ops() -> None:
    """Inbound QoS 2 ids are remembered and released with PutInboundQos2 / DeleteInboundQos2."""
    session = Session("c", True, Limits())
    assert not session.inbound_seen(7)
    assert session.inbound_add(7) == [PutInboundQos2("c", 7)]
    assert session.inbound_seen(7)
    assert session.inbound_release(7) == [DeleteInboundQos2("c", 7)]
    assert not session.inbound_seen(7)
    assert session.inbound_release(7) == []


def test_inbound_qos2_clean_session_no_ops() -> None:
    """A clean session tracks inbound QoS 2 ids but stores nothing."""
    session = Session("c", False, Limits())
    assert session.inbound_add(7) == []
    assert session.inbound_seen(7)
    assert session.inbound_release(7) == []


def test_redeliver_puts_entry_back_at_head() -> None:
    """An AMQP release puts the entry back at the head and sends it again (DUP if asked)."""
    session, link = online(max_inflight=1)
    session.enqueue(msg("a"), 1, False)
    session.enqueue(msg("b"), 1, False)
    session.redeliver(1, increment=False)
    assert link.sent[-1] == ("publish", "a", 1, 1, True, False)
    assert [e.message.topic for e in session.queue] == ["b"]


def test_drop_counts_and_frees() -> None:
    """An AMQP reject removes the entry, counts a drop and does not count a delivery."""
    session, _link = online(persistent=True)
    session.enqueue(msg("a"), 1, False)
    session.release_held(1)
    assert session.drop(1) == [DeleteQueued("c", 1)]
    assert session.dropped == 1
    assert session.delivered == 0
    assert session.drop(1) == []


# --------------------------------------------------------------------------
# packet ids


def test_packet_ids_never_reused_while_in_use() -> None:
    """A packet id is not handed out again until its exchange is finished."""
    session, link = online(max_inflight=3, max_queued_messages=100_000)
    session._next_pid = 65534  # near the wrap
    for i in range(3):
        session.enqueue(msg(f"m{i}"), 1, False)
    pids = [s[3] for s in link.publishes()]
    assert pids == [65534, 65535, 1]
    session.acknowledge(65535)
    session.enqueue(msg("m3"), 1, False)
    in_use = set(session.inflight) | {e.packet_id for e in session.queue}
    assert len(in_use) == 3
    # Walk the counter all the way round: 65534 and 1 are still in use and skipped.
    for _ in range(65540):
        pid = session._allocate_pid()
        assert pid not in in_use
        session._pids.discard(pid)


def test_packet_ids_unique_across_queue_and_inflight() -> None:
    """Every queued and in-flight entry has a distinct packet id, also after wrap-around."""
    session, _link = online(max_inflight=5, max_queued_messages=100_000)
    session._next_pid = 65530
    for i in range(20):
        session.enqueue(msg(f"m{i}"), 1 + i % 2, False)
        if i % 3 == 0:
            first = next(iter(session.inflight.values()))
            if first.qos == 1:
                session.acknowledge(first.packet_id)
            else:
                session.received(first.packet_id)
                session.completed(first.packet_id)
    ids = [e.packet_id for e in session.entries()]
    assert len(ids) == len(set(ids))
    assert set(ids) == session._pids


# --------------------------------------------------------------------------
# restore


def test_restore_marks_dup_and_keeps_packet_ids() -> None:
    """Restored entries keep their packet ids and go out with DUP (they may have been sent)."""
    session = Session("c", True, Limits())
    m1 = Message("a", b"12", 1, False, "pub", 0.0)
    m2 = Message("b", b"345", 2, True, "pub", 0.0)
    m3 = Message("c", b"6", 2, False, "pub", 0.0)
    session.restore([
        (4, StoredQueued(m1, 1, QueuedState.SENT, 10)),
        (5, StoredQueued(m2, 2, QueuedState.QUEUED, 11)),
        (9, StoredQueued(m3, 2, QueuedState.RELEASED, 12)),
    ], {3, 8})
    assert session.queued_bytes == 6
    assert session.inbound_qos2 == {3, 8}
    link = FakeLink()
    session.attach(link)
    assert link.sent == [
        ("publish", "a", 1, 10, True, False),
        ("publish", "b", 2, 11, True, True),
        ("pubrel", 12),
    ]
    # New entries continue after the highest restored seq and avoid restored ids.
    ops = session.enqueue(msg("d"), 1, False)
    assert isinstance(ops[0], PutQueued)
    assert ops[0].seq == 10
    assert ops[0].entry.packet_id not in {10, 11, 12}


def test_restore_without_packet_id_allocates_unused_one() -> None:
    """A stored entry without a packet id gets one that no other restored entry uses."""
    session = Session("c", True, Limits())
    m = Message("a", b"", 1, False, "pub", 0.0)
    session.restore([
        (1, StoredQueued(m, 1, QueuedState.QUEUED, None)),
        (2, StoredQueued(m, 1, QueuedState.QUEUED, 1)),
    ], ())
    ids = [e.packet_id for e in session.queue]
    assert len(set(ids)) == 2


def test_at_the_bound_an_entry_whose_delivery_started_is_not_purged() -> None:
    """At the queue bound, expired entries not yet sent are purged to make room; a
    restored one (it may have been sent: DUP) and a QoS 2 one owed its PUBREL are
    kept with their packet ids [MQTT-3.3.2-5]."""
    session = Session("c", True, Limits(max_queued_messages=3))

    def expiring(topic: str, at: float) -> Message:
        return Message(topic, b"x", 2, False, "pub", at,
                       props=MessageProperties(expiry_interval=10))

    session.restore([
        (1, StoredQueued(expiring("sent", 0.0), 2, QueuedState.QUEUED, 1)),
        (2, StoredQueued(expiring("rel", 0.0), 2, QueuedState.RELEASED, 2)),
    ], ())
    session.enqueue(expiring("new", 50.0), 2, False)     # (not sent: the client is away)
    ops = session.enqueue(Message("later", b"y", 1, False, "pub", 100.0), 1, False)
    assert [e.message.topic for e in session.queue] == ["sent", "rel", "later"]
    assert session.dropped == 1 and {1, 2} <= session._pids
    assert [type(op).__name__ for op in ops] == ["DeleteQueued", "PutQueued"]


def test_the_bound_scans_for_expired_entries_only_once_the_earliest_expires(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full queue holding a message that expires in a day drops what comes over
    its bound without scanning the queue for expired entries each time; once that
    message's expiry has passed, the next one over the bound purges it; a session
    never sent a message with an expiry keeps a plain deque (the fast one).  (A
    scan, ``purge_expired``, is told by what it writes each time: the queue's
    ``next_expiry``, recorded on ``EntryQueue``, not a native class; compiled
    callers call ``purge_expired`` past a patched module name.)"""
    writes: list[float] = []
    slot = EntryQueue.__dict__["next_expiry"]

    def set_expiry(queue: EntryQueue, value: float) -> None:
        writes.append(value)
        slot.__set__(queue, value)

    monkeypatch.setattr(EntryQueue, "next_expiry",
                        property(lambda queue: slot.__get__(queue, EntryQueue), set_expiry))
    session = Session("c", False, Limits(max_queued_messages=2))
    session.enqueue(Message("plain", b"x", 1, False, "pub", 0.0), 1, False)
    assert type(session.queue) is deque
    session.enqueue(Message("day", b"x", 1, False, "pub", 0.0,
                            props=MessageProperties(expiry_interval=86_400)), 1, False)
    for t in range(1, 101):
        session.enqueue(Message("over", b"x", 1, False, "pub", float(t)), 1, False)
    assert type(session.queue) is EntryQueue
    assert writes == [NEVER, 86_400.0] and session.dropped == 100   # (made, the day's)
    session.enqueue(Message("over", b"x", 1, False, "pub", 86_400.0), 1, False)
    assert writes == [NEVER, 86_400.0, NEVER]                        # (one scan)
    assert [e.message.topic for e in session.queue] == ["plain", "over"]


# --------------------------------------------------------------------------
# back-pressure


def test_over_high_water() -> None:
    """Over half the queue bound, or a congested link, while online means slow down."""
    session, link = online(max_inflight=1, max_queued_messages=4)
    assert not session.over_high_water()
    for t in ("a", "b", "c"):
        session.enqueue(msg(t), 1, False)
    assert not session.over_high_water()  # 2 queued: exactly half
    session.enqueue(msg("d"), 1, False)
    assert session.over_high_water()
    session.acknowledge(1)
    assert not session.over_high_water()
    link.congested = True
    assert session.over_high_water()
    session.detach()
    assert not session.over_high_water()


def test_over_high_water_needs_a_queue_a_congested_link_or_extras() -> None:
    """``Router.publish`` asks ``over_high_water`` only of a session with something
    queued (or queued bytes), a congested link or extras: without any of them it is
    False at any bounds that are not negative, 0 included, online or not."""
    for messages, size in ((0, 0), (0, 1), (1, 0), (1_000, 16 << 20)):
        session, link = online(max_queued_messages=messages, max_queued_bytes=size)
        assert not session.queue and not session.queued_bytes and session._extras is None
        assert not link.congested
        assert not session.over_high_water()
        session.detach()
        assert not session.over_high_water()


def test_clear_messages() -> None:
    """clear_messages empties queue, in-flight, packet ids, bytes and inbound ids."""
    session, _link = online(max_inflight=1)
    session.enqueue(msg("a"), 1, False)
    session.enqueue(msg("b"), 1, False)
    session.inbound_add(3)
    session.clear_messages()
    assert not session.queue and not session.inflight and not session._pids
    assert session.queued_bytes == 0
    assert not session.inbound_qos2


def test_held_pubrel_survives_reconnect_until_durable() -> None:
    """A RELEASED entry whose commit is pending is not re-sent on reconnect until durable."""
    session, _link = online(persistent=True)
    session.enqueue(msg("a", qos=2), 2, False)
    session.release_held(1)
    session.received(1)
    session.detach()
    link2 = FakeLink()
    session.attach(link2)
    assert link2.sent == []  # neither PUBLISH nor PUBREL yet
    session.pubrel_durable(1)
    assert link2.sent == [("pubrel", 1)]


def test_sessions_share_one_empty_inflight_window_until_their_first_delivery() -> None:
    """An idle session keeps no in-flight dict of its own (64 bytes each); the
    shared stand-in refuses writes, and the first QoS 1 delivery gets a real one."""
    a, _ = online()
    b, link = online()
    assert a.inflight is b.inflight and not a.inflight
    with pytest.raises(TypeError):
        a.inflight[1] = None  # type: ignore[assignment]
    b.enqueue(msg("t"), 1, False)
    assert list(b.inflight) == [1] and a.inflight is not b.inflight and not a.inflight
    assert link.publishes() == [("publish", "t", 1, 1, False, False)]


def test_sessions_share_one_empty_subscription_map_until_their_first_filter() -> None:
    """Sessions share one read-only empty subscription map until their first filter gives
    them their own."""
    a, _ = online()
    b, _ = online()
    assert a.subscriptions is b.subscriptions and not a.subscriptions
    with pytest.raises(TypeError):
        a.subscriptions["x"] = 1
    with pytest.raises(TypeError):      # (dict's own methods that skip __setitem__)
        a.subscriptions.setdefault("x", 1)
    with pytest.raises(TypeError):
        a.subscriptions.update(x=1)
    assert not b.subscriptions
    b.set_subscription("t/#", 1)
    assert b.subscriptions == {"t/#": 1} and not a.subscriptions


def test_the_kinds_of_drops_are_kept_only_once_a_session_has_one() -> None:
    """A session that never dropped holds no record of the kinds of drops; the first
    drop of a kind makes one, and each kind and the offset read back as written."""
    session = Session("c", False, Limits())
    assert session._extras is None
    assert (session.dropped_congested, session.dropped_rejected) == (0, 0)
    assert session.drop_offset == (0, 0, 0)
    session.drop_offset = (0, 0, 0)       # (the metrics' reset of a session that has none)
    assert session._extras is None
    session.drop_congested("a/b")
    session.dropped_rejected += 2
    session.drop_offset = (1, 1, 2)
    assert (session.dropped, session.dropped_congested, session.dropped_rejected) == (1, 1, 2)
    assert session.drop_offset == (1, 1, 2) and session._extras is not None
    session.drop_congested("$SYS/broker/x")   # the broker's own: not counted
    assert session.dropped_congested == 1


def test_a_session_fits_pymalloc_s_240_byte_class() -> None:
    """A session is 240 bytes with the collector's header (the count of entries that
    may expire is its queue's, ``EntryQueue``): a 256-byte class spaces sessions made
    one after another 16 apart in identity hashes (bench/README.md, idle connections,
    second round).  In the compiled build (setup.py, ``MQTTAMQP_COMPILE=1``) too: a
    session is a native class there (a vtable pointer and a 4-byte attribute bitmap
    more, each flag one byte), which fits only with the two flags declared side by
    side before the bitmap (``InflightWindow``); apart, each padded to a word, it was
    256 bytes."""
    import sys

    assert sys.getsizeof(Session("c", False, Limits())) <= 240

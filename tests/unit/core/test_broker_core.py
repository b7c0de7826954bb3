"""Unit tests for the broker core: routing, retained, sessions, takeover, wills, grace,
$SYS, expiry and back-pressure — with a fake ClientLink, a Clock and NullStore."""

from __future__ import annotations

from typing import Any

import fakes
import pytest
from compiled import logged_failures
from core_broker import FakeLink, connect, make_broker, pub, subscribe, will
from fakes import ManualStore, MemoryStore, NullStore, SnapshotStore
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import SUBSCRIBE_FAILURE, Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import (
    DeleteRetained,
    DeleteSession,
    DeleteWill,
    PutQueued,
    PutRetained,
    PutSession,
    PutSubscription,
    PutWill,
    SessionRecord,
    Snapshot,
    StoredQueued,
)
from mqttamqp.core.sessions.session import SessionState

# --------------------------------------------------------------------------
# routing


def test_delivery_qos_is_min_of_publish_and_granted() -> None:
    """Each subscriber gets min(publish QoS, granted QoS)."""
    broker, _, _ = make_broker()
    s0, l0, _ = connect(broker, "g0")
    s1, l1, _ = connect(broker, "g1")
    s2, l2, _ = connect(broker, "g2")
    subscribe(broker, s0, ("t", 0))
    subscribe(broker, s1, ("t", 1))
    subscribe(broker, s2, ("t", 2))
    pub(broker, "t", qos=2)
    pub(broker, "t", qos=1)
    pub(broker, "t", qos=0)
    assert [s[2] for s in l0.sent] == [0, 0, 0]
    assert [s[2] for s in l1.sent] == [1, 1, 0]
    assert [s[2] for s in l2.sent] == [2, 1, 0]


def test_overlapping_subscriptions_give_one_copy_at_highest_qos() -> None:
    """A session with several matching filters gets the message once, at its highest grant."""
    broker, _, _ = make_broker()
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("a/+", 0), ("a/#", 1), ("a/b", 0), ("#", 0))
    pub(broker, "a/b", b"m", qos=2)
    assert link.sent == [("a/b", b"m", 1, 1, False, False)]


def test_subscribe_codes_and_invalid_filter() -> None:
    """SUBSCRIBE grants min(requested, 2) and refuses invalid filters with 0x80."""
    broker, _, _ = make_broker()
    s, _link, _ = connect(broker, "c")
    assert subscribe(broker, s, ("a", 2), ("a/#/b", 1), ("b", 0)) == [2, SUBSCRIBE_FAILURE, 0]
    assert s.subscriptions == {"a": 2, "b": 0}
    assert len(broker.trie) == 2


def test_unsubscribe_stops_delivery() -> None:
    """After unsubscribe the session gets nothing on that filter."""
    broker, _, _ = make_broker()
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("a", 0))
    broker.unsubscribe(s, ["a", "never-subscribed"])
    pub(broker, "a")
    assert link.sent == []
    assert len(broker.trie) == 0


def test_publish_to_nobody_is_fine() -> None:
    """A message with no subscribers is counted and returns no commit to wait for."""
    broker, _, store = make_broker()
    assert pub(broker, "nobody", qos=1) is None
    assert broker.stats.messages_received == 1
    assert store.submitted == []


# --------------------------------------------------------------------------
# retained


def test_retained_sent_on_subscribe_with_retain_flag() -> None:
    """send_retained delivers matching retained messages with retain=True at min(QoS)."""
    broker, _, _ = make_broker()
    pub(broker, "r/1", b"one", qos=1, retain=True)
    pub(broker, "r/2", b"two", qos=2, retain=True)
    pub(broker, "other", b"no", qos=1, retain=True)
    s, link, _ = connect(broker, "c")
    codes = subscribe(broker, s, ("r/#", 2), ("bad/#/x", 1))
    assert link.sent == []
    broker.send_retained(s, [("r/#", codes[0]), ("bad/#/x", codes[1])])
    assert [(t, p, q, r) for t, p, q, _, _, r in link.sent] == [
        ("r/1", b"one", 1, True), ("r/2", b"two", 2, True)]


def test_retained_qos_capped_by_grant() -> None:
    """A retained QoS 2 message goes to a QoS 0 subscription at QoS 0, retain set."""
    broker, _, _ = make_broker()
    pub(broker, "r", b"v", qos=2, retain=True)
    s, link, _ = connect(broker, "c")
    codes = subscribe(broker, s, ("r", 0))
    broker.send_retained(s, [("r", codes[0])])
    assert link.sent == [("r", b"v", 0, None, False, True)]


def test_forwarded_retained_publish_has_retain_clear() -> None:
    """A retained PUBLISH to existing subscribers is forwarded with retain=False, and stored."""
    broker, _, store = make_broker()
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("r", 1))
    pub(broker, "r", b"v", qos=1, retain=True)
    assert link.sent == [("r", b"v", 1, 1, False, False)]
    stored = broker.retained.get("r")
    assert stored is not None and stored.payload == b"v" and stored.retain
    assert PutRetained(Message("r", b"v", 1, True, "p", 0.0)) in store.submitted


def test_empty_retained_payload_deletes() -> None:
    """A retained PUBLISH with an empty payload removes the retained message of that topic."""
    broker, _, store = make_broker()
    pub(broker, "r", b"v", retain=True)
    pub(broker, "r", b"", retain=True)
    assert broker.retained.get("r") is None
    assert len(broker.retained) == 0
    assert DeleteRetained("r") in store.submitted
    s, link, _ = connect(broker, "c")
    codes = subscribe(broker, s, ("r", 0))
    broker.send_retained(s, [("r", codes[0])])
    assert link.sent == []


def test_empty_retained_payload_for_unknown_topic_stores_nothing() -> None:
    """Deleting a retained message that does not exist issues no store operation."""
    broker, _, store = make_broker()
    pub(broker, "r", b"", retain=True)
    assert store.submitted == []


# --------------------------------------------------------------------------
# clean and persistent sessions


def test_clean_session_is_discarded_on_end() -> None:
    """A clean session loses its subscriptions when its connection ends."""
    broker, _, _ = make_broker()
    s, link, present = connect(broker, "c", clean=True)
    assert present is False
    subscribe(broker, s, ("a", 1))
    broker.end_session(link, s, clean=True, reason="bye")
    assert "c" not in broker.sessions
    assert len(broker.trie) == 0
    s2, _link2, present2 = connect(broker, "c", clean=True)
    assert present2 is False
    assert s2.subscriptions == {}


def test_persistent_session_queues_while_offline_and_delivers_on_return() -> None:
    """A persistent session keeps subscriptions, queues QoS 1/2 offline and delivers on return."""
    broker, clock, store = make_broker()
    s, link, present = connect(broker, "p", clean=False)
    assert present is False
    assert PutSession("p", clock.seconds()) in store.submitted
    subscribe(broker, s, ("a", 2))
    assert PutSubscription("p", "a", 2) in store.submitted
    broker.end_session(link, s, clean=True, reason="bye")
    assert s.state is SessionState.OFFLINE
    pub(broker, "a", b"1", qos=1)
    pub(broker, "a", b"0", qos=0)
    pub(broker, "a", b"2", qos=2)
    assert link.sent == []
    assert any(isinstance(op, PutQueued) for op in store.submitted)
    s2, link2, present2 = connect(broker, "p", clean=False)
    assert s2 is s and present2 is True
    assert [(p, q) for _, p, q, _, _, _ in link2.sent] == [(b"1", 1), (b"2", 2)]


def test_clean_connect_discards_persistent_session() -> None:
    """Connecting with clean session to a persistent one discards it (DeleteSession)."""
    broker, _, store = make_broker()
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    broker.end_session(link, s, clean=True, reason="bye")
    pub(broker, "a", qos=1)
    s2, link2, present = connect(broker, "p", clean=True)
    assert present is False and s2 is not s
    assert DeleteSession("p") in store.submitted
    assert len(broker.trie) == 0
    assert link2.sent == []
    assert s2.persistent is False


def test_persistent_delivery_waits_for_commit() -> None:
    """A QoS 2 delivery to a persistent session is sent only after its PutQueued is durable."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, link, _ = connect(broker, "p", clean=False)
    store.commit_all()
    subscribe(broker, s, ("a", 2))
    store.commit_all()
    d = pub(broker, "a", b"m", qos=2)
    assert d is not None
    assert link.sent == []
    store.commit_all()
    assert link.sent == [("a", b"m", 2, 1, False, False)]


def test_persistent_qos1_delivery_does_not_wait_but_puback_does() -> None:
    """QoS 1 to a persistent session goes out at once; the publisher's Deferred waits."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, link, _ = connect(broker, "p", clean=False)
    store.commit_all()
    subscribe(broker, s, ("a", 1))
    store.commit_all()
    d = pub(broker, "a", b"m", qos=1)
    assert d is not None and not d.called
    assert link.sent == [("a", b"m", 1, 1, False, False)]
    store.commit_all()
    assert d.called


def test_end_session_by_other_connection_is_ignored() -> None:
    """end_session from a connection that no longer holds the session does nothing."""
    broker, _, _ = make_broker()
    s, _link, _ = connect(broker, "c", will=will("c"))
    broker.end_session(FakeLink("stranger"), s, clean=False, reason="x")
    assert s.online
    assert "c" in broker.wills


# --------------------------------------------------------------------------
# takeover


def test_takeover_closes_old_link_and_fires_its_will() -> None:
    """A second connection with the same client id closes the first and publishes its will."""
    broker, _, _ = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/#", 0))
    _s1, old, _ = connect(broker, "c", will=will("c", payload=b"old-will"))
    s2, new, _ = connect(broker, "c", will=will("c", payload=b"new-will"))
    assert len(old.closed) == 1
    assert new.closed == []
    assert wlink.sent == [("will/t", b"old-will", 0, None, False, False)]
    assert broker.wills["c"].payload == b"new-will"
    assert broker.sessions["c"] is s2
    assert s2.connection is new


def test_takeover_of_persistent_session_redelivers_inflight() -> None:
    """Taking over a persistent session resends its unacknowledged messages with DUP."""
    broker, _, _ = make_broker()
    s1, old, _ = connect(broker, "p", clean=False)
    subscribe(broker, s1, ("a", 1))
    pub(broker, "a", b"m", qos=1)
    assert old.sent == [("a", b"m", 1, 1, False, False)]
    s2, new, present = connect(broker, "p", clean=False)
    assert s2 is s1 and present is True
    assert old.closed
    assert new.sent == [("a", b"m", 1, 1, True, False)]


def test_takeover_does_not_double_end() -> None:
    """After takeover, the old connection's own end_session is a no-op (no second will)."""
    broker, _, _ = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/#", 0))
    s1, old, _ = connect(broker, "c", will=will("c"))
    s2, _new, _ = connect(broker, "c", will=will("c", payload=b"second"))
    broker.end_session(old, s1, clean=False, reason="old socket finally closed")
    assert len(wlink.sent) == 1
    assert s2.online and broker.wills["c"].payload == b"second"


# --------------------------------------------------------------------------
# wills


def test_will_fires_on_unclean_end() -> None:
    """end_session(clean=False) publishes the will and deletes it."""
    broker, _, store = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 1))
    s, link, _ = connect(broker, "c", will=will("c", qos=1, retain=True))
    assert PutWill(will("c", qos=1, retain=True)) in store.submitted
    broker.end_session(link, s, clean=False, reason="lost")
    assert wlink.sent == [("will/t", b"bye", 1, 1, False, False)]
    assert "c" not in broker.wills
    assert DeleteWill("c") in store.submitted
    retained = broker.retained.get("will/t")
    assert retained is not None and retained.payload == b"bye"
    assert broker.stats.wills_published == 1


def test_will_not_fired_on_clean_end() -> None:
    """end_session(clean=True) (DISCONNECT) deletes the will without publishing it."""
    broker, _, store = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    s, link, _ = connect(broker, "c", will=will("c"))
    broker.end_session(link, s, clean=True, reason="DISCONNECT")
    assert wlink.sent == []
    assert "c" not in broker.wills
    assert DeleteWill("c") in store.submitted


def test_reconnect_without_will_deletes_old_will() -> None:
    """A new CONNECT without a will replaces a stored will by nothing."""
    broker, _, store = make_broker(SnapshotStore(Snapshot(wills={"p": will("p")})))
    broker.start()
    assert "p" in broker.wills
    connect(broker, "p", clean=False)
    assert "p" not in broker.wills
    assert DeleteWill("p") in store.submitted


def test_invalid_will_topic_is_ignored() -> None:
    """A will whose topic is not a valid topic name is not stored."""
    broker, _, _ = make_broker()
    connect(broker, "c", will=will("c", topic="a/+"))
    assert "c" not in broker.wills


def test_stopping_suppresses_wills() -> None:
    """While stopping, connections end without publishing wills (kept for the grace rule)."""
    broker, _, store = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    s, link, _ = connect(broker, "c", clean=False, will=will("c"))
    n = len(store.submitted)
    broker.shutdown()
    broker.end_session(link, s, clean=False, reason="shutdown")
    assert wlink.sent == []
    assert "c" in broker.wills
    assert s.state is SessionState.OFFLINE
    assert len(store.submitted) == n


def test_disconnect_client_with_and_without_will() -> None:
    """The console's disconnect closes the link and fires the will only when asked."""
    broker, _, _ = make_broker()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    _, l1, _ = connect(broker, "a", will=will("a"))
    _, l2, _ = connect(broker, "b", will=will("b", payload=b"b-will"))
    assert broker.commands.disconnect_client("a", with_will=False, reason="op") is True
    assert broker.commands.disconnect_client("b", with_will=True, reason="op") is True
    assert l1.closed == ["op"] and l2.closed == ["op"]
    assert wlink.topics() == ["will/t"] and wlink.sent[0][1] == b"b-will"
    assert broker.commands.disconnect_client("nobody", with_will=True, reason="op") is False


# --------------------------------------------------------------------------
# grace wills after a restart


def grace_broker(**limits: Any) -> tuple[Broker, Clock, NullStore]:
    snap = Snapshot(wills={"w": will("w", payload=b"orphan")})
    limits.setdefault("sys_interval", 0)
    return make_broker(SnapshotStore(snap), will_grace=10.0, **limits)


def test_orphan_will_fires_after_grace() -> None:
    """A will loaded at start fires after will_grace if its client does not come back."""
    broker, clock, store = grace_broker()
    broker.start()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    clock.advance(9.99)
    assert wlink.sent == []
    clock.advance(0.02)
    assert wlink.sent == [("will/t", b"orphan", 0, None, False, False)]
    assert "w" not in broker.wills
    assert DeleteWill("w") in store.submitted
    assert clock.getDelayedCalls() == []


def test_orphan_will_cancelled_when_client_returns() -> None:
    """open_session for the will's owner within the grace period cancels the orphan will."""
    broker, clock, store = grace_broker()
    broker.start()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    clock.advance(5)
    _s, _link, _ = connect(broker, "w")
    assert clock.getDelayedCalls() == []
    clock.advance(100)
    assert wlink.sent == []
    assert "w" not in broker.wills
    assert DeleteWill("w") in store.submitted


def test_returning_client_new_will_replaces_orphan() -> None:
    """A client back within grace with a new will: only the new will fires when it drops."""
    broker, clock, _ = grace_broker()
    broker.start()
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    s, link, _ = connect(broker, "w", will=will("w", payload=b"fresh"))
    clock.advance(20)
    assert wlink.sent == []
    broker.end_session(link, s, clean=False, reason="lost")
    assert [p for _, p, *_ in wlink.sent] == [b"fresh"]


def test_stop_cancels_grace_timers_and_loops() -> None:
    """stop() leaves no delayed calls behind."""
    broker, clock, _ = grace_broker(sys_interval=5, session_expiry=30)
    broker.start()
    assert clock.getDelayedCalls() != []
    broker.stop()
    assert clock.getDelayedCalls() == []


def test_start_restores_sessions_and_retained() -> None:
    """start() rebuilds persistent sessions (subscriptions, queue) and retained messages."""
    m = Message("a", b"q", 1, False, "p", 0.0)
    record = SessionRecord("p", 5.0, {"a": 1}, [(3, StoredQueued(m, 1, "sent", 7))], {9})
    snap = Snapshot(retained={"r": Message("r", b"v", 0, True)}, sessions={"p": record})
    broker, _clock, _ = make_broker(SnapshotStore(snap), sys_interval=0)
    broker.start()
    assert broker.retained.get("r") is not None
    assert broker.trie.match("a") == {broker.sessions["p"]: 1}
    s, link, present = connect(broker, "p", clean=False)
    assert present is True
    assert link.sent == [("a", b"q", 1, 7, True, False)]
    assert s.inbound_seen(9)


# --------------------------------------------------------------------------
# $SYS


def test_sys_topics_published_on_start_and_every_interval() -> None:
    """$SYS/broker/* is published (retained) at start and again every sys_interval."""
    broker, clock, store = make_broker(sys_interval=5)
    broker.start()
    uptime = broker.retained.get("$SYS/broker/uptime")
    assert uptime is not None and uptime.payload == b"0 seconds"
    assert broker.retained.get("$SYS/broker/version") is not None
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("$SYS/broker/uptime", 0), ("#", 0))
    clock.advance(4.9)
    assert link.sent == []
    clock.advance(0.1)
    assert link.sent == [("$SYS/broker/uptime", b"5 seconds", 0, None, False, False)]
    clock.advance(5)
    assert link.topics() == ["$SYS/broker/uptime"] * 2
    # $SYS retained messages are not written to the store.
    assert not any(isinstance(op, PutRetained) for op in store.submitted)
    broker.stop()
    assert clock.getDelayedCalls() == []


def test_sys_off_when_interval_zero() -> None:
    """sys_interval=0 publishes no $SYS topics and arms no loop."""
    broker, clock, _ = make_broker(sys_interval=0)
    broker.start()
    assert len(broker.retained) == 0
    assert clock.getDelayedCalls() == []


def test_sys_counts_dropped_messages() -> None:
    """$SYS/broker/messages/dropped reports messages dropped by session bounds."""
    broker, _clock, _ = make_broker(sys_interval=5, max_queued_messages=1, max_inflight=1)
    s, _link, _ = connect(broker, "c")
    subscribe(broker, s, ("a", 1))
    for _ in range(4):
        pub(broker, "a", qos=1)
    broker.start()
    dropped = broker.retained.get("$SYS/broker/messages/dropped")
    assert dropped is not None and dropped.payload == b"2"


# --------------------------------------------------------------------------
# session expiry


def test_offline_persistent_session_expires() -> None:
    """A persistent session offline longer than session_expiry is discarded by the loop."""
    broker, clock, store = make_broker(sys_interval=0, session_expiry=100)
    broker.start()
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    keep, _klink, _ = connect(broker, "online", clean=False)
    subscribe(broker, keep, ("a", 1))
    broker.end_session(link, s, clean=True, reason="bye")
    clock.advance(60)
    assert "p" in broker.sessions
    clock.advance(60)
    assert "p" not in broker.sessions
    assert DeleteSession("p") in store.submitted
    assert broker.trie.match("a") == {keep: 1}
    assert "online" in broker.sessions
    broker.stop()
    assert clock.getDelayedCalls() == []


def test_no_expiry_when_zero() -> None:
    """session_expiry=0 keeps offline persistent sessions forever."""
    broker, clock, _ = make_broker(sys_interval=0, session_expiry=0)
    broker.start()
    s, link, _ = connect(broker, "p", clean=False)
    broker.end_session(link, s, clean=True, reason="bye")
    clock.advance(10 ** 7)
    assert "p" in broker.sessions


# --------------------------------------------------------------------------
# back-pressure


def test_congested_for_true_when_online_subscriber_link_congested() -> None:
    """congested_for(topic) is true while an online subscriber of that topic is congested."""
    broker, _, _ = make_broker()
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("a/#", 1))
    assert broker.router.congested_for("a/b") is False
    link.congested = True
    assert broker.router.congested_for("a/b") is True
    assert broker.router.congested_for("other") is False
    link.congested = False
    assert broker.router.congested_for("a/b") is False


def test_congested_for_ignores_offline_sessions() -> None:
    """An offline persistent subscriber never makes publishers wait."""
    broker, _, _ = make_broker(max_queued_messages=2)
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    broker.end_session(link, s, clean=True, reason="bye")
    for _ in range(5):
        pub(broker, "a", qos=1)
    assert broker.router.congested_for("a") is False


def test_publish_says_which_subscribers_are_over_high_water() -> None:
    """A publish names the subscribers over their high-water mark (a congested link,
    a queue past half its bound) and only those: the router asks each session that
    has something queued or a congested link (``Router.publish``)."""
    broker, _, _ = make_broker(max_inflight=1, max_queued_messages=3)
    s1, link1, _ = connect(broker, "c1")
    s2, _link2, _ = connect(broker, "c2")
    s3, _link3, _ = connect(broker, "c3")
    for s in (s1, s2, s3):
        subscribe(broker, s, ("a", 1))
    assert not broker.publish(Message("a", b"x", 1, False, "p", 0.0)).congested
    link1.congested = True
    for _ in range(2):   # (s2: two queued, past half of three)
        s2.deliver(Message("b", b"y", 1, False, "p", 0.0), 1, False)
    # (QoS 0: nothing queued for the congested s1, named for its link alone)
    result = broker.publish(Message("a", b"x", 0, False, "p", 0.0))
    assert not s1.queue
    assert set(result.congested) == {s1, s2}


class _Over:
    """A backlog bound (a bridge's ``on-full = "block"``) that says it is over."""

    def __init__(self) -> None:
        self.asked = 0

    def over(self, session: object) -> bool:
        self.asked += 1
        return True


def test_publish_names_a_subscriber_held_by_its_backlog_bound_alone() -> None:
    """A subscriber with nothing queued and an uncongested link, but a backlog bound
    that is over, is named over its high-water mark: the router asks a session with
    extras (``Router.publish``'s guard), and the bound is asked once a publish."""
    broker, _, _ = make_broker()
    s1, _link1, _ = connect(broker, "c1")
    s2, _link2, _ = connect(broker, "c2")
    for s in (s1, s2):
        subscribe(broker, s, ("a", 0))
    bound = _Over()
    s1.backlog_bound = bound
    result = broker.publish(Message("a", b"x", 0, False, "p", 0.0))
    assert not s1.queue and list(result.congested) == [s1]
    assert bound.asked == 1


def test_paused_publishers_resumed_when_drained() -> None:
    """A paused publisher is resumed by link_drained once no session is over high water."""
    broker, _, _ = make_broker()
    s, link, _ = connect(broker, "c")
    subscribe(broker, s, ("a", 1))
    link.congested = True
    pub(broker, "a", qos=1)
    resumed: list[int] = []
    broker.pause_until_drained(1, lambda: resumed.append(1))
    broker.link_drained(None)
    assert resumed == []
    link.congested = False
    broker.link_drained(s)
    assert resumed == [1]
    assert link.topics() == ["a"]


# --------------------------------------------------------------------------
# restart through an in-memory store that applies the ops


def restart(broker: Broker, clock: Clock, store: MemoryStore) -> Broker:
    """Stop ``broker`` as the service does (stopping, close connections) and start a new one."""
    broker.shutdown()
    for session in list(broker.sessions.values()):
        if session.connection is not None:
            broker.end_session(session.connection, session, clean=False, reason="shutdown")
    broker.stop()
    new = Broker(clock, store, broker.limits)
    new.start()
    return new


def test_will_of_client_connected_at_shutdown_fires_after_grace_on_restart() -> None:
    """A client connected at shutdown has its will published after will_grace at restart."""
    store = MemoryStore()
    broker, clock, _ = make_broker(store, sys_interval=0, will_grace=10)
    connect(broker, "c", will=will("c", payload=b"after-restart"))
    broker = restart(broker, clock, store)
    watcher, wlink, _ = connect(broker, "watcher")
    subscribe(broker, watcher, ("will/t", 0))
    clock.advance(10 + 0.01)
    assert [p for _, p, *_ in wlink.sent] == [b"after-restart"]
    assert store.state.wills == {}


def test_qos2_packet_id_survives_restart() -> None:
    """A QoS 2 message queued for a persistent session keeps its packet id across a restart."""
    store = MemoryStore()
    broker, clock, _ = make_broker(store, sys_interval=0)
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 2))
    pub(broker, "a", b"m", qos=2)
    assert link.sent == [("a", b"m", 2, 1, False, False)]
    broker.received(s, 1)
    assert link.pubrels == [1]
    broker = restart(broker, clock, store)
    s2, link2, present = connect(broker, "p", clean=False)
    assert present is True
    assert link2.pubrels == [1]  # resumed at PUBREL, same id
    broker.completed(s2, 1)
    assert store.state.sessions["p"].queue == []


def test_session_online_until_shutdown_not_expired_at_restart() -> None:
    """A session online until shutdown is not expired at restart as if offline since connect."""
    store = MemoryStore()
    broker, clock, _ = make_broker(store, sys_interval=0, session_expiry=100)
    s, _link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    clock.advance(500)  # connected the whole time
    broker = restart(broker, clock, store)
    assert "p" in broker.sessions
    clock.advance(50)
    assert "p" in broker.sessions


def test_qos1_publish_completes_when_persistent_subscriber_acks_before_commit() -> None:
    """A PUBACK may go once every persistent subscriber acknowledged, before the commit."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, _link, _ = connect(broker, "p", clean=False)
    store.commit_all()
    subscribe(broker, s, ("a", 1))
    store.commit_all()
    d = pub(broker, "a", b"m", qos=1)
    assert d is not None and not d.called
    broker.acknowledged(s, 1)
    assert d.called


def test_qos1_publish_queued_behind_the_window_completes_when_acknowledged() -> None:
    """A QoS 1 delivery to an online persistent subscriber that waits behind its full
    in-flight window is answered as a sent one is: once the subscriber acknowledged
    it (after the window freed and it was sent), before the commit."""
    store = ManualStore()
    broker, _, _ = make_broker(store, max_inflight=1)
    s, link, _ = connect(broker, "p", clean=False)
    store.commit_all()
    subscribe(broker, s, ("a", 1))
    store.commit_all()
    d1 = pub(broker, "a", b"m1", qos=1)
    d2 = pub(broker, "a", b"m2", qos=1)
    assert d1 is not None and d2 is not None and s.queue
    broker.acknowledged(s, 1)
    assert d1.called and not d2.called
    assert [p for _, p, *_ in link.sent] == [b"m1", b"m2"]
    broker.acknowledged(s, 2)
    assert d2.called and store.pending     # (nothing committed yet)


def test_batched_qos1_publish_completes_early_and_the_commit_does_not_fire_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a batch (one socket read) the same early completion holds; the commit
    that follows neither fires it twice nor fails; a failing commit after it is
    logged, not raised."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, _link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    store.commit_all()
    broker.begin_batch()
    d1 = pub(broker, "a", b"m1", qos=1)
    d2 = pub(broker, "a", b"m2", qos=1)
    broker.end_batch()
    assert d1 is not None and d2 is not None and not d1.called and not d2.called
    broker.acknowledged(s, 1)
    assert d1.called and not d2.called
    store.commit_all()        # the commit fires d2, leaves d1 alone (no AlreadyCalled)
    assert d2.called
    logged = logged_failures(monkeypatch)
    broker.begin_batch()
    d3 = pub(broker, "a", b"m3", qos=1)
    broker.end_batch()
    broker.acknowledged(s, 3)
    assert d3 is not None and d3.called
    _ops, commit = store.pending.pop(0)
    commit.errback(RuntimeError("disk full"))
    assert logged == ["storing messages that were already acknowledged"]


def test_qos1_publish_to_offline_persistent_session_waits_for_commit() -> None:
    """With a persistent subscriber offline the publisher's Deferred waits for the commit."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, link, _ = connect(broker, "p", clean=False)
    store.commit_all()
    subscribe(broker, s, ("a", 1))
    store.commit_all()
    broker.end_session(link, s, clean=True, reason="bye")
    store.commit_all()
    d = pub(broker, "a", b"m", qos=1)
    assert d is not None and not d.called
    store.commit_all()
    assert d.called


def test_nothing_is_acknowledged_while_stopping() -> None:
    """Once the broker is stopping, a publish that needs storing never completes."""
    broker, _, _ = make_broker()
    s, link, _ = connect(broker, "p", clean=False)
    subscribe(broker, s, ("a", 1))
    broker.end_session(link, s, clean=True, reason="offline")
    broker.shutdown()
    d = pub(broker, "a", b"m", qos=1)
    assert d is not None and not d.called


def test_mqtt_connection_leaves_an_amqp_will_of_the_same_name_alone() -> None:
    """An MQTT client named like an AMQP will link neither deletes nor fires that will."""
    broker, _, _ = make_broker()
    amqp_will = WillMessage("dev1", "w/amqp", b"gone", 0, False, "amqp")
    broker.set_will(amqp_will)
    s, link, _ = connect(broker, "dev1")  # CONNECT without a will
    assert broker.wills["dev1"] is amqp_will
    broker.end_session(link, s, clean=False, reason="socket lost")
    assert broker.wills["dev1"] is amqp_will
    assert broker.commands.fire_will("dev1", "link detached with an error", "amqp")
    assert "dev1" not in broker.wills


# --------------------------------------------------------------------------
# sessions the subscription service creates


def test_subscribe_client_creates_an_offline_persistent_session() -> None:
    """AMQP_SUBSCRIBE for an unknown client id: an offline persistent session holding the
    subscription, stored, that a later persistent CONNECT resumes (session present)."""
    broker, _, store = make_broker()
    session, codes, d = broker.gateway.subscribe_client("dev", Identity("app"), [("dev/cmd", 1)])
    assert codes == [1] and d is not None
    assert session.persistent and session.connection is None
    assert PutSession("dev", 1000.0) in store.submitted
    assert PutSubscription("dev", "dev/cmd", 1) in store.submitted
    pub(broker, "dev/cmd", b"go", qos=1)
    resumed, link, present = connect(broker, "dev", clean=False)
    assert present and resumed is session
    assert link.sent == [("dev/cmd", b"go", 1, 1, False, False)]  # queued, never sent: no DUP


def test_list_subscriptions_opens_the_session_once() -> None:
    """AMQP_LIST for an unknown client id opens its persistent session (stored once)."""
    broker, _, store = make_broker()
    subscriptions, d = broker.gateway.list_subscriptions("dev")
    assert subscriptions == {} and d is not None
    assert broker.sessions["dev"].persistent
    again, d2 = broker.gateway.list_subscriptions("dev")
    assert again == {} and d2 is None
    assert store.submitted.count(PutSession("dev", 1000.0)) == 1


def test_subscribe_client_refused_entirely_creates_no_session() -> None:
    """AMQP_SUBSCRIBE whose every filter is refused leaves no session behind (and stores
    nothing): a device connecting later finds no session."""
    broker, _, store = make_broker()
    session, codes, d = broker.gateway.subscribe_client("dev", Identity("app"), [("a/#/b", 1)])
    assert (session, codes, d) == (None, [0x80], None)
    assert "dev" not in broker.sessions and store.submitted == []


def test_clear_session_answer_fails_when_its_commit_fails() -> None:
    """The console's clear-session answers only once the deletion is durable: when the
    commit holding it fails, so does the answer."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    s, link, _ = connect(broker, "dev", clean=False)
    broker.end_session(link, s, clean=True, reason="bye")
    store.commit_all()
    d = broker.commands.clear_session("dev", "console")
    assert d is not None
    outcome: list[object] = []
    d.addCallbacks(outcome.append, outcome.append)
    for ops, commit in list(store.pending):
        if any(isinstance(op, DeleteSession) for op in ops):
            commit.errback(RuntimeError("disk full"))
        else:
            commit.callback(None)
    assert len(outcome) == 1 and isinstance(outcome[0], Failure)


def test_storage_health_is_not_flipped_by_empty_commits() -> None:
    """A barrier (an empty commit) touches no storage: while real commits fail it
    neither reports a recovery nor logs again (found in review)."""
    from twisted.internet.defer import fail, succeed

    from mqttamqp.core.commits import CommitBatcher
    from mqttamqp.core.persistence import DeleteRetained

    class DiskFull:
        def submit(self, ops: Any) -> Any:
            return fail(OSError(28, "No space left on device")) if ops else succeed(None)

    commits = CommitBatcher(DiskFull())  # type: ignore[arg-type]
    commits.persist([DeleteRetained("a")]).addErrback(lambda _: None)
    assert commits.failing
    commits.barrier()
    assert commits.failing and commits.stats.storage_failures == 1
    commits.persist([DeleteRetained("b")]).addErrback(lambda _: None)
    assert commits.stats.storage_failures == 2


def test_a_watched_failure_that_is_not_storage_is_logged(log_lines: list[str]) -> None:
    """Failed commits are logged once per failing spell; any other failure nobody
    waits for (a fault of ours) is still logged, with its traceback."""
    from twisted.internet.defer import fail

    from mqttamqp.core.commits import CommitBatcher

    commits = CommitBatcher(fakes.NullStore())
    commits.watch(fail(RuntimeError("a bug")), "doing something")
    assert any("failed while doing something" in line for line in log_lines)


def test_a_recorder_that_wants_no_messages_is_not_called_per_message() -> None:
    """Webhooks on events only (records_messages False, changeable at SIGHUP): the
    router skips the per-message call and its arguments."""
    calls: list[str] = []

    class Events:
        records_messages = False

        def message(self, *args: Any) -> None:
            calls.append("message")

        def event(self, timestamp: float, kind: str, client_id: str | None,
                  **fields: object) -> None:
            calls.append(kind)

        def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                         names: tuple[str, ...], values: tuple[object, ...]) -> None:
            calls.append(kind)

        def stats(self) -> dict[str, int]:
            return {}

    recorder = Events()
    clock = Clock()
    broker = Broker(clock, NullStore(), Limits(), recorder=recorder)
    broker.start()
    pub(broker, "t/1")
    assert "message" not in calls
    recorder.records_messages = True       # (a hook on messages was added)
    pub(broker, "t/2")
    assert calls.count("message") == 1


def test_a_will_delay_does_not_hold_readiness() -> None:
    """A will waiting out its MQTT 5 delay is not a will in grace (readiness does not
    wait for it), and its owner's return cancels it."""
    from amqp_memory import Net

    net = Net()
    wills = net.broker._wills
    wills.fire_later("dev", 3600, "connection lost", "lost")
    assert net.broker.wills_in_grace == 0
    assert wills.owner_returned("dev")


def test_the_adapters_port_stays_under_40_methods() -> None:
    """Broker is the port protocol adapters use: its own methods (not the parts it
    hands out, nor the state it shows) stay under 40 (issue 25)."""
    broker = Broker(Clock(), NullStore(), Limits(sys_interval=0))
    parts = {"gate", "gateway", "commands", "queues", "router", "registry", "sys_topics",
             "publishing", "transactions", "settlement",
             "view", "client_debug", "topic_stats", "clock", "store", "limits",
             "authenticator", "authorizer", "recorder", "stats", "sessions",
             "link_subscribers", "connections", "wills", "retained", "trie", "log"}
    port = [name for name in dir(broker) if not name.startswith("_") and name not in parts]
    assert len(port) < 40, port


def test_a_broker_built_without_guards_bans_nobody_and_keeps_no_ban() -> None:
    """Without ``guards`` (no ``mqttamqp.security``), nobody is banned and setting a
    ban is refused rather than forgotten."""
    broker = Broker(Clock(), NullStore(), Limits(sys_interval=0))
    assert broker.gate.banned("MQTT", "c", "u", "10.0.0.1:1") is None
    with pytest.raises(ValueError):
        broker.commands.ban("client_id", "c", None, "", "admin")
    assert broker.view.bans() == []

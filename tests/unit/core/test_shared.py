"""Shared subscriptions ``$share/<group>/<filter>`` (issue 11), from MQTT 3.1.1
clients, in memory: the broker's own protocol objects on one Clock."""

from __future__ import annotations

from collections import Counter

import pytest
from amqp_memory import Net
from fakes import MemoryStore

from mqttamqp.core.message import Message
from mqttamqp.core.routing.shared import parse_share
from mqttamqp.mqtt.packets import Puback, Publish, Pubrec, Pubrel, Unsubscribe


def test_parse_share() -> None:
    """$share/<group>/<filter> parses into group and filter; a missing or bad group or
    filter is an error."""
    assert parse_share("a/b") is None
    assert parse_share("$share/g/a/#") == ("g", "a/#")
    assert isinstance(parse_share("$share/g"), str)
    assert isinstance(parse_share("$share//a"), str)
    assert isinstance(parse_share("$share/g+/a"), str)


def _payloads(peer: object) -> list[bytes]:
    return [p.payload for p in peer.publishes()]  # type: ignore[attr-defined]


def test_each_message_goes_to_one_member_round_robin() -> None:
    """Each message goes to one member of the group in turn, while plain subscriptions
    still get every message."""
    net = Net()
    members = [net.mqtt(f"w{i}") for i in range(3)]
    for m in members:
        assert m.subscribe(("$share/workers/jobs/#", 1)) == (1,)
    plain = net.mqtt("watcher")
    assert plain.subscribe(("jobs/#", 0)) == (0,)
    pub = net.mqtt("producer")
    for i in range(9):
        pub.publish(f"jobs/{i}", b"%d" % i, qos=1)
    got = [_payloads(m) for m in members]
    assert [len(g) for g in got] == [3, 3, 3]
    assert sorted(p for g in got for p in g) == sorted(b"%d" % i for i in range(9))
    assert len(_payloads(plain)) == 9          # a plain subscription still gets all
    group = net.broker.router.groups.shared["$share/workers/jobs/#"]
    assert group.counts == {"w0": 3, "w1": 3, "w2": 3}


def test_retained_messages_are_not_sent_on_a_shared_subscription() -> None:
    """A shared subscription gets no retained messages."""
    net = Net()
    net.mqtt("p").publish("jobs/kept", b"retained", qos=0, retain=True)
    member = net.mqtt("w")
    member.subscribe(("$share/g/jobs/#", 0))
    assert _payloads(member) == []


def test_malformed_shared_filters_are_refused() -> None:
    """A shared filter without a topic filter gets 0x80; the valid one beside it is
    granted."""
    net = Net()
    # ($share/g+/a is a malformed filter for MQTT itself: the connection is closed)
    assert net.mqtt("w").subscribe(("$share/g", 0), ("$share/g/a/#", 0)) == (0x80, 0)


def test_unacknowledged_messages_move_when_a_member_leaves() -> None:
    """A member that leaves without PUBACK hands its unacknowledged messages to the other
    members."""
    net = Net()
    a, b = net.mqtt("a"), net.mqtt("b")
    for m in (a, b):
        m.subscribe(("$share/g/t", 1))
    pub = net.mqtt("p")
    for i in range(4):
        pub.publish("t", b"%d" % i, qos=1)
    got_a = a.publishes()
    got_b = _payloads(b)
    assert len(got_a) == 2 and len(got_b) == 2
    a.disconnect()                             # without PUBACK: a's two move to b
    moved = _payloads(b)
    assert sorted(moved) == sorted(p.payload for p in got_a)


def test_an_offline_persistent_member_keeps_messages_only_when_nobody_is_online() -> None:
    """A persistent member that is offline takes QoS 1 messages only while no member
    is online; a member that comes online later gets them (moved, not copied)."""
    net = Net(store=MemoryStore())
    away = net.mqtt("away", clean=False)
    away.subscribe(("$share/g/t", 1))
    away.disconnect()
    pub = net.mqtt("p")
    pub.publish("t", b"queued for away", qos=1)   # nobody online: away keeps it
    assert len(list(net.broker.sessions["away"].entries())) == 1
    here = net.mqtt("here")
    here.subscribe(("$share/g/t", 1))             # ...until a member with room is online
    pub.publish("t", b"for here", qos=1)          # someone online: not queued offline
    assert _payloads(here) == [b"queued for away", b"for here"]
    back = net.mqtt("away", clean=False)
    assert _payloads(back) == []


def test_shared_subscriptions_survive_a_restart() -> None:
    """A persistent session's shared subscription survives a restart and gets what was
    published after it."""
    store = MemoryStore()
    net = Net(store=store)
    m = net.mqtt("durable", clean=False)
    m.subscribe(("$share/g/t", 1))
    m.disconnect()
    net2 = Net(store=store)
    assert "$share/g/t" in net2.broker.router.groups.shared
    net2.mqtt("p").publish("t", b"after restart", qos=1)
    assert _payloads(net2.mqtt("durable", clean=False)) == [b"after restart"]


@pytest.mark.parametrize("strategy", ["hash-client", "sticky"])
def test_strategies_keep_a_publisher_on_one_member(strategy: str) -> None:
    """With the hash-client and sticky strategies one publisher's messages all go to one
    member."""
    net = Net(share_strategy=strategy)
    members = [net.mqtt(f"m{i}") for i in range(3)]
    for m in members:
        m.subscribe(("$share/g/t", 0))
    pub = net.mqtt("one-publisher")
    for i in range(6):
        pub.publish("t", b"%d" % i)
    counts = Counter(len(_payloads(m)) for m in members)
    assert counts == Counter({6: 1, 0: 2})


def test_qos1_to_a_member_is_acknowledged_once() -> None:
    """A QoS 1 message to a member leaves nothing in flight once it is acknowledged."""
    net = Net()
    a = net.mqtt("a")
    a.subscribe(("$share/g/t", 1))
    net.mqtt("p").publish("t", b"x", qos=1)
    [msg] = a.publishes()
    assert isinstance(msg, Publish) and msg.qos == 1
    a.send(Puback(msg.packet_id))
    assert not net.broker.sessions["a"].inflight


def test_dollar_filters_are_never_shared() -> None:
    """Review finding: $share/<g>/$dynamic/... would have read every AMQP reply node."""
    net = Net()
    assert net.mqtt("w").subscribe(("$share/x/$dynamic/+", 0), ("$share/x/$SYS/#", 0)
                                   ) == (0x80, 0x80)


def test_a_moved_message_stays_when_the_other_member_has_no_room() -> None:
    """Review finding: moving a leaving member's message must not lose it when the
    other member's queue is full: it stays (stored) with the offline member until
    the other has room, then moves."""
    net = Net(store=MemoryStore(), max_inflight=1, max_queued_messages=4)
    a = net.mqtt("a", clean=False)
    b = net.mqtt("b")
    for m in (a, b):
        m.subscribe(("$share/g/t", 1))
    for i in range(4):   # (through the façade: a client publisher would be held back
        # by back-pressure once the group's backlog is past its high-water mark)
        # a: 1 in flight; b too; 2 kept, stored, by a (its persistent member) for the group
        net.broker.publish(Message("t", b"%d" % i, 1))
    assert len(a.publishes()) == 1            # (its window: 1 in flight)
    a.disconnect()
    assert len(list(net.broker.sessions["a"].entries())) == 3   # b is full: they stay
    got: list[bytes] = []
    for _ in range(4):
        [msg] = b.publishes()
        got.append(msg.payload)
        b.ack([msg])
    assert sorted(got) == [b"0", b"1", b"2", b"3"]
    assert not list(net.broker.sessions["a"].entries())   # (moved, not copied)


def test_the_console_shows_groups_members_and_counts(tmp_path: object) -> None:
    """Issue 11: shared groups in the console (Subscriptions page, /api/shared)."""
    import json

    import console_support

    from mqttamqp.core.message import Message

    console, service, _ = console_support.make_console(tmp_path)
    broker = service.broker
    for cid in ("w-1", "w-<2>"):
        console_support.connect(broker, cid, subscriptions=("$share/workers/jobs/#",))
    for i in range(4):
        broker.publish(Message(f"jobs/{i}", b"x", 0))
    client = console_support.Client(console)
    assert client.login().code == 303
    [group] = json.loads(client.get("/api/shared").body)["items"]
    assert (group["name"], group["filter"], group["strategy"]) == (
        "workers", "jobs/#", "round-robin")
    assert {m["client_id"]: m["given"] for m in group["members"]} == {"w-1": 2, "w-<2>": 2}
    page = client.get("/subscriptions")
    assert b"w-&lt;2&gt;" in page.body and b"w-<2>" not in page.body


def test_features_an_operator_turned_off_are_announced_and_refused() -> None:
    """Issue 11: --no-shared-subscriptions, --no-wildcard-subscriptions and
    --no-subscription-identifiers: CONNACK says so, MQTT 5 gets 0x9E / 0xA2 / 0xA1
    per filter, MQTT 3.1.1 gets 0x80."""
    from mqttamqp.mqtt.packets import Properties, Suback, Subscribe

    net = Net(shared_subscriptions=False, wildcard_subscriptions=False,
              subscription_identifiers=False)
    v5 = net.mqtt("five", level=5)
    props = v5.connack.properties
    assert props is not None
    assert (props.shared_subscription_available, props.wildcard_subscription_available,
            props.subscription_identifier_available) == (0, 0, 0)
    assert v5.subscribe(("$share/g/a", 1), ("a/+", 1), ("a/b", 1)) == (0x9E, 0xA2, 1)
    v5.send(Subscribe(9, (("c/d", 1),), properties=Properties(subscription_identifiers=(7,))))
    [ack] = v5.take(Suback)
    assert ack.return_codes == (0xA1,)
    v311 = net.mqtt("three")
    assert v311.subscribe(("$share/g/a", 1), ("a/#", 0), ("a/c", 0)) == (0x80, 0x80, 0)
    on = Net().mqtt("default", level=5).connack.properties
    assert on is None or (on.shared_subscription_available is None
                          and on.wildcard_subscription_available is None)


# -- issue #26, section 3: no acknowledged message dropped ---------------------------


def _stuck_group_run(net: Net, n: int, leave_after: bool = True) -> tuple[set[bytes], int]:
    """Three members that read but never PUBACK and one that acks everything, on
    ``$share/g/jobs``; a publisher pipelines ``n`` QoS 1 messages.  The acker acks as
    they come (the Clock moving half a second a round, so the stall rule may act),
    the stuck ones leave once every message was acknowledged to the publisher.
    Returns what the acker got (distinct payloads) and the PUBACKs the publisher got."""
    stuck = [net.mqtt(f"stuck{i}") for i in range(3)]
    acker = net.mqtt("acker")
    for member in (*stuck, acker):
        assert member.subscribe(("$share/g/jobs", 1)) == (1,)
    pub = net.mqtt("pub")
    pub.send(*[Publish("jobs", b"%d" % i, 1, False, False, i + 1) for i in range(n)])
    got: set[bytes] = set()
    pubacks = 0
    left = False
    for _ in range(200):   # (bounded: the scenario needs a few dozen rounds)
        for member in stuck:
            member.publishes()            # read, never acknowledged
        messages = acker.publishes()
        got.update(m.payload for m in messages)
        acker.ack(messages)
        pubacks += len(pub.take(Puback))
        if pubacks == n and not left and leave_after:
            for member in stuck:
                member.disconnect()       # clean sessions: their messages go back
            left = True
        if pubacks == n and (left or not leave_after) and not messages:
            break
        net.advance(0.5, step=0.5)
    return got, pubacks


def test_a_group_with_stuck_members_loses_no_acknowledged_message() -> None:
    """Issue #26 §3: three members that never PUBACK and one that does; every QoS 1
    message acknowledged to the publisher reaches the acker (the stuck ones get only
    their window, the rest waits in the group's backlog with the publisher held
    back), and what the stuck ones held moves to it when they leave."""
    net = Net(max_inflight=4, max_queued_messages=20)
    got, pubacks = _stuck_group_run(net, 600)
    assert pubacks == 600
    assert got == {b"%d" % i for i in range(600)}
    assert net.broker.registry.drops.dropped_total() == 0


def test_stuck_members_get_only_their_window() -> None:
    """A member whose in-flight window is full gets nothing more: what it holds is
    its window, not its queue's bound."""
    net = Net(max_inflight=4, max_queued_messages=20)
    _stuck_group_run(net, 200, leave_after=False)
    for i in range(3):
        session = net.broker.sessions[f"stuck{i}"]
        assert len(session.inflight) == 4 and not session.queue


def test_a_full_backlog_holds_the_publisher_back() -> None:
    """With no member that has room, the group's backlog fills to its high-water mark
    and the publisher is not read any further (nothing dropped)."""
    net = Net(max_inflight=2, max_queued_messages=10)
    member = net.mqtt("slow")
    member.subscribe(("$share/g/jobs", 1))
    pub = net.mqtt("pub")
    pub.send(*[Publish("jobs", b"%d" % i, 1, False, False, i + 1) for i in range(50)])
    group = net.broker.router.groups.shared["$share/g/jobs"]
    assert len(member.publishes()) == 2
    assert 5 <= len(group.backlog) <= 10 and group.dropped == 0
    assert len(pub.take(Puback)) < 50     # (the rest is not read yet)


def test_a_full_backlog_drops_and_logs_once(log_lines: list[str]) -> None:
    """Past the backlog's bound (a publisher that ignores back-pressure: the broker's
    own publish), a new message is dropped, counted in $SYS's dropped total, and
    logged once a minute."""
    net = Net(max_inflight=1, max_queued_messages=4)
    net.mqtt("slow").subscribe(("$share/g/jobs", 1))
    for i in range(10):
        net.broker.publish(Message("jobs", b"%d" % i, 1))
    group = net.broker.router.groups.shared["$share/g/jobs"]
    assert (len(group.backlog), group.dropped) == (4, 5)
    assert net.broker.registry.drops.dropped_total() == 5
    lines = [line for line in log_lines if "backlog is full" in line]
    assert len(lines) == 1 and "$share/g/jobs" in lines[0]


def test_members_without_room_are_skipped_by_every_strategy() -> None:
    """round-robin, random, sticky and hash-client alike give a QoS 1 message only to a
    member with room (the stuck one's window is full)."""
    for strategy in ("round-robin", "random", "sticky", "hash-client"):
        net = Net(max_inflight=2, share_strategy=strategy)
        stuck, good = net.mqtt("stuck"), net.mqtt("good")
        for member in (stuck, good):
            member.subscribe(("$share/g/t", 1))
        pub = net.mqtt("pub")
        got = 0
        for i in range(30):
            pub.publish("t", b"%d" % i, qos=1)
            messages = good.publishes()
            got += len(messages)
            good.ack(messages)
        assert len(stuck.publishes()) <= 2, strategy
        assert got + len(net.broker.sessions["stuck"].inflight) == 30, strategy


def test_an_offline_persistent_member_keeps_its_sent_qos2_and_lends_its_qos1() -> None:
    """A persistent member going offline: its unacknowledged QoS 1 message moves to a
    member with room; its QoS 2 message already sent stays, and is completed when
    it reconnects (so no QoS 2 message reaches two members)."""
    net = Net(store=MemoryStore())
    a = net.mqtt("a", clean=False)
    a.subscribe(("$share/g/t", 2))
    net.broker.publish(Message("t", b"two", 2))
    net.broker.publish(Message("t", b"one", 1))
    assert sorted(p.payload for p in a.publishes()) == [b"one", b"two"]
    b = net.mqtt("b")
    b.subscribe(("$share/g/t", 2))
    a.disconnect()
    assert _payloads(b) == [b"one"]
    back = net.mqtt("a", clean=False)
    [again] = back.publishes()
    assert (again.payload, again.qos, again.dup) == (b"two", 2, True)


def test_an_unsubscribing_member_gives_back_what_it_has_queued() -> None:
    """UNSUBSCRIBE from a shared filter: the member's queued messages of that group go
    to the others (what it has in flight it may still acknowledge)."""
    from mqttamqp.mqtt.packets import Unsubscribe

    net = Net(store=MemoryStore(), max_inflight=1)
    a = net.mqtt("a", clean=False)
    a.subscribe(("$share/g/t", 1))
    a.proto.pauseProducing()       # (its socket is full: its queue grows)
    for i in range(3):
        net.broker.publish(Message("t", b"%d" % i, 1))
    b = net.mqtt("b")
    b.subscribe(("$share/g/t", 1))
    first = b.publishes()
    assert [m.payload for m in first] == [b"1"]   # (the group held 1 and 2; b's window is 1)
    a.send(Unsubscribe(a.packet_ids + 1, ("$share/g/t",)))
    b.ack(first)
    got = []
    for _ in range(3):
        messages = b.publishes()
        got += [m.payload for m in messages]
        b.ack(messages)
    assert got == [b"0", b"2"]     # (a's queued one goes first)
    assert not a.proto.session.queue


def test_a_group_that_takes_nothing_stops_holding_its_publisher_after_the_stall_timeout(
        ) -> None:
    """The stall rule holds for a group's backlog: when no member took anything for
    --stall-timeout, the publisher is read again and the backlog drops at its bound
    (counted); the first message a member takes makes it hold publishers again."""
    net = Net(max_inflight=1, max_queued_messages=10, stall_timeout=2.0)
    member = net.mqtt("stuck")
    member.subscribe(("$share/g/jobs", 1))
    pub = net.mqtt("pub")
    pub.send(*[Publish("jobs", b"%d" % i, 1, False, False, i + 1) for i in range(40)])
    group = net.broker.router.groups.shared["$share/g/jobs"]
    assert group.dropped == 0 and len(pub.take(Puback)) < 40
    net.advance(2.5)
    assert len(pub.take(Puback)) > 0 and group.dropped > 0 and group.stalled
    assert net.broker.registry.drops.dropped_total() == group.dropped
    member.ack(member.publishes())
    assert not group.stalled


def test_acknowledged_messages_a_slow_persistent_member_keeps_survive_a_restart() -> None:
    """Review finding: QoS 1 messages a persistent member has no room for are stored
    (kept by it for the group) before their PUBACK, so a crash loses none of them."""
    store = MemoryStore()
    net = Net(store=store, max_inflight=1, max_queued_messages=100)
    a = net.mqtt("a", clean=False)
    a.subscribe(("$share/g/t", 1))
    pub = net.mqtt("p")
    pub.send(*[Publish("t", b"%d" % i, 1, False, False, i + 1) for i in range(5)])
    assert len(pub.take(Puback)) == 5
    assert _payloads(a) == [b"0"]            # (its window: 1 in flight, none acked)
    assert not net.broker.router.groups.shared["$share/g/t"].backlog
    # kill -9: a new broker on what was committed
    after = Net(store=store, max_inflight=10, max_queued_messages=100)
    a2 = after.mqtt("a", clean=False)
    got: list[bytes] = []
    for _ in range(5):       # (bounded)
        messages = a2.publishes()
        if not messages:
            break
        got += [m.payload for m in messages]
        a2.ack(messages)
    assert sorted(got) == [b"%d" % i for i in range(5)]


def test_a_kept_message_moves_to_a_member_that_has_room() -> None:
    """A message a persistent member keeps for the group (nobody had room) goes to
    the first member that has room, removed from the keeper in the same commit."""
    net = Net(store=MemoryStore(), max_inflight=1, max_queued_messages=100)
    a = net.mqtt("a", clean=False)
    b = net.mqtt("b")
    for m in (a, b):
        m.subscribe(("$share/g/t", 1))
    for i in range(4):
        net.broker.publish(Message("t", b"%d" % i, 1))
    [first_a] = a.publishes()
    [first_b] = b.publishes()
    assert len(list(net.broker.sessions["a"].entries())) == 3    # 1 sent, 2 kept
    b.ack([first_b])
    [moved] = b.publishes()
    assert len(list(net.broker.sessions["a"].entries())) == 2
    assert {first_a.payload, first_b.payload, moved.payload} == {b"0", b"1", b"2"}


def test_qos2_publishes_to_a_group_without_room_are_held_back_not_dropped() -> None:
    """Review finding: a QoS 2 message PUBREC'd while no member had room counts
    against the group's backlog at once (its publisher is held back) and is never
    dropped afterwards."""
    net = Net(max_inflight=2, max_queued_messages=10)
    member = net.mqtt("slow")
    member.subscribe(("$share/g/jobs", 1))
    pub = net.mqtt("pub")
    pub.send(*[Publish("jobs", b"%d" % i, 2, False, False, i + 1) for i in range(50)])
    group = net.broker.router.groups.shared["$share/g/jobs"]
    recs = pub.take(Pubrec)
    assert 0 < len(recs) < 50           # back-pressure: not everything read at once
    got: list[bytes] = []
    received = len(recs)
    for _ in range(200):                # (bounded)
        if recs:
            pub.send(*[Pubrel(r.packet_id) for r in recs])
        messages = member.publishes()
        got += [m.payload for m in messages]
        member.ack(messages)
        recs = pub.take(Pubrec)
        received += len(recs)
        if len(got) == 50:
            break
    assert group.dropped == 0 and received == 50
    assert sorted(got) == sorted(b"%d" % i for i in range(50))


def test_a_qos2_message_sent_to_a_member_that_ends_goes_to_no_other() -> None:
    """Review finding (MQTT 5 §4.8.2): a QoS 2 message already sent to a member whose
    session ends is not sent to another member; it is dropped and counted."""
    net = Net()
    a = net.mqtt("a")
    a.subscribe(("$share/g/t", 2))
    net.broker.publish(Message("t", b"two", 2))
    assert _payloads(a) == [b"two"]     # (not PUBREC'd)
    b = net.mqtt("b")
    b.subscribe(("$share/g/t", 2))
    a.disconnect()
    assert b.publishes() == []
    assert net.broker.router.groups.shared["$share/g/t"].dropped == 1


def test_what_an_unsubscribing_member_gives_back_stays_stored() -> None:
    """Review finding: the queued messages an unsubscribing member gives back are
    stored with a persistent member in the commit that removes them from it, so a
    crash loses none and duplicates none."""
    store = MemoryStore()
    net = Net(store=store, max_inflight=1, max_queued_messages=100)
    a = net.mqtt("a", clean=False)
    b = net.mqtt("b", clean=False)
    for m in (a, b):
        m.subscribe(("$share/g/t", 1))
    for i in range(4):      # 1 in flight with each; 2 kept (stored), one by each
        net.broker.publish(Message("t", b"%d" % i, 1))
    assert len(_payloads(a)) == len(_payloads(b)) == 1
    assert len(list(net.broker.sessions["b"].entries())) == 2
    b.send(Unsubscribe(9, ("$share/g/t",)))
    assert len(list(net.broker.sessions["b"].entries())) == 1     # (its sent one)
    after = Net(store=store, max_inflight=10, max_queued_messages=100)
    got: list[bytes] = []
    for client_id in ("a", "b"):
        peer = after.mqtt(client_id, clean=False)
        for _ in range(5):   # (bounded)
            messages = peer.publishes()
            if not messages:
                break
            got += [m.payload for m in messages]
            peer.ack(messages)
    assert sorted(got) == [b"0", b"1", b"2", b"3"]


def test_no_local_holds_when_the_group_gave_the_message_to_another() -> None:
    """A client with a No Local subscription and a shared one gets, through the group,
    only the messages the group gave it: each of its own messages arrives once overall."""
    from mqttamqp.mqtt.packets import Subscribe

    no_local = 0x04
    net = Net()
    me = net.mqtt("me", level=5)
    me.send(Subscribe(1, (("a/#", 0), ("$share/g/a/#", 0)), options=(no_local, 0)))
    other = net.mqtt("other", level=5)
    other.subscribe(("$share/g/a/#", 0))
    me.take()
    for i in range(4):
        me.send(Publish("a/x", b"%d" % i, 0, False, False, None))
    mine = [p.payload for p in me.publishes()]
    theirs = [p.payload for p in other.publishes()]
    assert sorted(mine + theirs) == [b"0", b"1", b"2", b"3"]    # each exactly once
    assert len(mine) == 2 and len(theirs) == 2

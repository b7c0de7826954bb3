"""Shared subscriptions ``$share/<group>/<filter>`` (issue 11), from MQTT 3.1.1
clients, in memory: the broker's own protocol objects on one Clock."""

from __future__ import annotations

from collections import Counter

import pytest
from amqp_memory import Net
from fakes import MemoryStore

from mqttamqp.core.message import Message
from mqttamqp.core.shared import parse_share
from mqttamqp.mqtt.packets import Puback, Publish


def test_parse_share() -> None:
    assert parse_share("a/b") is None
    assert parse_share("$share/g/a/#") == ("g", "a/#")
    assert isinstance(parse_share("$share/g"), str)
    assert isinstance(parse_share("$share//a"), str)
    assert isinstance(parse_share("$share/g+/a"), str)


def _payloads(peer: object) -> list[bytes]:
    return [p.payload for p in peer.publishes()]  # type: ignore[attr-defined]


def test_each_message_goes_to_one_member_round_robin() -> None:
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
    group = net.broker._router.shared["$share/workers/jobs/#"]
    assert group.counts == {"w0": 3, "w1": 3, "w2": 3}


def test_retained_messages_are_not_sent_on_a_shared_subscription() -> None:
    net = Net()
    net.mqtt("p").publish("jobs/kept", b"retained", qos=0, retain=True)
    member = net.mqtt("w")
    member.subscribe(("$share/g/jobs/#", 0))
    assert _payloads(member) == []


def test_malformed_shared_filters_are_refused() -> None:
    net = Net()
    # ($share/g+/a is a malformed filter for MQTT itself: the connection is closed)
    assert net.mqtt("w").subscribe(("$share/g", 0), ("$share/g/a/#", 0)) == (0x80, 0)


def test_unacknowledged_messages_move_when_a_member_leaves() -> None:
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
    net = Net(store=MemoryStore())
    away = net.mqtt("away", clean=False)
    away.subscribe(("$share/g/t", 1))
    away.disconnect()
    pub = net.mqtt("p")
    pub.publish("t", b"queued for away", qos=1)   # nobody online: away keeps it
    here = net.mqtt("here")
    here.subscribe(("$share/g/t", 1))
    pub.publish("t", b"for here", qos=1)          # someone online: not queued offline
    assert _payloads(here) == [b"for here"]
    back = net.mqtt("away", clean=False)
    assert _payloads(back) == [b"queued for away"]


def test_shared_subscriptions_survive_a_restart() -> None:
    store = MemoryStore()
    net = Net(store=store)
    m = net.mqtt("durable", clean=False)
    m.subscribe(("$share/g/t", 1))
    m.disconnect()
    net2 = Net(store=store)
    assert "$share/g/t" in net2.broker._router.shared
    net2.mqtt("p").publish("t", b"after restart", qos=1)
    assert _payloads(net2.mqtt("durable", clean=False)) == [b"after restart"]


@pytest.mark.parametrize("strategy", ["hash-client", "sticky"])
def test_strategies_keep_a_publisher_on_one_member(strategy: str) -> None:
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
        net.broker.publish(Message("t", b"%d" % i, 1))   # a: 1 in flight; b too; 2 held
    assert len(a.publishes()) == 1            # (its window: 1 in flight)
    a.disconnect()
    assert len(list(net.broker.sessions["a"].entries())) == 1   # b is full: it stays
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

    import webui_support

    from mqttamqp.core.message import Message

    console, service, _ = webui_support.make_console(tmp_path)
    broker = service.broker
    for cid in ("w-1", "w-<2>"):
        webui_support.connect(broker, cid, subscriptions=("$share/workers/jobs/#",))
    for i in range(4):
        broker.publish(Message(f"jobs/{i}", b"x", 0))
    client = webui_support.Client(console)
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

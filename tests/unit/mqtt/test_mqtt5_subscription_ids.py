"""MQTT 5 subscription identifiers on every kind of delivery, through the connection
(StringTransport, Clock, no reactor): the router finds them when it matches, and
the deliveries that do not come from a live match (queued for an offline session,
restored after a restart, retained on subscribe, a shared group's backlog, the QoS 2
gate, durable queues) still carry the right ones; MQTT 3.1.1 deliveries none."""

from __future__ import annotations

from dataclasses import replace

from fakes import MemoryStore
from mqtt_memory import Client5, Harness, client5, connected

from mqttamqp.core.message import Message
from mqttamqp.mqtt.packets import (
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)


def _ids(sid: int) -> Properties:
    return Properties(subscription_identifiers=(sid,))


def _publishes(c: Client5) -> list[Publish]:
    return [p for p in c.received() if isinstance(p, Publish)]


def _sids(p: Publish) -> list[int]:
    return sorted(p.properties.subscription_identifiers) if p.properties is not None else []


def test_overlapping_filters_give_every_identifier_and_plain_ones_none() -> None:
    """One copy with the identifier of every matching filter that has one, at QoS 0
    and QoS 1; a filter without one adds nothing, and a topic no identified filter
    matches carries none."""
    h = Harness()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(7)),
             Subscribe(2, (("a/+", 1),), properties=_ids(9)),
             Subscribe(3, (("+/+", 1),)))
    sub.received()
    pub = connected(h, "pub")
    pub.send(Publish("a/b", b"0"), Publish("a/b", b"1", 1, False, False, 1),
             Publish("z/b", b"2"))
    got = _publishes(sub)
    assert [(p.payload, _sids(p)) for p in got] == [(b"0", [7, 9]), (b"1", [7, 9]),
                                                    (b"2", [])]


def test_mqtt311_subscriber_gets_no_identifiers_beside_an_mqtt5_one() -> None:
    """The same message goes to a 3.1.1 subscriber without properties and to an MQTT 5
    one with its identifier."""
    h = Harness()
    old = h.client()
    old.connect("old")
    old.send(Subscribe(1, (("a/#", 0),)))
    old.received()
    new = connected(h, "new")
    new.send(Subscribe(1, (("a/#", 0),), properties=_ids(3)))
    new.received()
    connected(h, "pub").send(Publish("a/b", b"x"))
    [got_old] = [p for p in old.received() if isinstance(p, Publish)]
    assert got_old.properties is None and got_old.payload == b"x"
    [got_new] = _publishes(new)
    assert _sids(got_new) == [3]


def test_queued_for_an_offline_session_and_restored_after_a_restart() -> None:
    """QoS 1 messages queued for an offline persistent session carry their
    identifiers when it comes back, and again after a restart of the broker (stored
    with the entries)."""
    store = MemoryStore()
    h = Harness(store=store)
    sub = connected(h, "sub", session_expiry_interval=100)
    sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(4)),
             Subscribe(2, (("a/b", 1),), properties=_ids(5)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    pub = connected(h, "pub")
    pub.send(Publish("a/b", b"1", 1, False, False, 1), Publish("a/c", b"2", 1, False, False, 2))
    back = client5(h)
    back.connect5("sub", clean=False, session_expiry_interval=100)
    assert [(p.payload, _sids(p)) for p in _publishes(back)] == [(b"1", [4, 5]),
                                                                  (b"2", [4])]
    h.broker.stop()
    h2 = Harness(store=store)
    h2.broker.start()
    again = client5(h2)
    again.connect5("sub", clean=False, session_expiry_interval=100)
    got = _publishes(again)
    assert [(p.payload, p.dup, _sids(p)) for p in got] == [(b"1", True, [4, 5]),
                                                            (b"2", True, [4])]


def test_redelivery_carries_the_same_identifiers_with_or_without_a_restart() -> None:
    """A persistent session's message sent once, then redelivered after the session
    subscribed again with another identifier, carries the identifiers it was routed
    with, whether or not the broker restarted in between (they are stored with it)."""
    for restart in (False, True):
        store = MemoryStore()
        h = Harness(store=store)
        sub = connected(h, "sub", session_expiry_interval=100)
        sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(1)))
        sub.received()
        sub.send(Disconnect())
        sub.lost()
        connected(h, "pub").send(Publish("a/b", b"m", 1, False, False, 1))
        back = client5(h)
        back.connect5("sub", clean=False, session_expiry_interval=100, receive_maximum=1)
        assert [(p.payload, _sids(p)) for p in _publishes(back)] == [(b"m", [1])]
        back.send(Subscribe(2, (("a/b", 1),), properties=_ids(2)))
        back.received()
        back.send(Disconnect())
        back.lost()
        if restart:
            h.broker.stop()
            h = Harness(store=store)
            h.broker.start()
        again = client5(h)
        again.connect5("sub", clean=False, session_expiry_interval=100)
        assert [(p.payload, p.dup, _sids(p)) for p in _publishes(again)] == [
            (b"m", True, [1])], f"restart={restart}"


def test_unsubscribed_filter_identifier_stays_on_a_redelivery_after_a_restart() -> None:
    """A message routed through a filter that the session then unsubscribed keeps that
    filter's identifier on its redelivery, after a restart as without one."""
    store = MemoryStore()
    h = Harness(store=store)
    sub = connected(h, "sub", session_expiry_interval=100, receive_maximum=1)
    sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(3)))
    sub.received()
    connected(h, "pub").send(Publish("a/b", b"m", 1, False, False, 1))
    assert [_sids(p) for p in _publishes(sub)] == [[3]]
    sub.send(Subscribe(2, (("a/b", 1),)))
    sub.received()
    sub.send(Unsubscribe(3, ("a/#",)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    h.broker.stop()
    h = Harness(store=store)
    h.broker.start()
    again = client5(h)
    again.connect5("sub", clean=False, session_expiry_interval=100)
    assert [(p.payload, p.dup, _sids(p)) for p in _publishes(again)] == [(b"m", True, [3])]


def test_an_older_record_without_identifiers_gets_those_of_its_subscriptions() -> None:
    """A queued record stored before the identifiers were kept (``None``) is restored
    with those of the session's restored filters that match it."""
    store = MemoryStore()
    h = Harness(store=store)
    sub = connected(h, "sub", session_expiry_interval=100)
    sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(6)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    connected(h, "pub").send(Publish("a/b", b"m", 1, False, False, 1))
    h.broker.stop()
    queue = store.state.sessions["sub"].queue
    queue[:] = [(seq, replace(e, subscription_ids=None)) for seq, e in queue]
    h = Harness(store=store)
    h.broker.start()
    again = client5(h)
    again.connect5("sub", clean=False, session_expiry_interval=100)
    assert [(p.payload, _sids(p)) for p in _publishes(again)] == [(b"m", [6])]


def test_identifiers_are_those_of_the_filters_matched_when_routed() -> None:
    """A message queued (beyond the client's receive maximum) before a subscription
    was added keeps the identifiers it was routed with, though it is sent after; one
    routed after the SUBSCRIBE has the new one too."""
    h = Harness()
    sub = connected(h, "sub", receive_maximum=1)
    sub.send(Subscribe(1, (("a/#", 1),), properties=_ids(1)))
    sub.received()
    pub = connected(h, "pub")
    pub.send(Publish("a/b", b"first", 1, False, False, 1),
             Publish("a/b", b"queued", 1, False, False, 2))
    [first] = _publishes(sub)
    sub.send(Subscribe(2, (("a/b", 1),), properties=_ids(2)))
    sub.received()
    assert first.packet_id is not None
    sub.send(Puback(first.packet_id))
    [queued] = _publishes(sub)
    assert queued.packet_id is not None
    sub.send(Puback(queued.packet_id))
    pub.send(Publish("a/b", b"after", 1, False, False, 3))
    [after] = _publishes(sub)
    assert [(m.payload, _sids(m)) for m in (first, queued, after)] == [
        (b"first", [1]), (b"queued", [1]), (b"after", [1, 2])]


def test_retained_messages_on_subscribe_carry_the_identifiers() -> None:
    """The retained messages a SUBSCRIBE brings carry the identifier of the new
    subscription (and of any other matching one)."""
    h = Harness()
    pub = connected(h, "pub")
    pub.send(Publish("r/1", b"kept", 1, True, False, 1))
    pub.received()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("r/1", 0),), properties=_ids(11)))
    sub.received()
    sub.send(Subscribe(2, (("r/+", 1),), properties=_ids(12)))
    [got] = _publishes(sub)
    assert got.retain and got.payload == b"kept" and _sids(got) == [11, 12]


def test_shared_subscription_identifier_only_without_a_plain_match() -> None:
    """A message a shared group gives carries the shared filter's identifier; when a
    plain filter of the session matches too, the plain one's alone (one copy)."""
    h = Harness()
    only = connected(h, "only")
    only.send(Subscribe(1, (("$share/g/s/#", 0),), properties=_ids(21)))
    only.received()
    both = connected(h, "both")
    both.send(Subscribe(1, (("$share/h/s/#", 0),), properties=_ids(31)),
              Subscribe(2, (("s/x", 0),), properties=_ids(32)))
    both.received()
    connected(h, "pub").send(Publish("s/x", b"m"))
    [got_only] = _publishes(only)
    [got_both] = _publishes(both)
    assert _sids(got_only) == [21]
    assert _sids(got_both) == [32]


def test_shared_backlog_given_later_carries_the_identifier() -> None:
    """A QoS 1 message a shared group held (its member had no room) carries the
    shared filter's identifier when the group gives it once there is room."""
    h = Harness()
    member = connected(h, "member", receive_maximum=1)
    member.send(Subscribe(1, (("$share/g/q/#", 1),), properties=_ids(41)))
    member.received()
    pub = connected(h, "pub")
    pub.send(Publish("q/1", b"first", 1, False, False, 1),
             Publish("q/1", b"second", 1, False, False, 2))
    [first] = _publishes(member)
    assert first.payload == b"first" and _sids(first) == [41]
    assert first.packet_id is not None
    member.send(Puback(first.packet_id))
    [second] = _publishes(member)
    assert second.payload == b"second" and _sids(second) == [41]


def test_qos2_gate_deliveries_carry_the_identifiers() -> None:
    """An inbound QoS 2 message's deliveries, held until the publisher's PUBREC, go out
    with their identifiers, at QoS 0 and at QoS 1."""
    h = Harness()
    low = connected(h, "low")
    low.send(Subscribe(1, (("g/#", 0),), properties=_ids(51)))
    low.received()
    mid = connected(h, "mid")
    mid.send(Subscribe(1, (("g/#", 1),), properties=_ids(52)))
    mid.received()
    pub = connected(h, "pub")
    pub.send(Publish("g/1", b"x", 2, False, False, 9))
    assert Pubrec(9) in pub.received()
    pub.send(Pubrel(9))
    pub.received()
    [to_low] = _publishes(low)
    [to_mid] = _publishes(mid)
    assert (to_low.qos, _sids(to_low)) == (0, [51])
    assert (to_mid.qos, _sids(to_mid)) == (1, [52])


def test_durable_queue_deliveries_carry_no_identifier() -> None:
    """A ``$queue/`` subscription keeps no options, so its deliveries carry no
    identifier, even when the SUBSCRIBE had one and other filters of the session do."""
    h = Harness()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("$queue/jobs", 1),), properties=_ids(61)),
             Subscribe(2, (("a/#", 1),), properties=_ids(62)))
    sub.received()
    connected(h, "pub").send(Publish("$queue/jobs", b"job", 1, False, False, 1))
    [got] = _publishes(sub)
    assert got.payload == b"job" and _sids(got) == []


def test_a_link_without_the_parameter_still_gets_plain_deliveries() -> None:
    """A ``ClientLink`` written before the parameter existed (five arguments) keeps
    working: deliveries without identifiers never pass it."""
    from mqttamqp.core.auth import Identity

    h = Harness()
    seen: list[tuple[str, int]] = []

    class OldLink:
        congested = False
        backlog_bytes = 0

        def send_publish(self, message: Message, qos: int, packet_id: int | None,
                         dup: bool, retain: bool) -> None:
            seen.append((message.topic, qos))

        def send_pubrel(self, packet_id: int) -> None:
            pass

        def close(self, reason: str) -> None:
            pass

    link = OldLink()
    session = h.broker.open_session(link, "old", True, None).session
    h.broker.activate(session, link, "test")
    h.broker.subscribe(session, Identity("old"), [("o/#", 1)])
    pub = connected(h, "pub")
    pub.send(Publish("o/1", b"a"), Publish("o/1", b"b", 1, False, False, 1))
    assert seen == [("o/1", 0), ("o/1", 1)]

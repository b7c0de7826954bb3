"""``$SYS`` accounting: received = sent + dropped + queued (issue 15).

``messages/queued`` is the routed copies sessions hold and have not written to a
connection; a session that ends with copies queued counts them as dropped; the
broker's own ``$SYS`` messages are in neither received nor sent.  With every
message routed to exactly one subscriber (fan-in) the four ``$SYS`` figures of
one burst satisfy the identity at every moment: the unit tests check the parts
with fakes, the integration test checks it at every burst of the real broker
under a fan-in load that builds a backlog, pauses its publishers and drains.
"""

from __future__ import annotations

from core_broker import connect, make_broker, pub, subscribe
from fakes import FakeLink

from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message
from mqttamqp.core.stats import BrokerStats

# -- unit: the parts, with fakes ------------------------------------------------------


class CountingLink(FakeLink):
    """A fake link that counts what it sends in ``messages_sent``, as the adapters do
    when they write a PUBLISH."""

    def __init__(self, stats: BrokerStats, name: str = "link") -> None:
        super().__init__(name)
        self.stats = stats

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        super().send_publish(message, qos, packet_id, dup, retain, subscription_ids)
        self.stats.messages_sent += 1


def _figures(broker: Broker) -> dict[str, int]:
    """The four figures of the last $SYS burst."""
    out = {}
    for name in ("received", "sent", "dropped", "queued"):
        message = broker.retained.get(f"$SYS/broker/messages/{name}")
        assert message is not None, name
        out[name] = int(message.payload)
    return out


def _balanced(broker: Broker) -> dict[str, int]:
    broker.sys_topics.publish()
    f = _figures(broker)
    assert f["received"] == f["sent"] + f["dropped"] + f["queued"], f
    return f


def test_queued_counts_copies_of_online_and_offline_sessions() -> None:
    """queued sums the session queues, online (beyond the in-flight window) and
    offline (persistent); copies in flight were sent.  A session that ends with
    copies queued counts them as dropped: queued goes down by as many."""
    broker, _clock, _ = make_broker(sys_interval=5, max_inflight=1)
    online, link, _ = connect(broker, "online", link=CountingLink(broker.stats))
    subscribe(broker, online, ("a", 1))
    away, away_link, _ = connect(broker, "away", clean=False)
    subscribe(broker, away, ("a", 1))
    broker.end_session(away_link, away, clean=True, reason="bye")  # offline, kept
    for _ in range(3):
        pub(broker, "a", qos=1)
    assert len(link.published()) == 1                      # the window: 1 in flight
    assert broker.view.counters().messages_queued == 2 + 3
    broker.sys_topics.publish()
    assert _figures(broker) == {"received": 3, "sent": 1, "dropped": 0, "queued": 5}
    broker.end_session(link, online, clean=True, reason="bye")  # a clean session ends
    broker.sys_topics.publish()
    assert _figures(broker) == {"received": 3, "sent": 1, "dropped": 2, "queued": 3}


def test_identity_holds_one_to_one_through_bounds_acks_and_the_end() -> None:
    """One publisher, one subscriber: after every step the $SYS burst balances."""
    broker, _clock, _ = make_broker(sys_interval=5, max_inflight=2, max_queued_messages=3)
    sub, link, _ = connect(broker, "sub", link=CountingLink(broker.stats))
    subscribe(broker, sub, ("a", 1), ("z", 0))
    assert _balanced(broker)["received"] == 0
    for _ in range(7):                     # 2 in flight, 3 queued, 2 over the bound
        pub(broker, "a", qos=1)
        _balanced(broker)
    assert _balanced(broker) == {"received": 7, "sent": 2, "dropped": 2, "queued": 3}
    for _, _, packet_id, *_ in link.published()[:2]:
        broker.acknowledged(sub, packet_id)     # two more go out
    assert _balanced(broker) == {"received": 7, "sent": 4, "dropped": 2, "queued": 1}
    link.congested, link.backlog_bytes = True, 1 << 30   # QoS 0 to a stuck reader
    pub(broker, "z")
    assert _balanced(broker)["dropped"] == 3
    broker.end_session(link, sub, clean=True, reason="bye")
    assert _balanced(broker) == {"received": 8, "sent": 4, "dropped": 4, "queued": 0}


def test_sys_messages_are_neither_received_nor_sent() -> None:
    """The broker's own $SYS copies (live, and retained on subscribe) are not
    traffic: they leave messages/sent as it was."""
    broker, clock, _ = make_broker(sys_interval=5)
    broker.start()
    try:
        watcher, link, _ = connect(broker, "watcher", link=CountingLink(broker.stats))
        codes = subscribe(broker, watcher, ("$SYS/broker/messages/#", 0))
        broker.send_retained(watcher, [("$SYS/broker/messages/#", codes[0])])
        retained = len(link.published())
        assert retained >= 4
        pub(broker, "t", b"x", 0)            # received changes: the next burst sends it
        clock.advance(5)
        live = [m.topic for m, *_ in link.published()[retained:]]
        assert "$SYS/broker/messages/received" in live
        assert broker.stats.messages_sent == 0
        assert _figures(broker)["sent"] == 0
    finally:
        broker.stop()


def test_a_burst_publishes_only_the_topics_whose_value_changed() -> None:
    """As Mosquitto: a $SYS topic is published again only when its value changed
    (the uptime, every burst; a counter, when it moved); the retained copies stay
    whole, so a new watcher still gets every topic on subscribe."""
    broker, clock, _ = make_broker(sys_interval=5)
    broker.start()
    try:
        everything = broker.retained.sys_count     # the first burst, at the start
        assert everything > 20
        watcher, link, _ = connect(broker, "watcher")
        subscribe(broker, watcher, ("$SYS/#", 0))
        clock.advance(5)                     # clients/connected, subscriptions/count...
        seen = len(link.published())
        assert 2 < seen < everything
        clock.advance(5)                     # nothing happened but time
        assert [m.topic for m, *_ in link.published()[seen:]] == ["$SYS/broker/uptime"]
        pub(broker, "nowhere", b"x", 0)
        clock.advance(5)
        changed = sorted(m.topic for m, *_ in link.published()[seen + 1:])
        assert changed == ["$SYS/broker/messages/received",
                           "$SYS/broker/messages/received/protocol/mqtt",
                           "$SYS/broker/uptime"], changed
        assert broker.retained.sys_count == everything
        late, late_link, _ = connect(broker, "late")
        codes = subscribe(broker, late, ("$SYS/#", 0))
        broker.send_retained(late, [("$SYS/#", codes[0])])
        assert len(late_link.published()) == everything
    finally:
        broker.stop()


def test_the_uptime_starts_every_burst_even_unchanged() -> None:
    """At an interval under a second the uptime's value (whole seconds) repeats: it is
    published anyway, first, so a watcher sees each burst start (bench/loadgen.py's
    monitor and the live tests count on it)."""
    broker, clock, _ = make_broker(sys_interval=0.2)
    broker.start()
    try:
        watcher, link, _ = connect(broker, "watcher")
        subscribe(broker, watcher, ("$SYS/#", 0))
        clock.advance(0.2)
        seen = len(link.published())
        clock.advance(0.2)
        assert [(m.topic, m.payload) for m, *_ in link.published()[seen:]] == [
            ("$SYS/broker/uptime", b"0 seconds")]
    finally:
        broker.stop()


def test_sys_copies_a_congested_watcher_misses_are_not_counted_as_dropped() -> None:
    """Not traffic either way: a $SYS copy a congested client cannot take is not a
    drop (before, dropped grew by every $SYS topic at every burst while received
    and sent did not, and the identity failed for exactly the client watching it)."""
    broker, clock, _ = make_broker(sys_interval=5)
    broker.start()
    try:
        watcher, link, _ = connect(broker, "watcher")
        subscribe(broker, watcher, ("$SYS/#", 0))
        link.congested = True
        link.backlog_bytes = 10**9
        clock.advance(5)
        clock.advance(5)
        assert _figures(broker) == {"received": 0, "sent": 0, "dropped": 0, "queued": 0}
        pub(broker, "t", b"x", 0)            # real traffic still counts (no route)
        subscribe(broker, watcher, ("t", 0))
        pub(broker, "t", b"x", 0)
        clock.advance(5)
        assert _figures(broker) == {"received": 2, "sent": 0, "dropped": 1, "queued": 0}
    finally:
        broker.stop()


# -- integration: the real broker under fan-in -----------------------------------------

def test_drops_stay_labelled_with_the_protocol_they_happened_under() -> None:
    """Drops counted while a session was on MQTT stay counted under MQTT after the same
    session moves to AMQP."""
    from amqp_memory import Net

    from mqttamqp.core.auth import Identity
    from mqttamqp.core.message import Message

    net = Net(max_queued_messages=1, max_inflight=1)
    link = FakeLink("dev")
    broker = net.broker
    session = broker.open_session(link, "dev", False, None).session
    broker.activate(session, link, "mqtt3.1.1")
    broker.subscribe(session, Identity("dev"), [("d/#", 1)])
    for _ in range(4):
        broker.publish(Message("d/1", b"x", 1))
    before = broker.registry.drops.dropped_by_protocol()["mqtt"][0]
    assert before > 0
    session.detach()
    broker.activate(session, FakeLink("dev"), "amqp")   # the same session, now over AMQP
    after = broker.registry.drops.dropped_by_protocol()
    assert after["mqtt"][0] == before and after.get("amqp", (0, 0, 0))[0] == 0

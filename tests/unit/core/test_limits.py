"""Limits on what one client can make the broker hold (issue 10, item 4): filters
per session, retained messages in all; each refusal counted in
``$SYS/broker/limits/<name>`` and logged at most once a minute per cause.

In memory (``amqp_memory.Net``: the broker's own MQTT and AMQP protocol objects on
one ``task.Clock``).
"""

from __future__ import annotations

import pytest
from amqp_memory import Net
from twisted.internet.task import Clock

from mqttamqp.core.ratelog import LogLimiter


def test_subscriptions_per_session_are_bounded(log_lines: list[str]) -> None:
    """Beyond --max-subscriptions a new filter gets SUBACK 0x80 (an existing one
    can still be re-subscribed); counted; one log line for many refusals."""
    net = Net(max_subscriptions=3)
    client = net.mqtt("many")
    assert client.subscribe(("a/1", 1), ("a/2", 1), ("a/3", 0)) == (1, 1, 0)
    assert client.subscribe(("a/4", 1), ("a/3", 1)) == (0x80, 1)
    for i in range(20):
        assert client.subscribe((f"b/{i}", 0)) == (0x80,)
    assert net.broker.stats.limits == {"subscriptions": 21}
    assert len([line for line in log_lines if "--max-subscriptions" in line]) == 1
    other = net.mqtt("other")                  # per session: others are not affected
    assert other.subscribe(("a/4", 1)) == (1,)


def test_retained_messages_are_bounded_in_count_and_bytes(log_lines: list[str]) -> None:
    """Beyond --max-retained-messages or --max-retained-bytes a retained message is
    routed but not kept (a topic's older message goes: it would be out of date);
    a replacement that does not grow is always kept; $SYS does not count."""
    net = Net(max_retained_messages=2, max_retained_bytes=10, sys_interval=0)
    net.broker.sys_topics.publish()                              # the broker's own: not counted
    sub = net.mqtt("sub")
    sub.subscribe(("r/#", 0))
    pub = net.mqtt("pub")
    pub.publish("r/1", b"1234", retain=True)
    pub.publish("r/2", b"1234", retain=True)
    pub.publish("r/3", b"x", retain=True)                 # a third topic: not kept
    pub.publish("r/1", b"123456", retain=True)            # 6 + 4 = 10 bytes: kept
    pub.publish("r/1", b"abc", retain=True)               # smaller: always fits (3 + 4)
    pub.publish("r/2", b"123456789", retain=True)         # 3 + 9 > 10: not kept, r/2 goes
    assert [p.payload for p in sub.publishes()] == [b"1234", b"1234", b"x", b"123456",
                                                    b"abc", b"123456789"]
    view = net.broker.view
    assert [view.retained(t).payload if view.retained(t) else None
            for t in ("r/1", "r/2", "r/3")] == [b"abc", None, None]
    assert net.broker.stats.limits == {"retained": 2}
    assert len([line for line in log_lines if "--max-retained-messages" in line]) == 1
    assert view.retained("$SYS/broker/version") is not None
    late = net.mqtt("late")
    late.subscribe(("r/#", 0))
    assert sorted(p.topic for p in late.publishes()) == ["r/1"]


def test_clients_may_not_publish_under_sys() -> None:
    """$SYS is the broker's own: a client's publish there is denied (counted), and
    neither retained nor forwarded; a will there is refused (found in review: a
    client could fill the retained store under $SYS, past the limits)."""
    from mqttamqp.core.message import WillMessage

    net = Net(max_retained_messages=2, sys_interval=0)
    sub = net.mqtt("sys-sub")
    sub.subscribe(("$SYS/#", 0))
    pub = net.mqtt("sys-pub")
    for i in range(5):
        pub.publish(f"$SYS/x/{i}", b"k" * 100, retain=True)
    assert sub.publishes() == []
    assert net.broker.view.retained_matching("$SYS/x/#") == []
    assert net.broker.stats.publish_denied == 5
    assert not net.broker.may_set_will(WillMessage("w", "$SYS/x", b"", 0, False), None)


def test_log_limiter_one_line_per_cause_per_interval() -> None:
    """The log limiter lets one line per cause per interval, then says how many it held
    back; its causes are bounded."""
    clock = Clock()
    limit = LogLimiter(clock.seconds, interval=60, max_causes=4)
    assert limit.allow("a") == 0
    assert limit.allow("a") is None and limit.allow("a") is None
    assert limit.allow("b") == 0                      # causes are separate
    clock.advance(60)
    assert limit.allow("a") == 2                      # says how many were held back
    for cause in "cdefgh":                            # bounded: old causes forgotten
        limit.allow(cause)
    assert len(limit._last) <= 4


def test_connection_rate_per_address(log_lines: list[str]) -> None:
    """More than --max-connect-rate new sockets a second from one address (beyond a
    burst) are closed at once, counted, logged once; loopback is not limited, other
    addresses are not affected, and the bucket refills with time."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    net = Net(max_connect_rate=2.0, connect_burst=3)

    def open_from(host: str) -> StringTransport:
        proto = net.mqtt_factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", host, 40000))
        proto.makeConnection(transport)
        return transport

    results = [open_from("10.0.0.9").disconnecting for _ in range(6)]
    assert results == [False, False, False, True, True, True]
    assert not open_from("10.0.0.10").disconnecting        # another address
    assert not any(open_from("127.0.0.1").disconnecting for _ in range(10))
    net.clock.advance(1.0)                                 # two more tokens
    assert [open_from("10.0.0.9").disconnecting for _ in range(3)] == [False, False, True]
    assert net.broker.stats.limits == {"connect_rate": 4}
    assert len([line for line in log_lines if "--max-connect-rate" in line]) == 1


def test_mqtt_publish_rate_pauses_reading_then_resumes() -> None:
    """Over --max-publish-rate a client is not read until its budget is back (the
    messages already read are routed: nothing is lost); counted."""
    from mqttamqp.mqtt.packets import Publish

    net = Net(max_publish_rate=10.0)
    sub = net.mqtt("rate-sub")
    sub.subscribe(("rate/#", 0))
    pub = net.mqtt("rate-pub")
    pub.send(*[Publish("rate/t", b"%d" % i, 0, False, False, None) for i in range(30)])
    assert len(sub.publishes()) == 30                    # read already: all routed
    assert pub.transport.producerState == "paused"
    assert net.broker.stats.limits == {"publish_rate": 1}
    net.clock.advance(1.0)                               # 20 over budget: 2 s at 10/s
    assert pub.transport.producerState == "paused"
    net.clock.advance(1.1)
    assert pub.transport.producerState == "producing"
    pub.send(Publish("rate/t", b"again", 0, False, False, None))
    assert [p.payload for p in sub.publishes()] == [b"again"]


def test_amqp_publish_rate_withholds_credit_then_gives_it_back() -> None:
    """An AMQP connection over --max-publish-byte-rate gets no more credit until its
    budget is back; other connections are not affected."""
    from proton import Message

    net = Net(max_publish_byte_rate=1000.0)
    app = net.amqp()
    snd = app.sender("brate/t")
    sent = 0
    while snd.credit > 0 and sent < 500:
        app.send(snd, Message(body=b"x" * 400))
        sent += 1
    # The credit the peer held (one window) is used up, and not topped up.
    assert sent <= 100 and snd.credit == 0
    net.pump()
    assert snd.credit == 0
    assert net.broker.stats.limits == {"publish_rate": 1}
    other = net.amqp()
    assert other.sender("brate/u").credit > 0
    net.advance(sent * 400 / 1000.0 - 2.0, step=0.5)     # not yet paid for
    assert snd.credit == 0
    net.advance(3.0, step=0.5)
    assert snd.credit > 0


def test_connect_rate_sees_through_ipv4_mapped_addresses() -> None:
    """A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d: loopback is still
    not limited, and a remote address shares its bucket under either spelling."""
    from mqttamqp.security.admission import ConnectRate

    rate = ConnectRate(Clock().seconds, 1.0, 2)
    assert all(rate.admit("::ffff:127.0.0.1") for _ in range(10))
    assert rate.admit("10.0.0.1") and rate.admit("::ffff:10.0.0.1")
    assert not rate.admit("10.0.0.1")


def test_amqp_exactly_once_senders_are_charged_too() -> None:
    """A sender with rcv-settle-mode second is routed when it settles: that is
    charged to the publish budget as well (found in review: it was never limited)."""
    from proton import Link, Message

    net = Net(max_publish_rate=5.0)
    app = net.amqp()
    snd = app.sender("eo-rate/t", rcv_settle_mode=Link.RCV_SECOND)
    sent = 0
    while snd.credit > 0 and sent < 500:
        dlv = app.send(snd, Message(body="x"))
        dlv.settle()
        net.pump()
        sent += 1
    assert sent <= 100 and snd.credit == 0
    assert net.broker.stats.limits == {"publish_rate": 1}


def test_a_clock_stepping_back_does_not_stretch_the_pause() -> None:
    """A wall clock stepping back does not stretch the publish-rate pause."""
    from mqttamqp.security.admission import PublishRate

    now = [1000.0]
    rate = PublishRate(lambda: now[0], 10.0, 0.0)
    for _ in range(10):
        assert rate.take(1) == 0.0
    now[0] -= 3600.0                       # the wall clock stepped back an hour
    assert rate.take(1) == pytest.approx(0.1)


def test_amqp_addresses_obey_the_topic_limits() -> None:
    """--max-topic-levels and --max-topic-length hold for AMQP addresses as for MQTT
    topics: a receiver's filter and a sender's target are refused at attach, a
    message's 'to' is rejected (amqp:invalid-field), a will topic too."""
    from amqp_memory import Net, outcome
    from proton import Delivery, Message

    net = Net(max_topic_levels=3, max_topic_length=20)
    peer = net.amqp("limits")
    deep = peer.receiver("a/b/c/d")
    assert deep.link.remote_condition is not None
    assert "more than --max-topic-levels 3" in deep.link.remote_condition.description
    long = peer.sender("x" * 21)
    assert long.remote_condition is not None
    assert "longer than --max-topic-length 20" in long.remote_condition.description
    assert peer.receiver("a/b/c").link.remote_condition is None
    anonymous = peer.sender(None)
    dlv = peer.send(anonymous, Message(address="a/b/c/d", body=b"x"))
    assert outcome(dlv) == (Delivery.REJECTED, "amqp:invalid-field")
    assert "--max-topic-levels" in dlv.remote.condition.description


def test_amqp_unfinished_messages_are_bounded_per_connection() -> None:
    """--amqp-max-held-bytes: a peer that keeps large messages half-sent on many
    links is closed (amqp:resource-limit-exceeded) once the broker would hold more
    than the bound; finishing a message releases what it held."""
    from amqp_memory import Net

    net = Net(max_packet_size=512 * 1024, amqp_max_held_bytes=1024 * 1024)
    peer = net.amqp("half-sender")
    chunk = b"x" * (300 * 1024)
    links = [peer.sender(f"held/{i}") for i in range(5)]
    first = links[0].delivery(b"t0")
    links[0].send(chunk)                     # not advanced: the message is unfinished
    net.pump()
    assert peer.server.held_bytes >= len(chunk)
    links[0].send(b"end")
    links[0].advance()                       # finished: released
    net.pump()
    assert peer.server.held_bytes == 0 and first.remote_state
    for i, link in enumerate(links[1:4]):
        link.delivery(b"t%d" % i)
        link.send(chunk)
        net.pump()
    assert not peer.lost                     # 900 KB held: under the bound
    links[4].delivery(b"t4")
    links[4].send(chunk)
    net.pump()
    assert peer.lost
    assert peer.conn.remote_condition is not None
    assert peer.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    assert net.broker.stats.limits.get("amqp_held_bytes") == 1


def test_an_aborted_amqp_transfer_releases_what_it_held() -> None:
    """Review finding: an aborted multi-frame message no longer counts against
    --amqp-max-held-bytes."""
    from amqp_memory import Net

    net = Net(max_packet_size=512 * 1024, amqp_max_held_bytes=1024 * 1024)
    peer = net.amqp("aborter")
    link = peer.sender("held/x")
    dlv = link.delivery(b"t0")
    link.send(b"x" * (300 * 1024))
    net.pump()
    assert peer.server.held_bytes > 0
    dlv.abort()
    net.pump()
    assert peer.server.held_bytes == 0 and not peer.lost


def test_switches_apply_to_mqtt_clients_only() -> None:
    """With wildcard and shared subscriptions switched off, MQTT wildcard subscriptions
    are refused (0x80) but AMQP receivers and the console's tail still take wildcards."""
    from mqttamqp.core.auth import Identity

    net = Net(wildcard_subscriptions=False, shared_subscriptions=False)
    peer = net.amqp("app")
    assert peer.receiver("a/#").link.remote_condition is None
    assert net.mqtt("m").subscribe(("a/#", 0)) == (0x80,)
    tail = net.broker.add_topic_receiver("console-tail:1", "#", Identity("t", None, ""), 0)
    assert tail is not None


def test_log_limiter_burst_allows_that_many_lines_per_interval() -> None:
    """A connection storm logs 20 "connected" lines a second, then one line that
    says how many were held back (issue 15: formatting every line was a third of
    the CPU of 5,000 connects)."""
    from twisted.internet.task import Clock

    from mqttamqp.core.ratelog import LogLimiter

    clock = Clock()
    lines = LogLimiter(clock.seconds, interval=1.0, burst=3)
    assert [lines.allow("c") for _ in range(5)] == [0, 0, 0, None, None]
    clock.advance(1.0)
    assert lines.allow("c") == 2
    assert lines.allow("other") == 0

"""Regression tests for the second review of session 5 (each fails on the code
before its fix): SCRAM and bans/auth failures, MQTT 5 will delays and readiness,
feature switches and AMQP/console receivers, subscription options with shared
subscriptions, retain-as-published through the QoS 2 gate, drop labels."""

from __future__ import annotations

from typing import Any

from amqp_memory import Net
from test_enhanced_auth import ScramClient, harness, scram_connect
from test_protocol5_unit import client5

from mqttamqp.core.auth import Identity
from mqttamqp.mqtt.packets import Connack, Publish, Pubrel, Subscribe

NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08


def test_scram_checks_bans_on_the_name_it_proved() -> None:
    h = harness()
    h.broker.commands.ban("user", "alice", None, "test", "admin")
    [ack] = scram_connect(client5(h), ScramClient("alice", "wonderland"))
    assert isinstance(ack, Connack) and ack.return_code == 0x8A


def test_scram_failures_are_counted_like_password_failures() -> None:
    h = harness()
    before = h.broker.stats.auth_failures
    [ack] = scram_connect(client5(h), ScramClient("alice", "wrong"))
    assert isinstance(ack, Connack) and ack.return_code == 0x86
    assert h.broker.stats.auth_failures == before + 1


def test_a_will_delay_does_not_hold_readiness() -> None:
    net = Net()
    wills = net.broker._wills
    wills.fire_later("dev", 3600, "connection lost", "lost")
    assert net.broker.wills_in_grace == 0
    assert wills.owner_returned("dev")


def test_switches_apply_to_mqtt_clients_only() -> None:
    net = Net(wildcard_subscriptions=False, shared_subscriptions=False)
    peer = net.amqp("app")
    assert peer.receiver("a/#").link.remote_condition is None
    assert net.mqtt("m").subscribe(("a/#", 0)) == (0x80,)
    tail = net.broker.add_topic_receiver("console-tail:1", "#", Identity("t", None, ""), 0)
    assert tail is not None


def test_no_local_holds_when_the_group_gave_the_message_to_another() -> None:
    net = Net()
    me = net.mqtt("me", level=5)
    me.send(Subscribe(1, (("a/#", 0), ("$share/g/a/#", 0)), options=(NO_LOCAL, 0)))
    other = net.mqtt("other", level=5)
    other.subscribe(("$share/g/a/#", 0))
    me.take()
    for i in range(4):
        me.send(Publish("a/x", b"%d" % i, 0, False, False, None))
    mine = [p.payload for p in me.publishes()]
    theirs = [p.payload for p in other.publishes()]
    assert sorted(mine + theirs) == [b"0", b"1", b"2", b"3"]    # each exactly once
    assert len(mine) == 2 and len(theirs) == 2


def test_recheck_forgets_the_options_of_dropped_filters(tmp_path: Any) -> None:
    from mqttamqp.security.acl import AclAuthorizer

    acl = tmp_path / "acl"
    acl.write_text("topic read a/#\ntopic read b/#\n")
    authorizer = AclAuthorizer(str(acl))
    net = Net(authorizer=authorizer)
    c = net.mqtt("c", level=5)
    c.send(Subscribe(1, (("a/#", 0), ("b/#", 0)), options=(RETAIN_AS_PUBLISHED, 0)))
    session = net.broker.sessions["c"]
    assert "a/#" in session.sub_options
    import os
    acl.write_text("topic read b/#\n")
    os.utime(acl, ns=(1, 9_000_000_000))
    assert authorizer.reload()
    net.broker.commands.recheck_subscriptions()
    assert "a/#" not in session.subscriptions and "a/#" not in session.sub_options


def test_retain_as_published_survives_the_qos2_gate_for_qos0_subscribers() -> None:
    net = Net()
    sub = net.mqtt("sub", level=5)
    sub.send(Subscribe(1, (("r/#", 0),), options=(RETAIN_AS_PUBLISHED,)))
    sub.take()
    pub = net.mqtt("pub", level=5)
    pub.send(Publish("r/x", b"kept", 2, True, False, 7))
    pub.take()
    pub.send(Pubrel(7))
    [got] = sub.publishes()
    assert got.retain


def test_drops_stay_labelled_with_the_protocol_they_happened_under() -> None:
    from fakes import FakeLink

    net = Net(max_queued_messages=1, max_inflight=1)
    link = FakeLink("dev")
    broker = net.broker
    session = broker.open_session(link, "dev", False, None).session
    broker.activate(session, link, "mqtt3.1.1")
    broker.subscribe(session, Identity("dev"), [("d/#", 1)])
    from mqttamqp.core.message import Message

    for _ in range(4):
        broker.publish(Message("d/1", b"x", 1))
    before = broker.registry.drops.dropped_by_protocol()["mqtt"][0]
    assert before > 0
    session.detach()
    broker.activate(session, FakeLink("dev"), "amqp")   # the same session, now over AMQP
    after = broker.registry.drops.dropped_by_protocol()
    assert after["mqtt"][0] == before and after.get("amqp", (0, 0, 0))[0] == 0


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

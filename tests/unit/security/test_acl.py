"""ACLs (``--acl FILE``, issue 10): the file format, filter coverage, the
authorizer's verdicts, reloading, and enforcement in the broker over MQTT and AMQP
(in memory: the broker's own protocol objects on one Clock)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from amqp_memory import Net, outcome
from proton import Delivery, Message

from mqttamqp.core.auth import Identity
from mqttamqp.core.message import Message as CoreMessage
from mqttamqp.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from mqttamqp.security.acl import AclAuthorizer, AclError, covers, parse_acl

ACL = """\
# anonymous clients (before any 'user' line)
topic read public/#
topic write public/in

user alice
topic readwrite sensors/alice/#
topic read $SYS/#
topic write cmd/+/set

user bob
topic sensors/bob/#

pattern read devices/%c/#
pattern write users/%u/out
"""


def alice(client_id: str = "a1") -> Identity:
    return Identity(client_id, "alice", "mqtt3.1.1")


def anon(client_id: str = "dev1") -> Identity:
    return Identity(client_id, None, "mqtt3.1.1")


@pytest.fixture
def acl(tmp_path: Any) -> AclAuthorizer:
    path = tmp_path / "acl"
    path.write_text(ACL)
    return AclAuthorizer(str(path))


@pytest.mark.parametrize(("rule", "subject", "expected"), [
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("a/#", "a/+/c", True), ("a/#", "a/#", True),
    ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/+", "a/b/c", False),
    ("a/b", "a/+", False), ("a/b", "a/b", True), ("a/b", "a", False), ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/broker/uptime", True), ("#", "a/b", True),
    ("+", "", True), ("a/+/c", "a/b/c", True), ("a/+/c", "a/b/d", False),
])
def test_covers(rule: str, subject: str, expected: bool) -> None:
    """A granted filter covers a topic or a narrower filter level by level; wildcards do
    not reach $SYS topics."""
    assert covers(rule.split("/"), subject.split("/")) is expected


def test_parse_sections_and_access() -> None:
    """The ACL file parses into the anonymous section, per-user sections and patterns, with
    their access."""
    rules = parse_acl(ACL)
    assert [(r.access, r.filter) for r in rules.anonymous] == [(1, "public/#"), (2, "public/in")]
    assert [(r.access, r.filter) for r in rules.users["alice"]] == [
        (3, "sensors/alice/#"), (1, "$SYS/#"), (2, "cmd/+/set")]
    assert [(r.access, r.filter) for r in rules.users["bob"]] == [(3, "sensors/bob/#")]
    assert [r.filter for r in rules.patterns] == ["devices/%c/#", "users/%u/out"]


@pytest.mark.parametrize(("text", "problem"), [
    ("user alice\ntopic deny secret/#\n", "line 2: 'deny' is not supported"),
    ("topic read a/#/b\n", "line 1: not a topic filter"),
    ("\n# c\nallow everything\n",
     "line 3: expected 'topic', 'pattern', 'queue', 'exchange' or 'user'"),
    ("queue orders\n", "line 1: 'queue' needs an access"),
    ("exchange publish orders\n", "line 1: 'publish' is not an access"),
    ("user\n", "line 1: 'user' needs a user name"),
    ("topic read\n", "line 1: a topic filter is missing"),
])
def test_parse_errors_name_the_line(text: str, problem: str) -> None:
    """A bad ACL line is refused with the file name, its line number and what is wrong."""
    with pytest.raises(AclError) as err:
        parse_acl(text, "/etc/acl")
    assert str(err.value).startswith("/etc/acl " + problem), err.value


def test_trailing_comments_are_comments(tmp_path: Any) -> None:
    """'#' after whitespace ends a line, so commented rules and user lines mean what
    they say, and a filter that ends in '#' keeps it (issue 24, item 8)."""
    text = ("topic read #   # anonymous: everything\n"
            "user sensor-7\t  # the lines up to the next 'user'\n"
            "topic write plant/line1/#   # read, write or readwrite\n"
            "topic plant/#\t# readwrite, the default\n"
            "pattern write reports/%u/+ # every client\n")
    rules = parse_acl(text)
    assert [(r.access, r.filter) for r in rules.anonymous] == [(1, "#")]
    assert list(rules.users) == ["sensor-7"]
    assert [(r.access, r.filter) for r in rules.users["sensor-7"]] == [
        (2, "plant/line1/#"), (3, "plant/#")]
    assert [r.filter for r in rules.patterns] == ["reports/%u/+"]
    path = tmp_path / "acl"
    path.write_text(text)
    sensor = Identity("s7", "sensor-7", "mqtt3.1.1")
    authorizer = AclAuthorizer(str(path))
    assert authorizer.may_publish(sensor, "plant/line1/temp", False)
    assert authorizer.may_subscribe(sensor, "plant/#")
    assert authorizer.may_publish(sensor, "reports/sensor-7/daily", False)
    assert not authorizer.may_publish(anon(), "plant/line1/temp", False)


@pytest.mark.parametrize(("text", "problem"), [
    ("user sensor 7\n", "line 1: a user name holds no whitespace ('sensor 7'"),
    ("\nuser sensor-7   the lines up to # here\n",
     "line 2: a user name holds no whitespace ('sensor-7   the lines up to'"),
    ("topic raed plant/#\n", "line 1: 'raed' is not an access (read, write or readwrite)"),
    ("topic read a/b#  # c\n", "line 1: not a topic filter"),
    ("topic\n", "line 1: a topic filter is missing"),
    ("user   # nobody\n", "line 1: a user name holds no whitespace"),
])
def test_names_and_words_with_whitespace_are_errors(text: str, problem: str) -> None:
    """A user name with inner whitespace, or a misspelt access word before a filter,
    stops with the line named instead of being taken silently (issue 24, item 8)."""
    with pytest.raises(AclError) as err:
        parse_acl(text, "/etc/acl")
    assert str(err.value).startswith("/etc/acl " + problem), err.value


def test_verdicts(acl: AclAuthorizer) -> None:
    """Publish and subscribe verdicts follow the user's section, the anonymous section and
    the %c/%u patterns."""
    assert acl.may_publish(alice(), "sensors/alice/t", False)
    assert acl.may_subscribe(alice(), "sensors/alice/#")
    assert not acl.may_subscribe(alice(), "sensors/#")          # wider than granted
    assert not acl.may_publish(alice(), "sensors/bob/t", True)
    assert acl.may_publish(alice(), "cmd/x/set", False)
    assert not acl.may_subscribe(alice(), "cmd/x/set")          # write-only
    assert acl.may_subscribe(alice(), "$SYS/broker/#")
    # anonymous: the section before the first 'user' line, and %c patterns
    assert acl.may_subscribe(anon(), "public/#")
    assert not acl.may_publish(anon(), "public/x", False)
    assert acl.may_publish(anon(), "public/in", False)
    assert acl.may_subscribe(anon("dev1"), "devices/dev1/#")
    assert not acl.may_subscribe(anon("dev1"), "devices/dev2/#")
    assert not acl.may_publish(anon(), "sensors/alice/t", False)
    # %u patterns: the user's own name, never for anonymous clients
    assert acl.may_publish(alice(), "users/alice/out", False)
    assert not acl.may_publish(alice(), "users/bob/out", False)
    assert not acl.may_publish(anon(), "users//out", False)
    # a user not in the file has only the patterns
    carol = Identity("c1", "carol", "amqp")
    assert not acl.may_publish(carol, "sensors/alice/t", False)
    assert acl.may_publish(carol, "users/carol/out", False)
    # a wildcard in the substituted value would widen the rule: it does not apply
    assert not acl.may_subscribe(anon("+"), "devices/+/#")
    assert not acl.may_publish(Identity("x", "a/b", "mqtt3.1.1"), "users/a/b/out", False)
    # the broker's own (protocol ""): console publishes are checked by the console role
    assert acl.may_publish(Identity("", None, ""), "anything", True)


def test_control_addresses_only_for_the_own_client_id(acl: AclAuthorizer) -> None:
    """An AMQP client may use the control addresses of its own client id only."""
    me = Identity("fe-1", "alice", "amqp")
    assert acl.may_use_session(me, "fe-1")
    assert not acl.may_use_session(me, "fe-2")
    assert not acl.may_use_session(Identity("", "alice", "amqp"), "")


def test_reload_on_change_keeps_old_rules_on_a_bad_file(acl: AclAuthorizer,
                                                       log_lines: list[str]) -> None:
    """The ACL file is re-read when it changes; a broken file leaves the rules before in
    force."""
    assert not acl.reload()                        # unchanged: nothing re-read
    assert not acl.may_publish(anon(), "open/x", False)
    with open(acl.path, "a") as f:
        f.write("\nuser nobody\n")
    # the anonymous section comes first: rewrite the file with a new first line
    with open(acl.path, "w") as f:
        f.write("topic write open/#\n" + ACL)
    os.utime(acl.path, ns=(1, 2_000_000_000))      # a different mtime, whatever the clock
    assert acl.reload()
    assert acl.may_publish(anon(), "open/x", False)
    with open(acl.path, "w") as f:
        f.write("topic deny open/#\n")
    os.utime(acl.path, ns=(1, 3_000_000_000))
    assert not acl.reload()
    assert acl.may_publish(anon(), "open/x", False)  # the rules before stay in force
    assert any("line 1: 'deny' is not supported" in line
               and "rules loaded before stay in force" in line for line in log_lines)


def test_a_file_edited_to_non_utf8_keeps_the_old_rules(acl: AclAuthorizer,
                                                      log_lines: list[str]) -> None:
    """An ACL file rewritten with bytes that are not UTF-8 while the broker runs: the
    rules before stay in force and one line says why (the decode error escaped the
    reload, and so the 2-second poll, before)."""
    assert not acl.may_publish(anon(), "open/x", False)
    with open(acl.path, "wb") as f:
        f.write(b"topic write open/#\ntopic read caf\xe9/#\n")
    os.utime(acl.path, ns=(1, 4_000_000_000))
    assert not acl.reload()
    assert not acl.may_publish(anon(), "open/x", False)
    warned = [line for line in log_lines if "is not UTF-8 text" in line]
    assert len(warned) == 1 and "rules loaded before stay in force" in warned[0]


def test_the_acl_option_is_checked_without_a_line_in_the_log(tmp_path: Any,
                                                              log_lines: list[str]) -> None:
    """Parsing --acl checks the file but logs nothing: the one "ACL ... rule(s)" line of a
    start comes from the authorizer the service builds (it was logged twice)."""
    from mqttamqp.options import Options

    path = tmp_path / "acl"
    path.write_text(ACL)
    Options().parseOptions(["--data", str(tmp_path / "data"), "--acl", str(path)])
    assert not [line for line in log_lines if "rule(s)" in line]
    AclAuthorizer(str(path))
    assert len([line for line in log_lines if "rule(s)" in line]) == 1


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read ACL file"),
    (b"topic deny a/#\n", "line 1: 'deny' is not supported"),
    (b"topic read caf\xe9/#\n", "is not UTF-8 text"),
])
def test_a_bad_acl_file_stops_the_option_parse_with_its_reason(
        tmp_path: Any, content: bytes | None, problem: str) -> None:
    """A missing, wrong or non-UTF-8 --acl file is a usage error naming the problem."""
    from mqttamqp.options import Options

    path = tmp_path / "acl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as stop:
        Options().parseOptions(["--data", str(tmp_path / "data"), "--acl", str(path)])
    assert "--acl: " in str(stop.value) and problem in str(stop.value)
    assert str(path) in str(stop.value)


# -- enforced by the broker (in memory) ---------------------------------------------------


@pytest.fixture
def net(acl: AclAuthorizer) -> Net:
    return Net(authorizer=acl)


def test_mqtt_denied_subscribe_gets_0x80_and_denied_publish_is_dropped(net: Net) -> None:
    """Over MQTT a denied filter gets 0x80 in the SUBACK and a denied publish is
    acknowledged, dropped and counted."""
    sub = net.mqtt("dev1")
    assert sub.subscribe(("public/#", 1), ("sensors/#", 1), ("devices/dev1/#", 0)) == (
        1, 0x80, 0)
    pub = net.mqtt("dev2")
    before = net.broker.stats.publish_denied
    pub.send(Publish("public/x", b"denied", 1, False, False, 7))   # not writable
    assert [a.packet_id for a in pub.take(Puback)] == [7]   # acknowledged (3.1.1), dropped
    pub.publish("public/in", b"allowed", qos=1)
    assert [p.payload for p in sub.publishes()] == [b"allowed"]
    assert net.broker.stats.publish_denied == before + 1


def test_retained_and_wills_obey_the_rules(net: Net) -> None:
    """A retained message or a will on a topic the client may not write is not kept."""
    from mqttamqp.mqtt.packets import Will

    pub = net.mqtt("dev3", will=Will("public/x", b"will", 0, True))   # not writable
    pub.publish("public/x", b"kept?", qos=0, retain=True)
    assert net.broker.retained.get("public/x") is None
    assert "dev3" not in net.broker.wills
    ok = net.mqtt("dev4", will=Will("public/in", b"will", 0, False))   # writable
    ok.publish("public/in", b"kept", qos=0, retain=True)
    assert net.broker.retained.get("public/in") is not None
    assert "dev4" in net.broker.wills


def test_amqp_attaches_are_refused_with_unauthorized_access(net: Net) -> None:
    """AMQP attaches to topics or another client's addresses the ACL denies are refused
    with amqp:unauthorized-access."""
    peer = net.amqp("dev9")
    denied = peer.receiver("sensors/#")
    assert denied.link.remote_condition is not None
    assert denied.link.remote_condition.name == "amqp:unauthorized-access"
    allowed = peer.receiver("devices/dev9/#")
    assert allowed.link.remote_condition is None
    sender = peer.sender("sensors/x")
    assert sender.remote_condition is not None
    assert sender.remote_condition.name == "amqp:unauthorized-access"
    other = peer.receiver("$mqtt.to.dev8.publish")
    assert other.link.remote_condition is not None
    assert other.link.remote_condition.name == "amqp:unauthorized-access"
    control = peer.receiver("$mqtt.to.dev8.control")
    assert control.link.remote_condition is not None
    own = peer.receiver("$mqtt.to.dev9.publish")
    assert own.link.remote_condition is None


def test_amqp_publish_to_a_writable_topic_goes_through(net: Net) -> None:
    """An AMQP transfer to a writable topic is accepted and delivered."""
    sub = net.mqtt("dev1")
    assert sub.subscribe(("public/#", 0)) == (0,)
    peer = net.amqp("dev5")
    sender = peer.sender("public/in")
    assert sender.remote_condition is None
    dlv = peer.send(sender, Message(body=b"x"))
    assert outcome(dlv)[0] == Delivery.ACCEPTED
    assert [p.payload for p in sub.publishes()] == [b"x"]


def test_mqtt31_denied_subscribe_is_granted_without_a_route(net: Net) -> None:
    """MQTT 3.1's SUBACK has no failure code: the refused filter is answered with the
    QoS asked for, and nothing is ever routed to it."""
    from twisted.internet.testing import StringTransport

    from mqttamqp.mqtt.codec import Decoder, encode
    from mqttamqp.mqtt.packets import Connack, Connect, Suback, Subscribe

    proto = net.mqtt_factory.buildProtocol(None)
    wire = StringTransport()
    proto.makeConnection(wire)
    proto.dataReceived(encode(Connect("MQIsdp", 3, "dev31", True, 0, None)))
    net.pump()
    proto.dataReceived(encode(Subscribe(1, (("sensors/#", 1), ("public/#", 0)))))
    net.pump()
    decoder = Decoder()
    decoder.feed(wire.value())
    packets = list(decoder)
    assert isinstance(packets[0], Connack) and packets[0].return_code == 0
    assert isinstance(packets[1], Suback) and tuple(packets[1].return_codes) == (1, 0)
    wire.clear()
    # (the broker's own publishes pass the ACL: only the route is in question)
    net.broker.publish(CoreMessage("sensors/x", b"not for dev31"))
    net.broker.publish(CoreMessage("public/in", b"for dev31"))
    net.pump()
    decoder.feed(wire.value())
    assert [p.payload for p in decoder] == [b"for dev31"]


def test_shared_subscriptions_are_checked_by_their_filter(net: Net) -> None:
    """A shared subscription is checked by its filter, not by the $share/ prefix."""
    sub = net.mqtt("dev1")
    assert sub.subscribe(("$share/g/public/#", 0), ("$share/g/sensors/#", 0)) == (0, 0x80)


def test_amqp_pubrel_and_will_links_only_for_the_own_client_id(net: Net) -> None:
    """Review finding: with an ACL, a connection may not release another client's QoS 2
    deliveries ($mqtt.<id>.pubrel) nor hold another client's will link."""
    peer = net.amqp("dev9")
    for address, name in (("$mqtt.dev8.pubrel", None), ("$mqtt.willservice", "dev8")):
        link = peer.sender(address, name=name)
        assert link.remote_condition is not None, address
        assert link.remote_condition.name == "amqp:unauthorized-access"
    for address, name in (("$mqtt.dev9.pubrel", None), ("$mqtt.willservice", "dev9")):
        assert peer.sender(address, name=name).remote_condition is None, address


def test_an_acl_change_drops_subscriptions_it_no_longer_allows(acl: AclAuthorizer) -> None:
    """Review finding: subscriptions granted before are checked again when the rules
    change (and when another identity resumes the session)."""
    net = Net(authorizer=acl)
    sub = net.mqtt("dev1")
    assert sub.subscribe(("public/#", 0), ("devices/dev1/#", 0)) == (0, 0)
    with open(acl.path, "w") as f:
        f.write("pattern read devices/%c/#\n")
    os.utime(acl.path, ns=(1, 7_000_000_000))
    assert acl.reload()
    net.broker.commands.recheck_subscriptions()
    assert set(net.broker.sessions["dev1"].subscriptions) == {"devices/dev1/#"}
    net.broker.publish(CoreMessage("public/x", b"no longer"))
    net.broker.publish(CoreMessage("devices/dev1/x", b"still"))
    assert [p.payload for p in sub.publishes()] == [b"still"]


def test_mqtt5_denied_qos2_publish_ends_at_pubrec_and_frees_its_packet_id(
        net: Net) -> None:
    """A failing PUBREC (0x87) ends the exchange: the client sends no PUBREL and may
    use the packet id again at once.  Before, the broker kept the id, and the next
    PUBLISH with it was taken for a duplicate and never routed."""
    sub = net.mqtt("dev1")
    assert sub.subscribe(("public/#", 2)) == (2,)
    v5 = net.mqtt("dev6", level=5)
    v5.send(Publish("public/x", b"denied", 2, False, False, 7))     # not writable
    assert [(a.packet_id, a.reason_code) for a in v5.take(Pubrec)] == [(7, 0x87)]
    v5.send(Publish("public/in", b"allowed", 2, False, False, 7))   # the same id
    assert [(a.packet_id, a.reason_code) for a in v5.take(Pubrec)] == [(7, 0)]
    v5.send(Pubrel(7))
    assert [p.payload for p in sub.publishes()] == [b"allowed"]
    # 3.1.1 has no failing PUBREC: the exchange completes as for any message
    v3 = net.mqtt("dev7")
    v3.send(Publish("public/x", b"denied", 2, False, False, 5))
    assert [a.packet_id for a in v3.take(Pubrec)] == [5]
    v3.send(Pubrel(5))
    assert [a.packet_id for a in v3.take(Pubcomp)] == [5]
    assert sub.publishes() == []


def test_mqtt5_denied_subscribe_gets_0x87(net: Net) -> None:
    """With MQTT 5 a filter the ACL refuses gets 0x87 (not authorized) in SUBACK;
    3.1.1 clients get 0x80 as before."""
    v5 = net.mqtt("dev5", level=5)
    assert v5.subscribe(("public/#", 1), ("sensors/#", 1)) == (1, 0x87)


def test_recheck_forgets_the_options_of_dropped_filters(tmp_path: Any) -> None:
    """A filter the reloaded ACL no longer allows is dropped with its subscription
    options, not only its subscription."""
    from mqttamqp.mqtt.packets import Subscribe
    from mqttamqp.security.acl import AclAuthorizer

    retain_as_published = 0x08
    acl = tmp_path / "acl"
    acl.write_text("topic read a/#\ntopic read b/#\n")
    authorizer = AclAuthorizer(str(acl))
    net = Net(authorizer=authorizer)
    c = net.mqtt("c", level=5)
    c.send(Subscribe(1, (("a/#", 0), ("b/#", 0)), options=(retain_as_published, 0)))
    session = net.broker.sessions["c"]
    assert "a/#" in session.sub_options
    import os
    acl.write_text("topic read b/#\n")
    os.utime(acl, ns=(1, 9_000_000_000))
    assert authorizer.reload()
    net.broker.commands.recheck_subscriptions()
    assert "a/#" not in session.subscriptions and "a/#" not in session.sub_options


def test_queue_and_exchange_lines_grant_0_9_1_resources(tmp_path: Any) -> None:
    """queue/exchange lines grant configure, write and read on names ('*' any run,
    %u/%c substituted, a '*' in a substituted value never matching), per section;
    the broker's own identity may everything."""
    path = tmp_path / "acl"
    path.write_text("exchange read feed-*        # anonymous\n"
                    "user alice\n"
                    "queue configure,read celery\n"
                    "exchange write celery\n"
                    "exchange all alice.*\n"
                    "queue all reply-%u-*\n"
                    "queue readwrite jobs-%c\n")
    acl = AclAuthorizer(str(path))
    who = Identity("w1", "alice", "amqp0-9-1")
    assert acl.may_use_resource(who, "queue", "configure", "celery")
    assert acl.may_use_resource(who, "queue", "read", "celery")
    assert not acl.may_use_resource(who, "queue", "write", "celery")
    assert not acl.may_use_resource(who, "exchange", "configure", "celery")
    assert acl.may_use_resource(who, "exchange", "write", "celery")
    assert acl.may_use_resource(who, "exchange", "configure", "alice.pidbox")
    assert not acl.may_use_resource(who, "exchange", "configure", "alicepidbox")
    assert not acl.may_use_resource(who, "queue", "configure", "alice.pidbox")
    assert acl.may_use_resource(who, "queue", "read", "reply-alice-42")
    assert not acl.may_use_resource(who, "queue", "read", "reply-bob-42")
    assert acl.may_use_resource(who, "queue", "write", "jobs-w1")
    assert not acl.may_use_resource(who, "queue", "configure", "jobs-w1")
    assert not acl.may_use_resource(Identity("*", "alice", "amqp0-9-1"), "queue", "write",
                                    "jobs-x")
    anonymous = Identity("a1", None, "amqp0-9-1")
    assert acl.may_use_resource(anonymous, "exchange", "read", "feed-1")
    assert not acl.may_use_resource(anonymous, "exchange", "read", "celery")
    assert not acl.may_use_resource(who, "exchange", "read", "feed-1")
    assert acl.may_use_resource(Identity("", None, ""), "queue", "configure", "any")
    rules = parse_acl(path.read_text())
    assert [(r.kind, r.access, r.filter) for r in rules.users["alice"]][:2] == [
        ("queue", 5, "celery"), ("exchange", 2, "celery")]

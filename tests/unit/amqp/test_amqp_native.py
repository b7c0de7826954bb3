"""Native AMQP 1.0 applications, in memory (issue 16, "AMQP 1.0 for native
applications"; issue 10, item 2): bodies kept between AMQP peers, their MQTT form,
the settlement rules, dynamic nodes, the anonymous relay, capabilities, refused
features, and strings that are not UTF-8.

Black box as ``test_amqp_memory``: a proton client engine and ``MQTTProtocol``
peers on one ``task.Clock`` (``amqp_memory.Net``); the subprocess interop tests of
the same rules are in ``test_amqp_native_interop``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_memory import (
    ACCEPTED,
    REJECTED,
    RELEASED,
    AmqpPeer,
    MqttPeer,
    Net,
    Receiver,
    annotation,
    outcome,
    publish_message,
)
from fakes import ManualStore, MemoryStore
from proton import Data, Link, Message, Terminus, char, float32, symbol, timestamp, ulong
from twisted.internet.defer import succeed

from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.core.routing.subscriptions import DYNAMIC_PREFIX


def watch(net: Net, topic_filter: str, qos: int = 2, client_id: str | None = None) -> MqttPeer:
    sub = net.mqtt(client_id or f"watch-{topic_filter}")
    assert sub.subscribe((topic_filter, qos)) == (qos,)
    return sub


def full_message(body: Any, **kw: Any) -> Message:
    """A message with every section an application may set."""
    msg = Message(body=body, id="m-1", correlation_id=ulong(7), subject="greeting",
                  reply_to="back/here", content_type="text/plain",
                  properties={"colour": "red", "n": 3}, **kw)
    msg.creation_time = 1_700_000_000.5
    return msg


# == bodies between AMQP peers =============================================================

@pytest.mark.parametrize("body", [
    "Hello World!",
    {"a": 1, "b": [1, 2, {"c": None}]},
    ["x", 2, 3.5, True],
    42,
    {symbol("sym"): "v", "bin": b"\x00\x01"},
    b"\x00raw",
], ids=["string", "map", "list", "int", "map-with-binary", "binary"])
def test_body_and_properties_reach_an_amqp_receiver_as_sent(body: Any) -> None:
    """AMQP → AMQP: body section type and value, properties and application
    properties arrive as sent, with the contract's annotations added."""
    net = Net()
    app = net.amqp("sender-app")
    rcv = app.receiver("nat/t")
    snd = app.sender("nat/t")
    assert outcome(app.send(snd, full_message(body, durable=True))) == (ACCEPTED, None)
    [(m, dlv)] = rcv.new()
    got = bytes(m.body) if isinstance(m.body, memoryview) else m.body   # proton's binary
    assert got == body and type(got) is type(body)
    assert m.inferred is False                      # an AmqpValue, not Data sections
    assert (m.id, m.correlation_id, m.subject, m.reply_to) == ("m-1", 7, "greeting", "back/here")
    assert m.content_type == "text/plain" and m.creation_time == 1_700_000_000.5
    assert m.properties == {"colour": "red", "n": 3}
    assert m.address == "nat/t"                      # `to` is the topic it was routed to
    assert annotation(m, "x-opt-mqtt-qos") == 1 and annotation(m, "x-opt-retain-message") is False
    assert annotation(m, "x-opt-mqtt-client-id") == "sender-app"
    assert not dlv.settled


def test_sequence_data_sections_and_footer_are_kept() -> None:
    """An AmqpSequence body stays one; several Data sections and a footer are kept."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("seq/t")
    snd = app.sender("seq/t")
    seq = Message(body=[1, "two", 3.0])
    seq.inferred = True
    assert outcome(app.send(snd, seq)) == (ACCEPTED, None)
    [(m, _)] = rcv.new()
    assert m.inferred is True and m.body == [1, "two", 3.0]
    # Two Data sections and a footer, encoded by hand after proton's properties.
    head = bytes(Message(address="seq/t").encode())
    raw = head + b"\x00\x53\x75\xa0\x02ab" + b"\x00\x53\x75\xa0\x01c" \
        + b"\x00\x53\x78\xc1\x07\x02\xa3\x01k\xa1\x01v"
    dlv = snd.delivery("raw")
    snd.send(raw)
    snd.advance()
    net.pump()
    assert outcome(dlv) == (ACCEPTED, None)
    rcv.new()
    # proton's Message keeps neither the footer nor a second Data section: the bytes
    # tell (decoded by the broker's own codec, which reads every section).
    tail = rcv.raw[-1][rcv.raw[-1].index(b"\x00\x53\x75"):]
    assert tail == b"\x00\x53\x75\xa0\x02ab" + b"\x00\x53\x75\xa0\x01c" \
        + b"\x00\x53\x78\xc1\x07\x02\xa3\x01k\xa1\x01v"
    assert decode_message(rcv.raw[-1]).data == [b"ab", b"c"]
    sub = watch(net, "seq/#")
    app.send(snd, seq)
    dlv = snd.delivery("raw2")
    snd.send(raw)
    snd.advance()
    net.pump()
    assert [p.payload for p in sub.publishes()] == [b'[1,"two",3.0]', b"abc"]


def test_the_to_of_a_message_sent_on_a_topic_link_is_the_topic() -> None:
    """A sender on a topic link whose messages have no (or another) `to`: receivers
    see `to` = the topic, the rest of the properties kept."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("to/#")
    snd = app.sender("to/t")
    app.send(snd, Message(body="a", id="keep-me"))
    app.send(snd, Message(body="b", address="elsewhere", id="keep-me-too", user_id=b"u"))
    got = [(m.address, m.id, m.body) for m, _ in rcv.new()]
    assert got == [("to/t", "keep-me", "a"), ("to/t", "keep-me-too", "b")]


# == bodies toward MQTT =================================================================

def test_mqtt_subscribers_get_each_body_in_its_mqtt_form() -> None:
    """Data → bytes, string → UTF-8, binary → bytes, maps/lists/numbers → JSON."""
    net = Net()
    app = net.amqp()
    sub = watch(net, "form/#")
    snd = app.sender(None)
    bodies = [("form/s", "grüße"), ("form/b", b"\x00\x01"), ("form/m", {"a": [1, 2.5, None]}),
              ("form/l", ["x", True]), ("form/n", 42), ("form/f", float32(1.5)),
              ("form/c", char("z")), ("form/sym", symbol("s")), ("form/t", timestamp(1500))]
    for topic, body in bodies:
        assert outcome(app.send(snd, Message(address=topic, body=body))) == (ACCEPTED, None)
    data = publish_message("form/d", b"raw", qos=1)
    app.send(snd, data)
    got = {p.topic: p.payload for p in sub.publishes()}
    assert got == {
        "form/s": "grüße".encode(), "form/b": b"\x00\x01", "form/m": b'{"a":[1,2.5,null]}',
        "form/l": b'["x",true]', "form/n": b"42", "form/f": b"1.5", "form/c": b"z",
        "form/sym": b'"s"', "form/t": b"1500", "form/d": b"raw"}
    assert json.loads(got["form/m"]) == {"a": [1, 2.5, None]}


def test_a_body_with_no_mqtt_form_reaches_amqp_receivers_only_and_is_counted() -> None:
    """A map holding binary has no JSON form: MQTT subscribers do not get it (counted,
    logged once per link); AMQP receivers do, as sent; nothing else is disturbed."""
    net = Net()
    app = net.amqp()
    sub = watch(net, "nm/#")
    rcv = app.receiver("nm/#")
    snd = app.sender("nm/t")
    for _ in range(3):
        assert outcome(app.send(snd, Message(body={"k": b"\xff"}, durable=True))) \
            == (ACCEPTED, None)
    assert outcome(app.send(snd, Message(body={"k": "text"}))) == (ACCEPTED, None)
    assert [p.payload for p in sub.publishes()] == [b'{"k":"text"}']
    assert [m.body for m, _ in rcv.new()] == [{"k": b"\xff"}] * 3 + [{"k": "text"}]
    assert net.broker.stats.messages_amqp_only == 3


def test_a_retained_native_message_keeps_its_body_for_late_receivers_and_restarts() -> None:
    """Retained: a late AMQP receiver gets the map as sent, a late MQTT subscriber its
    JSON; after a restart from the store, the same."""
    store = MemoryStore()
    net = Net(store)
    app = net.amqp()
    snd = app.sender("ret/t")
    msg = Message(body={"state": "on"}, durable=True, properties={"p": 1},
                  annotations={symbol("x-opt-retain-message"): True})
    assert outcome(app.send(snd, msg)) == (ACCEPTED, None)
    for broker_net in (net, _restarted(net, store)):
        late = broker_net.amqp().receiver("ret/#")
        [(m, _)] = late.new()
        assert (m.body, m.properties, annotation(m, "x-opt-retain-message")) == (
            {"state": "on"}, {"p": 1}, True)
        sub = watch(broker_net, "ret/#", client_id="late")
        assert [(p.payload, p.retain) for p in sub.publishes()] == [(b'{"state":"on"}', True)]


def _restarted(net: Net, store: MemoryStore) -> Net:
    net.broker.shutdown()
    return Net(store)


def test_an_empty_message_is_an_empty_payload() -> None:
    """A message with no body section: accepted, an empty payload; with retain it
    deletes the retained message (docs/amqp.md: "Bodies")."""
    net = Net()
    app = net.amqp()
    sub = watch(net, "em/#")
    snd = app.sender("em/t")
    assert outcome(app.send(snd, Message())) == (ACCEPTED, None)
    assert [p.payload for p in sub.publishes()] == [b""]


# == settlement decides the guarantee ======================================================

def test_settlement_decides_qos_without_the_annotation() -> None:
    """No x-opt-mqtt-qos: unsettled is QoS 1 (the receiver gets it unsettled, so
    proton's accept() works), pre-settled is QoS 0."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("st/t")
    sub = watch(net, "st/t", qos=2)
    snd = app.sender("st/t")
    snd.snd_settle_mode = Link.SND_MIXED
    assert outcome(app.send(snd, Message(body="unsettled"))) == (ACCEPTED, None)
    app.send(snd, Message(body="settled"), settled=True)
    (m1, d1), (m2, d2) = rcv.new()
    assert (m1.body, annotation(m1, "x-opt-mqtt-qos"), d1.settled) == ("unsettled", 1, False)
    assert m1.durable is False          # the header's durable is the sender's
    assert (m2.body, annotation(m2, "x-opt-mqtt-qos"), d2.settled) == ("settled", 0, True)
    assert [(p.payload, p.qos) for p in sub.publishes()] == [(b"unsettled", 1), (b"settled", 0)]


def test_durable_decides_whether_the_accepted_waits_for_the_disk() -> None:
    """Unsettled and durable: Accepted after the commit.  Unsettled, not durable:
    Accepted once routed (QoS 1 all the same)."""
    store = _SwitchStore()
    net = Net(store)
    persistent = net.mqtt("keeper", clean=False)
    persistent.subscribe(("du/t", 1))
    store.manual = True
    app = net.amqp()
    snd = app.sender("du/t")
    quick = app.send(snd, Message(body="not durable"))
    assert outcome(quick) == (ACCEPTED, None)
    slow = app.send(snd, Message(body="durable", durable=True))
    assert slow.remote_state == 0              # waiting for the commit
    store.commit_all()
    net.pump()
    assert outcome(slow) == (ACCEPTED, None)
    assert [(p.payload, p.qos) for p in persistent.publishes()] == [
        (b"not durable", 1), (b"durable", 1)]


class _SwitchStore(ManualStore):
    """Commits at once until ``manual`` is set, then when the test says."""

    manual = False

    def submit(self, ops: Any) -> Any:
        if not self.manual:
            self.submitted.extend(ops)
            return succeed(None)
        return super().submit(ops)


# == dynamic nodes and the anonymous relay ================================================

def test_dynamic_receiver_gets_a_private_address_for_request_response() -> None:
    """A dynamic source gets a broker-made address in the attach; messages sent to it
    (anonymous relay `to`, a sender link to it, an MQTT publish) reach that receiver
    only; nobody else may subscribe; it is gone on detach."""
    net = Net()
    client = net.amqp("client")
    server = net.amqp("server")
    replies = client.receiver(None, dynamic=True)
    address = replies.link.remote_source.address
    assert address.startswith(DYNAMIC_PREFIX) and replies.link.remote_source.dynamic
    other = client.receiver(None, dynamic=True).link.remote_source.address
    assert other != address
    # request → server → reply to reply-to
    requests = server.receiver("svc/echo")
    ask = client.sender("svc/echo")
    assert outcome(client.send(ask, Message(body="ping", reply_to=address,
                                            correlation_id="c1"))) == (ACCEPTED, None)
    [(req, _)] = requests.new()
    relay = server.sender(None)
    assert outcome(server.send(relay, Message(address=req.reply_to, body="pong",
                                              correlation_id=req.correlation_id))) \
        == (ACCEPTED, None)
    direct = server.sender(address)
    server.send(direct, Message(body="pong-2"))
    net.mqtt("mqtt-responder").publish(address, b"pong-3", qos=1)
    got = [(m.body, m.correlation_id) for m, _ in replies.new()]
    assert got == [("pong", "c1"), ("pong-2", None), (b"pong-3", None)]
    # nobody else: an AMQP receiver on it is refused, an MQTT subscription fails
    snoop = server.receiver(address)
    assert snoop.link.remote_condition.name == "amqp:unauthorized-access"
    assert net.mqtt("snoop").subscribe((address, 1), ("$dynamic/#", 1)) == (0x80, 0x80)
    # retained is not kept there; gone on detach
    server.send(relay, Message(address=address, body="r", annotations={
        symbol("x-opt-retain-message"): True}))
    assert net.broker.view.retained(address) is None
    before = net.broker.view.counters().subscriptions
    replies.link.close()
    net.pump()
    assert net.broker.view.counters().subscriptions == before - 1
    assert not any(f == address for f, _, _ in net.broker.trie.filters())


def test_anonymous_relay_checks_each_to() -> None:
    """The null target routes by each message's `to`; a missing or invalid `to`,
    or a control address, is Rejected for that message only."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("rel/#")
    snd = app.sender(None)
    assert outcome(app.send(snd, Message(address="rel/a", body="1"))) == (ACCEPTED, None)
    assert outcome(app.send(snd, Message(body="nowhere")))[1] == "amqp:invalid-field"
    assert outcome(app.send(snd, Message(address="rel/+", body="x")))[1] == "amqp:invalid-field"
    assert outcome(app.send(snd, Message(address="$mqtt.willservice", body="x")))[1] \
        == "amqp:invalid-field"
    assert outcome(app.send(snd, Message(address="rel/b", body="2"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["1", "2"]


# == capabilities and refused features =====================================================

def _symbols(data: Data) -> list[str]:
    data.rewind()
    if data.next() is None:
        return []
    value = data.get_object()
    values = getattr(value, "elements", value)   # a proton Array
    return [str(v) for v in (values if isinstance(values, (list, tuple)) else [value])]


def test_open_and_attach_offer_what_is_supported() -> None:
    """ANONYMOUS-RELAY in the open frame; `topic` on the terminus of topic links."""
    net = Net()
    app = net.amqp()
    assert "ANONYMOUS-RELAY" in [str(c) for c in app.conn.remote_offered_capabilities]
    rcv = app.receiver("cap/t")
    snd = app.sender("cap/t")
    assert _symbols(rcv.link.remote_source.capabilities) == ["topic"]
    assert _symbols(snd.remote_target.capabilities) == ["topic"]


def test_distributed_transactions_and_selectors_are_refused_at_the_link() -> None:
    """A coordinator for distributed transactions only and a source filter: that link
    refused with amqp:not-implemented and a description; the connection and its
    links carry on."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("tx/t")
    coordinator = app.session.sender("txn")
    coordinator.target.type = Terminus.COORDINATOR
    coordinator.target.capabilities.put_symbol(symbol("amqp:distributed-transactions"))
    coordinator.open()
    net.pump()
    assert coordinator.remote_condition.name == "amqp:not-implemented"
    assert "transactions" in coordinator.remote_condition.description
    selective = app.session.receiver("sel")
    selective.source.address = "tx/t"
    selective.source.filter.put_map()
    selective.source.filter.enter()
    selective.source.filter.put_symbol(symbol("selector"))
    selective.source.filter.put_string("colour = 'red'")
    selective.source.filter.exit()
    selective.open()
    net.pump()
    assert selective.remote_condition.name == "amqp:not-implemented"
    assert "selector" in selective.remote_condition.description
    snd = app.sender("tx/t")
    assert outcome(app.send(snd, Message(body="still fine"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["still fine"]


# == strings that are not UTF-8 (issue 10, item 2) ======================================

def _replace(old: bytes, new: bytes):  # type: ignore[no-untyped-def]
    assert len(old) == len(new)
    return lambda data: data.replace(old, new)


@pytest.mark.parametrize("where", ["name", "address"])
def test_a_link_name_or_address_not_utf8_refuses_that_link_only(where: str, caplog) -> None:
    """Invalid UTF-8 in a link name or address: that link is refused with
    amqp:decode-error and one log line; the connection and its other links carry on."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("u8/t")
    app.mangle = _replace(b"BADBAD", b"BA\xff\xfeAD")
    app.mangle_in = _replace(b"BA\xff\xfeAD", b"BADBAD")   # the echo, for the client
    if where == "name":
        bad = app.receiver("u8/t", name="BADBAD")
    else:
        bad = app.receiver("u8/BADBAD")
    app.mangle = app.mangle_in = None
    assert bad.link.remote_condition.name == "amqp:decode-error"
    assert not app.lost
    snd = app.sender("u8/t")
    assert outcome(app.send(snd, Message(body="ok"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["ok"]


def test_a_container_id_not_utf8_closes_with_decode_error() -> None:
    """Invalid UTF-8 in the container id: the connection is closed with
    amqp:decode-error (not an internal error); other connections carry on."""
    from amqp_memory import AmqpPeer

    net = Net()
    good = net.amqp()
    rcv = good.receiver("cid/t")
    bad = AmqpPeer(net, "BADBAD")
    bad.mangle = _replace(b"BADBAD", b"BA\xff\xfeAD")
    net.peers.append(bad)
    net.pump()
    assert bad.conn.remote_condition is not None
    assert bad.conn.remote_condition.name == "amqp:decode-error"
    assert bad.lost
    snd = good.sender("cid/t")
    assert outcome(good.send(snd, Message(body="ok"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["ok"]


def test_any_string_not_utf8_met_while_handling_a_frame_closes_with_decode_error(
        log_events, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wherever proton raises UnicodeDecodeError on a peer's string while the broker
    handles its frames (here: attaching a link), that connection is closed with
    amqp:decode-error and counted as a protocol error, one log line a minute for
    the cause however many connections do it, never an internal error; other
    connections carry on."""
    from twisted.logger import formatEvent

    from mqttamqp.amqp import endpoints

    net = Net()
    other = net.amqp()
    rcv = other.receiver("u8net/t")
    real_attach = endpoints.attach

    def attach(host: Any, plink: Any) -> None:
        if plink.name.startswith("undecodable"):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        real_attach(host, plink)

    monkeypatch.setattr(endpoints, "attach", attach)
    for n in (1, 2, 3):
        app = net.amqp()
        app.receiver("u8net/x", name=f"undecodable{n}")
        assert app.lost
        assert app.conn.remote_condition.name == "amqp:decode-error"
        assert "not valid UTF-8" in app.conn.remote_condition.description
        assert _counted(net) == (n, n)
    lines = [formatEvent(e) for e in log_events if "not valid UTF-8" in formatEvent(e)]
    assert len(lines) == 1, lines
    assert not [e for e in log_events if e.get("log_failure") is not None]
    assert not [e for e in log_events if "internal error" in formatEvent(e)]
    snd = other.sender("u8net/t")
    assert outcome(other.send(snd, Message(body="ok"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["ok"]


def _counted(net: Net) -> tuple[float, float]:
    """``/metrics``: (protocol_errors_total, disconnects_total{cause="protocol_error"})."""
    from prometheus_client.parser import text_string_to_metric_families

    from mqttamqp.ops.metrics import broker_registry, exposition

    errors = causes = 0.0
    for family in text_string_to_metric_families(
            exposition(broker_registry(net.broker)).decode()):
        for sample in family.samples:
            if sample.name == "mqttamqp_protocol_errors_total":
                errors = sample.value
            elif (sample.name == "mqttamqp_disconnects_total"
                  and sample.labels.get("cause") == "protocol_error"):
                causes = sample.value
    return errors, causes


def test_a_protocol_error_close_is_one_cause_and_one_count(log_events) -> None:
    """A connection closed for a protocol error (a second link attached under a name
    in use) counts once in protocol_errors_total and once as a disconnect with
    cause protocol_error, each time; its log line is limited per cause.  A
    connection refused before it opened (container id not UTF-8) is a protocol
    error, not a disconnect."""
    from amqp_memory import AmqpPeer
    from twisted.logger import formatEvent

    net = Net()
    for n in (1, 2):
        app = net.amqp()
        app.receiver("dup/1", name="same")
        app.receiver("dup/2", name="same")
        assert app.lost
        assert _counted(net) == (n, n)
    lines = [formatEvent(e) for e in log_events if "already attached" in formatEvent(e)]
    assert len(lines) == 1, lines
    bad = AmqpPeer(net, "BADBAD")
    bad.mangle = _replace(b"BADBAD", b"BA\xff\xfeAD")
    net.peers.append(bad)
    net.pump()
    assert bad.lost
    assert _counted(net) == (3, 2)


# == limits on what one connection holds (issue 10, item 4) =================================

def test_a_link_beyond_the_limit_is_refused_and_the_connection_stays(log_events) -> None:
    """More links than --amqp-max-links on one connection (refused ones count too):
    that attach is refused with amqp:resource-limit-exceeded, counted, one log line;
    the connection and its other links carry on; detached links do not count."""
    net = Net(amqp_max_links=5)
    app = net.amqp()
    first = [app.receiver(f"lim/{i}") for i in range(3)]
    for r in first:
        r.link.close()
    net.pump()
    kept = [app.receiver(f"lim/k{i}") for i in range(4)]
    kept.append(app.receiver("a/#/b"))         # refused (invalid filter): still held
    over = [app.receiver(f"lim/over{i}") for i in range(3)]
    assert not app.lost
    for r in over:
        assert r.link.remote_condition.name == "amqp:resource-limit-exceeded"
        assert "--amqp-max-links" in r.link.remote_condition.description
    assert net.broker.stats.limits == {"amqp_links": 3}
    from twisted.logger import formatEvent

    lines = [formatEvent(e) for e in log_events]
    assert len([x for x in lines if "more than 5 links" in x]) == 1, lines
    snd = app.sender("lim/k0")                 # still over: refused too
    assert snd.remote_condition.name == "amqp:resource-limit-exceeded"
    other = net.amqp()                         # its links: another connection's
    assert outcome(other.send(other.sender("lim/k1"), Message(body="ok"))) == (ACCEPTED, None)
    assert [m.body for m, _ in kept[1].new()] == ["ok"]
    for r in over:                             # the peer detaches what was refused
        r.link.close()
    snd.close()
    kept[0].link.close()
    net.pump()
    fresh = app.receiver("lim/fresh")
    assert fresh.link.remote_condition is None and not app.lost


def _burst(peer: AmqpPeer, n: int, prefix: str) -> list[Link]:
    """``n`` receiver attaches written in one batch (the broker reads them at once)."""
    links = []
    for i in range(n):
        link = peer.session.receiver(f"{prefix}{i}")
        link.source.address = f"{prefix}/{i}"
        link.open()
        links.append(link)
    peer.net.pump()
    return links


def test_a_burst_of_attaches_over_the_limit_is_refused_link_by_link() -> None:
    """A burst of attaches far past --amqp-max-links in one read (more than the limit
    and half again) is refused link by link: the peer has not read the refusals yet,
    so the connection stays; once it detaches them (and one more) a new link attaches."""
    net = Net(amqp_max_links=2)
    app = net.amqp()
    links = _burst(app, 30, "b")
    assert not app.lost
    refused = [x for x in links if x.remote_condition is not None]
    assert len(refused) == 28
    assert {x.remote_condition.name for x in refused} == {"amqp:resource-limit-exceeded"}
    for link in [*refused, links[0]]:          # (and one of the two it holds)
        link.close()
    net.pump()
    assert app.receiver("b/fresh").link.remote_condition is None and not app.lost


def test_refused_links_kept_attached_past_the_grace_close_the_connection() -> None:
    """A peer that keeps links refused for --amqp-max-links attached longer than
    --amqp-refused-link-grace is closed at its next attach over the limit (it could
    hold links without bound), not before; other connections carry on."""
    net = Net(amqp_max_links=2, amqp_refused_link_grace=20.0)
    other = net.amqp()
    rcv = other.receiver("m/t")
    greedy = net.amqp()
    _burst(greedy, 5, "g")
    assert not greedy.lost
    net.clock.advance(19.0)   # (within the grace: another attach is refused alone)
    greedy.receiver("m/early", credit=0)
    assert not greedy.lost
    net.clock.advance(2.0)
    greedy.receiver("m/last", credit=0)
    assert greedy.lost
    assert greedy.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    snd = other.sender("m/t")
    assert outcome(other.send(snd, Message(body="ok"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["ok"]


def test_closes_for_the_refused_link_grace_are_counted_and_logged_once_a_minute() -> None:
    """Two peers closed for keeping refused links attached past
    --amqp-refused-link-grace within a minute: both counted
    ($SYS/broker/limits/amqp_refused_links), one log line."""
    from loglines import LogLines

    net = Net(amqp_max_links=2, amqp_refused_link_grace=5.0)
    with LogLines("links refused for --amqp-max-links attached") as lines:
        for name in ("g1", "g2"):
            greedy = net.amqp()
            _burst(greedy, 3, name)
            net.clock.advance(6.0)
            greedy.receiver(f"m/{name}-last", credit=0)
            assert greedy.lost
    assert net.broker.stats.limits.get("amqp_refused_links") == 2
    assert len(lines) == 1 and "closing it" in lines[0]


def test_refused_links_past_their_bound_close_the_connection() -> None:
    """More links refused for --amqp-max-links and not detached than refused_bound,
    however fast: the connection is closed."""
    from mqttamqp.amqp.endpoints import refused_bound
    from mqttamqp.core.limits import Limits

    net = Net(amqp_max_links=2)
    greedy = net.amqp()
    bound = refused_bound(Limits(amqp_max_links=2))
    _burst(greedy, 2 + bound, "r")
    assert not greedy.lost
    _burst(greedy, 1, "last")
    assert greedy.lost
    assert greedy.conn.remote_condition.name == "amqp:resource-limit-exceeded"


def test_sessions_beyond_the_limit_close_the_connection() -> None:
    """More sessions than --amqp-max-sessions (begun before the broker's open told
    the peer its channel-max, as a hostile peer would): the connection is closed,
    counted; within the limit it is fine."""
    from amqp_memory import AmqpPeer

    net = Net(amqp_max_sessions=2)
    fine = AmqpPeer(net, "fine")          # one session of its own
    fine.conn.session().open()
    net.peers.append(fine)
    greedy = AmqpPeer(net, "greedy")
    for _ in range(2):
        greedy.conn.session().open()
    net.peers.append(greedy)
    net.pump()
    assert greedy.lost and not fine.lost
    assert net.broker.stats.limits == {"amqp_sessions": 1}


def test_the_session_limit_is_advertised_as_channel_max_and_usable_to_the_last() -> None:
    """--amqp-max-sessions is the open's channel-max (the number minus one), so a
    conforming peer (a gateway) knows it before it begins a session: it uses every
    session up to the limit, each with a working link, and keeps its connection."""
    net = Net(amqp_max_sessions=3)
    app = net.amqp("polite")
    assert app.transport.remote_channel_max == 2
    receivers = [app.receiver("cm/t")]         # (its first session)
    for i in range(2):
        session = app.conn.session()
        session.open()
        link = session.receiver(f"cm{i}")
        link.source.address = "cm/t"
        link.open()
        link.flow(5)
        receivers.append(Receiver(link))
        app.receivers.append(receivers[-1])
    net.pump()
    snd = app.sender("cm/t")
    assert outcome(app.send(snd, Message(body="all"))) == (ACCEPTED, None)
    assert [[m.body for m, _ in r.new()] for r in receivers] == [["all"]] * 3
    assert not app.lost and net.broker.stats.limits == {}


# == storage that fails (issue 10, item 3) ====================================================

@pytest.fixture
def log_events() -> Iterator[list[dict[str, Any]]]:
    from twisted.logger import globalLogPublisher

    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)


def test_failing_storage_withholds_acks_logs_once_and_recovers(log_events) -> None:
    """While commits fail: QoS 0 keeps flowing, QoS 1 gets no PUBACK (the client is
    disconnected to retry), AMQP gets Released; the log has one line when storage
    starts failing and one when it recovers, no traceback, however many clients
    and messages met it; $SYS shows it; recovery needs nothing done."""
    from fakes import FailingStore
    from twisted.logger import formatEvent

    from mqttamqp.mqtt.packets import Puback, Publish

    store = FailingStore()
    net = Net(store)
    keeper = net.mqtt("keeper", clean=False)            # a persistent QoS 1 subscriber
    keeper.subscribe(("disk/#", 1))
    live = watch(net, "disk/#", qos=0, client_id="live")
    app = net.amqp()
    snd = app.sender("disk/amqp")
    store.failing = True
    net.mqtt("q0").publish("disk/q0", b"zero", qos=0)
    assert [p.payload for p in live.publishes()] == [b"zero"]
    for i in range(5):
        pub = net.mqtt(f"pub{i}")
        pub.send(Publish("disk/q1", b"one", 1, False, False, 1))
        assert pub.take(Puback) == [] and pub.transport.disconnecting
        assert outcome(app.send(snd, Message(body="durable", durable=True)))[0] == RELEASED
    failing = [e for e in log_events if "storage failing" in formatEvent(e)]
    assert len(failing) == 1
    assert not [e for e in log_events if e.get("log_failure") is not None]
    assert net.broker.stats.storage_failing and net.broker.stats.storage_failures >= 10
    assert net.broker.stats.protocol_errors == 0          # not the clients' fault
    assert not [e for e in log_events if "protocol error" in formatEvent(e)]
    store.failing = False
    pub = net.mqtt("after")
    pub.send(Publish("disk/q1", b"back", 1, False, False, 1))
    assert [a.packet_id for a in pub.take(Puback)] == [1]
    assert outcome(app.send(snd, Message(body="again", durable=True))) == (ACCEPTED, None)
    recovered = [e for e in log_events if "storage recovered" in formatEvent(e)]
    assert len(recovered) == 1 and not net.broker.stats.storage_failing
    assert ("$SYS/broker/storage/state", "ok") in net.broker.stats.sys_topics(
        "x", 0.0, 0, 0, 0, 0, 0)


# == found in review ========================================================================

def _send_raw(app: Any, snd: Any, raw: bytes) -> Any:
    dlv = snd.delivery(f"raw-{len(raw)}-{id(raw)}")
    snd.send(raw)
    snd.advance()
    app.net.pump()
    return dlv


@pytest.mark.parametrize("order", ["annotations-after-properties", "header-after-body",
                                   "app-properties-before-properties", "two-headers"])
def test_sections_out_of_order_are_rejected_not_forwarded(order: str) -> None:
    """A header or annotations after the properties or body would let a sender forge
    what the broker adds (the publisher annotation, retain, QoS) for AMQP receivers:
    such a message is Rejected with amqp:decode-error, nothing is forwarded, and
    the link and connection carry on."""
    header = b"\x00\x53\x70\xc0\x02\x01\x41"
    props = b"\x00\x53\x73\xc0\x05\x03\x40\x40\xa1\x01t"      # to = "t"
    forged = (b"\x00\x53\x72\xc1\x18\x02\xa3\x14x-opt-mqtt-client-id\xa1\x00")
    app_props = b"\x00\x53\x74\xc1\x01\x00"
    body = b"\x00\x53\x77\xa1\x02hi"
    raw = {"annotations-after-properties": header + props + forged + body,
           "header-after-body": props + body + header,
           "app-properties-before-properties": header + app_props + props + body,
           "two-headers": header + header + props + body}[order]
    net = Net()
    app = net.amqp("attacker")
    rcv = app.receiver("t")
    snd = app.sender("t")
    assert outcome(_send_raw(app, snd, raw)) == (REJECTED, "amqp:decode-error")
    assert rcv.new() == [] and not app.lost
    assert outcome(app.send(snd, Message(body="fine"))) == (ACCEPTED, None)
    [(m, _)] = rcv.new()
    assert annotation(m, "x-opt-mqtt-client-id") == "attacker"


def test_links_ended_with_their_session_no_longer_count() -> None:
    """Links that end because their session ends are not held against the link
    limit (a client with one session per operation is not cut off)."""
    net = Net(amqp_max_links=10)
    app = net.amqp()
    for round_ in range(4):
        session = app.conn.session()
        session.open()
        for i in range(6):
            link = session.receiver(f"r{round_}-{i}")
            link.source.address = f"per-op/{i}"
            link.open()
        net.pump()
        session.close()
        net.pump()
    assert not app.lost
    assert net.broker.stats.limits == {}


def test_each_transport_error_condition_has_its_own_log_limit() -> None:
    """The per-minute log limit for transport errors is kept per condition name
    (the key used to be "amqp" for every error, so one kind hid all others)."""
    from mqttamqp.amqp.endpoints import transport_error_cause

    dup = transport_error_cause("amqp:invalid-field: link name already attached: x")
    framing = transport_error_cause("amqp:connection:framing-error: bad frame: 3")
    assert dup == "transport error amqp:invalid-field"
    assert framing == "transport error amqp:connection:framing-error"
    assert transport_error_cause("amqp:decode-error") == "transport error amqp:decode-error"

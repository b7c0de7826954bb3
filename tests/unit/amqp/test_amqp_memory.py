"""The AMQP side in memory, on a ``task.Clock``: the Will and Subscription services,
the QoS 2 release loop, topic receivers and senders with their settlement outcomes,
credit and the stall timeout, the will grace rule after a restart, the idle time-out.

Black box: the broker is built with ``Broker(clock, store, limits)`` and
``AMQPFactory`` only (``amqp_memory.Net``); tests talk AMQP through a proton client
engine and MQTT through an ``MQTTProtocol`` on ``StringTransport``, and look at
``broker.sessions``, ``wills``, ``retained`` and ``stats`` at most.  ``Net.pump()``
runs until nothing moves, so "nothing arrived" is a fact, not a wait.  The contract
is docs/amqp.md, "The MQTT-over-AMQP contract"; the subprocess tests of the same behaviour
(``test_amqp_services``, ``test_amqp_flow``, ``test_amqp_topics``) stay as the
interop layer.
"""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import (
    ACCEPTED,
    FE,
    MODIFIED,
    REJECTED,
    RELEASED,
    MqttPeer,
    Net,
    annotation,
    control,
    outcome,
    publish_message,
    will_message,
)
from fakes import ManualStore, SnapshotStore
from proton import Condition, Link, Message, int32, ulong

from mqttamqp.core.message import Message as Message_
from mqttamqp.core.message import WillMessage
from mqttamqp.core.persistence import Snapshot

# == helpers ===================================================================


def watch(net: Net, topic_filter: str, qos: int = 2) -> MqttPeer:
    """An MQTT subscriber (clean session) on ``topic_filter``."""
    sub = net.mqtt(f"watch-{topic_filter}")
    assert sub.subscribe((topic_filter, qos)) == (qos,)
    return sub


def seen(sub: MqttPeer) -> list[tuple[str, bytes, int, bool]]:
    return [(p.topic, p.payload, p.qos, p.retain) for p in sub.publishes()]


def detach_with_error(fe: FE) -> None:
    fe.will.condition = Condition("amqp:link:detach-forced", "client lost")
    fe.will.close()
    fe.peer.net.pump()


def persistent_session(net: Net, client_id: str, *filters: tuple[str, int]) -> None:
    """A persistent session made by an MQTT client that subscribes and leaves."""
    mq = net.mqtt(client_id, clean=False)
    if filters:
        mq.subscribe(*filters)
    mq.disconnect()


# == the Will service ============================================================


def test_will_accepted_then_published_on_detach_with_error() -> None:
    """AMQP_WILL is Accepted; a detach with an error publishes it (QoS, retain) and deletes it."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev1")
    dlv = fe.peer.send(fe.will, will_message("w/dev1", b"gone", qos=1, retain=True))
    assert outcome(dlv) == (ACCEPTED, None)
    assert net.broker.wills["dev1"].payload == b"gone"
    detach_with_error(fe)
    assert seen(sub) == [("w/dev1", b"gone", 1, False)]
    assert "dev1" not in net.broker.wills
    late = net.mqtt("late")
    late.subscribe(("w/#", 2))
    assert [(p.payload, p.qos, p.retain) for p in late.publishes()] == [(b"gone", 1, True)]


def test_accepted_only_after_the_will_is_durable() -> None:
    """The will service answers AMQP_WILL once the store has committed it, not before."""
    store = ManualStore()
    net = Net(store)
    fe = net.fe("dur")
    dlv = fe.peer.send(fe.will, will_message("w/dur", b"x", qos=1))
    assert dlv.remote_state == 0 and store.pending
    store.commit_all()
    net.pump()
    assert outcome(dlv) == (ACCEPTED, None)


def test_detach_without_error_deletes_the_will() -> None:
    """A clean detach of the will link deletes the will and publishes nothing."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev2")
    fe.peer.send(fe.will, will_message("w/dev2", b"never", qos=1))
    fe.will.close()
    net.pump()
    assert seen(sub) == []
    assert "dev2" not in net.broker.wills


def test_will_clear_then_detach_with_error_publishes_nothing() -> None:
    """AMQP_WILL_CLEAR deletes the will: a later brute detach has nothing to publish."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev3")
    fe.peer.send(fe.will, will_message("w/dev3", b"never", qos=0))
    assert outcome(fe.peer.send(fe.will, Message(subject="will-clear"))) == (ACCEPTED, None)
    assert "dev3" not in net.broker.wills
    detach_with_error(fe)
    assert seen(sub) == []


def test_second_will_replaces_the_first() -> None:
    """A second AMQP_WILL on the link replaces the first; only the second is published."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev4")
    fe.peer.send(fe.will, will_message("w/dev4", b"first", qos=1))
    fe.peer.send(fe.will, will_message("w/dev4", b"second", qos=2))
    detach_with_error(fe)
    assert seen(sub) == [("w/dev4", b"second", 2, False)]


@pytest.mark.parametrize("durable,qos", [(True, 1), (False, 0)])
def test_will_qos_falls_back_to_durable(durable: bool, qos: int) -> None:
    """Without x-opt-mqtt-qos, durable true means QoS 1 and durable false QoS 0."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev5")
    fe.peer.send(fe.will, will_message("w/dev5", b"d", qos=None, durable=durable))
    detach_with_error(fe)
    assert [q for _, _, q, _ in seen(sub)] == [qos]


def test_lost_connection_publishes_the_will() -> None:
    """A connection lost without detaching the will link (socket gone) publishes the will."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev6")
    fe.peer.send(fe.will, will_message("w/dev6", b"killed", qos=1))
    fe.peer.kill()
    assert seen(sub) == [("w/dev6", b"killed", 1, False)]
    assert net.broker.wills == {}


def test_clean_connection_close_deletes_the_will() -> None:
    """A clean AMQP close detaches implicitly without error: no will, and it is deleted."""
    net = Net()
    sub = watch(net, "w/#")
    fe = net.fe("dev7")
    fe.peer.send(fe.will, will_message("w/dev7", b"never", qos=1))
    fe.peer.close()
    assert seen(sub) == []
    assert net.broker.wills == {}


@pytest.mark.parametrize("message,why", [
    (will_message("", b"x", qos=1), "no to"),
    (will_message("a/+/b", b"x", qos=1), "wildcard topic"),
    (Message(subject="will", address="a/b", body={"not": "a payload"}), "map body"),
    (Message(subject="will", address="a/b", body=b"x",
             annotations={"x-opt-mqtt-qos": "7"}), "qos 7"),
    (Message(subject="will", address="a/b", body=b"x",
             annotations={"x-opt-retain-message": "yes"}), "retain not bool"),
    (Message(subject="nonsense"), "unknown subject"),
])
def test_malformed_will_is_rejected_and_link_kept(message: Message, why: str) -> None:
    """A malformed AMQP_WILL is Rejected with amqp:decode-error; the link stays attached."""
    net = Net()
    fe = net.fe("dev8")
    dlv = fe.peer.send(fe.will, message)
    assert outcome(dlv) == (REJECTED, "amqp:decode-error"), why
    assert dlv.remote.condition.description
    assert net.broker.wills == {}
    ok = fe.peer.send(fe.will, will_message("ok/w", b"fine", qos=0))
    assert outcome(ok) == (ACCEPTED, None)


# == the Subscription service ==========================================================


def test_list_replies_with_the_sessions_subscriptions() -> None:
    """AMQP_LIST: Accepted, then AMQP_SUBSCRIPTIONS (filter -> int QoS) to reply-to."""
    net = Net()
    persistent_session(net, "ls", ("ls/a/#", 1), ("ls/b", 2))
    assert net.fe("ls").list() == {"ls/a/#": 1, "ls/b": 2}


def test_list_without_a_usable_reply_to_or_correlation_id_is_precondition_failed() -> None:
    """AMQP_LIST without reply-to or correlation-id: Rejected precondition-failed, link kept."""
    net = Net()
    persistent_session(net, "lp", ("lp/t", 1))
    fe = net.fe("lp")
    assert outcome(fe.send(control("list", "lp"))) == (REJECTED, "amqp:precondition-failed")
    no_correlation = Message(subject="list", reply_to="$mqtt.to.lp.control")
    assert outcome(fe.send(no_correlation)) == (REJECTED, "amqp:precondition-failed")
    assert fe.list() == {"lp/t": 1}


def test_subscribe_delivers_retained_then_live_messages_to_publish() -> None:
    """AMQP_SUBSCRIBE: Accepted, retained messages to .publish with retain set, then live ones."""
    net = Net()
    persistent_session(net, "sb")
    pub = net.mqtt("pub")
    pub.publish("sb/r", b"kept", qos=1, retain=True)
    fe = net.fe("sb")
    assert fe.list() == {}
    publish = fe.attach_publish()
    assert outcome(fe.subscribe({"sb/+": int32(1), "sb/s": "2"})) == (ACCEPTED, None)
    [(m, dlv)] = publish.new()
    assert (m.address, bytes(m.body), annotation(m, "x-opt-retain-message")) == (
        "sb/r", b"kept", True)
    fe.peer.settle(dlv, ACCEPTED)
    pub.publish("sb/s", b"live", qos=2)
    [(m, dlv)] = publish.new()
    assert (bytes(m.body), annotation(m, "x-opt-retain-message")) == (b"live", False)
    assert annotation(m, "x-opt-mqtt-qos") == 2 and not dlv.settled
    fe.peer.settle(dlv, ACCEPTED)
    assert fe.list() == {"sb/+": 1, "sb/s": 2}


def test_subscribe_where_every_filter_fails_is_rejected() -> None:
    """AMQP_SUBSCRIBE where every filter is invalid is Rejected (SUBACK 0x80 for all)."""
    net = Net()
    persistent_session(net, "sf")
    fe = net.fe("sf")
    fe.list()
    fe.attach_publish()
    assert outcome(fe.subscribe({"a/#/b": 1, "": 0}))[0] == REJECTED
    assert fe.list() == {}


@pytest.mark.parametrize("body,why", [
    (["a/b"], "list instead of map"),
    ({"a/b": "high"}, "qos not a number"),
    ({"a/b": 5}, "qos out of range"),
    ({}, "no filters"),
])
def test_malformed_subscribe_is_rejected_and_link_kept(body: Any, why: str) -> None:
    """A malformed AMQP_SUBSCRIBE is Rejected with amqp:decode-error; the link stays."""
    net = Net()
    persistent_session(net, "ms")
    fe = net.fe("ms")
    fe.list()
    fe.attach_publish()
    assert outcome(fe.subscribe(body)) == (REJECTED, "amqp:decode-error"), why
    assert outcome(fe.subscribe({"ms/ok": 0})) == (ACCEPTED, None)


def test_unknown_subjects_and_bad_fields_are_decode_errors() -> None:
    """Unknown subjects, a bad correlation-id or an unsubscribe map: decode-error, link kept."""
    net = Net()
    persistent_session(net, "mc", ("mc/t", 0))
    fe = net.fe("mc")
    for message in (control("frobnicate", "mc"),
                    Message(subject="subscribe", correlation_id="not-an-address", body={}),
                    control("unsubscribe", "mc", body={"a": 1})):
        assert outcome(fe.send(message)) == (REJECTED, "amqp:decode-error")
    assert fe.list() == {"mc/t": 0}


def test_unsubscribe_removes_the_route() -> None:
    """AMQP_UNSUBSCRIBE (a list of filters) is Accepted and that route is gone."""
    net = Net()
    persistent_session(net, "un", ("un/a", 1), ("un/b", 1))
    fe = net.fe("un")
    fe.list()
    publish = fe.attach_publish()
    assert outcome(fe.send(control("unsubscribe", "un", body=["un/a"]))) == (ACCEPTED, None)
    pub = net.mqtt("pub")
    pub.publish("un/a", b"gone", qos=1)
    pub.publish("un/b", b"kept", qos=1)
    assert publish.bodies() == [b"kept"]
    assert fe.list() == {"un/b": 1}


def test_close_removes_session_subscriptions_and_queue() -> None:
    """AMQP_CLOSE removes the session with its queue: an MQTT client then finds none."""
    net = Net()
    persistent_session(net, "cl", ("cl/t", 1))
    net.mqtt("pub").publish("cl/t", b"queued", qos=1)
    fe = net.fe("cl")
    assert outcome(fe.send(control("close", "cl"))) == (ACCEPTED, None)
    assert "cl" not in net.broker.sessions
    back = net.mqtt("cl", clean=False)
    assert back.connack.session_present is False
    assert back.publishes() == []


def test_list_reply_precedes_queued_messages() -> None:
    """.publish attached before AMQP_LIST: AMQP_SUBSCRIPTIONS first, then queued messages."""
    net = Net()
    persistent_session(net, "or", ("or/t", 1))
    pub = net.mqtt("pub")
    for i in range(3):
        pub.publish("or/t", b"q%d" % i, qos=1)
    fe = net.fe("or", publish_now=True)
    assert fe.publish is not None
    assert fe.publish.new() == []          # waits for the session decision
    assert fe.list() == {"or/t": 1}
    assert fe.publish.bodies() == [b"q0", b"q1", b"q2"]


def test_close_with_publish_attached_starts_clean() -> None:
    """AMQP_CLOSE after the .publish attach: old session and queue gone, a clean one serves."""
    net = Net()
    persistent_session(net, "cc", ("cc/t", 1))
    pub = net.mqtt("pub")
    pub.publish("cc/t", b"old", qos=1)
    fe = net.fe("cc", publish_now=True)
    assert fe.publish is not None
    assert outcome(fe.send(control("close", "cc"))) == (ACCEPTED, None)
    assert outcome(fe.subscribe({"cc/n": 1})) == (ACCEPTED, None)
    pub.publish("cc/t", b"unrouted", qos=1)
    pub.publish("cc/n", b"new", qos=1)
    assert fe.publish.bodies() == [b"new"]


def test_publish_receiver_takes_the_session_over_from_mqtt_and_back() -> None:
    """A .publish receiver takes a session over from MQTT; MQTT taking it back steals the link."""
    net = Net()
    persistent_session(net, "to", ("to/t", 1))
    holder = net.mqtt("to", clean=False)
    app = net.amqp()
    publish = app.receiver("$mqtt.to.to.publish")
    assert holder.transport.disconnecting
    net.mqtt("pub").publish("to/t", b"to-amqp", qos=1)
    assert publish.bodies() == [b"to-amqp"]
    back = net.mqtt("to", clean=False)
    assert back.connack.session_present is True
    assert publish.link.remote_condition.name == "amqp:link:stolen"


def test_fe_dropped_connection_fires_will_and_keeps_session() -> None:
    """An FE whose socket dies fires its will; the persistent session keeps its routes."""
    net = Net()
    sub = watch(net, "fd/will")
    persistent_session(net, "fd")
    fe = net.fe("fd")
    fe.peer.send(fe.will, will_message("fd/will", b"fe-died", qos=1))
    fe.list()
    fe.attach_publish()
    fe.subscribe({"fd/d": 1})
    fe.peer.kill()
    assert seen(sub) == [("fd/will", b"fe-died", 1, False)]
    assert net.fe("fd").list() == {"fd/d": 1}


# == the QoS 2 release loop =========================================================


def test_qos2_release_loop_completes() -> None:
    """QoS 2 to an FE: PUBREL to $mqtt.<id>.pubrel, PUBREL back on .publish, then done."""
    net = Net()
    persistent_session(net, "q2", ("q2/t", 2))
    fe = net.fe("q2")
    fe.list()
    publish = fe.attach_publish()
    pub = net.mqtt("pub")
    pub.publish("q2/t", b"exactly", qos=2)
    [(m, dlv)] = publish.new()
    assert annotation(m, "x-opt-mqtt-qos") == 2 and not dlv.settled
    packet_id = int(m.id)
    rel = fe.peer.sender("$mqtt.q2.pubrel")
    assert outcome(fe.peer.send(rel, Message(subject="pubrel", id=ulong(packet_id)))) == (
        ACCEPTED, None)
    fe.peer.settle(dlv, ACCEPTED)
    [(back, bdlv)] = publish.new()
    assert back.subject == "pubrel" and int(back.id) == packet_id
    fe.peer.settle(bdlv, ACCEPTED)               # PUBCOMP from the client
    publish.link.close()
    again = fe.attach_publish()                  # the same session, a new receiver
    pub.publish("q2/t", b"next", qos=1)
    assert again.bodies() == [b"next"]


def test_pubrel_without_a_packet_id_is_rejected() -> None:
    """AMQP_PUBREL without a packet id in message-id is Rejected with amqp:decode-error."""
    net = Net()
    app = net.amqp()
    rel = app.sender("$mqtt.pr.pubrel")
    assert outcome(app.send(rel, Message(subject="pubrel"))) == (REJECTED, "amqp:decode-error")
    assert outcome(app.send(rel, Message(subject="pubrel", id=ulong(9)))) == (ACCEPTED, None)


# == topics: receivers, senders, settlement =========================================


def test_mqtt_publisher_to_wildcard_receivers_with_annotations() -> None:
    """Topic-filter receivers get MQTT messages with the contract's annotations and settlement."""
    net = Net()
    app = net.amqp()
    plus = app.receiver("s/+/temp")
    hash_ = app.receiver("s/#")
    pub = net.mqtt("pub")
    pub.publish("s/1/temp", b"21.5", qos=1)
    pub.publish("s/2/temp", b"19.0", qos=0)
    pub.publish("s/1/hum", b"40", qos=1)
    (m1, d1), (m2, d2) = plus.new()
    assert (m1.address, bytes(m1.body), m1.inferred) == ("s/1/temp", b"21.5", True)
    assert annotation(m1, "x-opt-mqtt-qos") == 1
    assert annotation(m1, "x-opt-retain-message") is False
    assert annotation(m1, "x-opt-mqtt-client-id") == "pub"
    assert m1.durable is True and m1.delivery_count == 0 and not d1.settled
    assert (m2.address, annotation(m2, "x-opt-mqtt-qos"), m2.durable) == ("s/2/temp", 0, False)
    assert d2.settled
    assert [m.address for m, _ in hash_.new()] == ["s/1/temp", "s/2/temp", "s/1/hum"]


def test_amqp_sender_reaches_mqtt_at_its_qos_and_retain_survives() -> None:
    """AMQP publishes reach MQTT at their QoS; retain is kept, and an empty body deletes it."""
    net = Net()
    sub = watch(net, "q/x")
    app = net.amqp()
    snd = app.sender("q/x")
    for qos in (0, 1, 2):
        assert outcome(app.send(snd, publish_message(None, b"q%d" % qos, qos=qos))) == (
            ACCEPTED, None)
    assert seen(sub) == [("q/x", b"q0", 0, False), ("q/x", b"q1", 1, False),
                         ("q/x", b"q2", 2, False)]
    app.send(snd, publish_message(None, b"kept", qos=1, retain=True))
    assert net.broker.retained.get("q/x") is not None
    late = net.mqtt("late")
    late.subscribe(("q/x", 2))
    assert [(p.payload, p.qos, p.retain) for p in late.publishes()] == [(b"kept", 1, True)]
    app.send(snd, publish_message(None, b"", qos=1, retain=True))
    assert net.broker.retained.get("q/x") is None


def test_null_address_sender_publishes_to_each_messages_to() -> None:
    """A null-address sender publishes to each message's ``to``; without one: invalid-field."""
    net = Net()
    app = net.amqp("my-container")
    rcv = app.receiver("an/t")
    snd = app.sender(None)
    assert outcome(app.send(snd, publish_message("an/t", b"via-to", qos=1))) == (ACCEPTED, None)
    assert outcome(app.send(snd, publish_message(None, b"nowhere", qos=1))) == (
        REJECTED, "amqp:invalid-field")
    [(m, _)] = rcv.new()
    assert bytes(m.body) == b"via-to"
    assert annotation(m, "x-opt-mqtt-client-id") == "my-container"


def test_released_and_modified_without_failure_redeliver_unchanged() -> None:
    """Released and Modified (not failed) redeliver with delivery-count unchanged (§3.4.4)."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("rel/t", credit=5)
    net.mqtt("pub").publish("rel/t", b"again", qos=1)
    [(m, dlv)] = rcv.new()
    assert (bytes(m.body), m.delivery_count) == (b"again", 0)
    app.settle(dlv, RELEASED)
    [(m, dlv)] = rcv.new()
    assert (bytes(m.body), m.delivery_count) == (b"again", 0)
    app.settle(dlv, MODIFIED)
    [(m, dlv)] = rcv.new()
    assert (bytes(m.body), m.delivery_count) == (b"again", 0)
    app.settle(dlv, ACCEPTED)
    assert rcv.new() == []


def test_modified_delivery_failed_increments_delivery_count() -> None:
    """Modified with delivery-failed redelivers with delivery-count + 1 (§3.4.5)."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("mod/t", credit=5)
    net.mqtt("pub").publish("mod/t", b"retry", qos=1)
    counts = []
    for _ in range(3):
        [(m, dlv)] = rcv.new()
        counts.append(m.delivery_count)
        app.settle(dlv, MODIFIED, failed=True)
    [(m, dlv)] = rcv.new()
    counts.append(m.delivery_count)
    app.settle(dlv, ACCEPTED)
    assert counts == [0, 1, 2, 3]


def test_rejected_is_dropped_and_counted() -> None:
    """A Rejected delivery is not redelivered, and $SYS counts it as dropped."""
    net = Net(sys_interval=1)
    app = net.amqp()
    rcv = app.receiver("rej/t", credit=5)
    pub = net.mqtt("pub")
    pub.publish("rej/t", b"bad", qos=1)
    [(_, dlv)] = rcv.new()
    app.settle(dlv, REJECTED)
    pub.publish("rej/t", b"next", qos=1)
    assert rcv.bodies() == [b"next"]
    net.advance(1)
    assert net.broker.stats.messages_dropped == 1


def test_receiver_is_never_sent_more_than_its_credit() -> None:
    """A receiver with credit 3 gets 3 of 6 messages, and the rest only as it grants more."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("cr/t", credit=3)
    pub = net.mqtt("pub")
    for i in range(6):
        pub.publish("cr/t", b"%d" % i, qos=1)
    assert rcv.bodies() == [b"0", b"1", b"2"]
    rcv.link.flow(2)
    net.pump()
    assert rcv.bodies() == [b"3", b"4"]
    assert rcv.link.credit == 0


@pytest.mark.parametrize("mode,qos,settled", [
    (Link.SND_SETTLED, 1, True), (Link.SND_UNSETTLED, 0, False)])
def test_receiver_settle_mode_is_honoured(mode: int, qos: int, settled: bool) -> None:
    """A receiver's snd-settle-mode (settled or unsettled) is honoured and reported truly."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("ps/t", snd_settle_mode=mode)
    assert rcv.link.remote_snd_settle_mode == mode
    net.mqtt("pub").publish("ps/t", b"one", qos=qos)
    [(m, dlv)] = rcv.new()
    assert dlv.settled is settled and annotation(m, "x-opt-mqtt-qos") == 0


def test_rcv_settle_mode_second_routes_once_when_the_sender_settles() -> None:
    """rcv-settle-mode second: Accepted unsettled, routed exactly once when the sender settles."""
    net = Net()
    sub = watch(net, "eo/t")
    app = net.amqp()
    snd = app.sender("eo/t", rcv_settle_mode=Link.RCV_SECOND)
    assert snd.remote_rcv_settle_mode == Link.RCV_SECOND
    dlv = app.send(snd, publish_message(None, b"once", qos=2))
    assert outcome(dlv) == (ACCEPTED, None) and not dlv.settled   # not settled by the broker
    assert seen(sub) == []
    dlv.settle()
    net.pump()
    assert seen(sub) == [("eo/t", b"once", 2, False)]
    assert seen(sub) == []


# Bodies other than Data and AmqpValue string/binary: ``test_amqp_native``.


# == credit and the stall timeout ========================================================

QUEUE_LIMIT = 300
INFLIGHT = 10
HIGH_WATER = QUEUE_LIMIT // 2
CREDIT_CEILING = QUEUE_LIMIT + INFLIGHT


def flow_net(queue_limit: int = QUEUE_LIMIT) -> Net:
    """Small queues, a stall timeout that never interferes, $SYS once a minute."""
    return Net(max_queued_messages=queue_limit, max_inflight=INFLIGHT,
               stall_timeout=600.0, sys_interval=60)


def send_until_withheld(app: Any, snd: Link, sent: list[bytes]) -> int:
    """Send QoS 1 while the broker grants credit; the number sent (= credit granted)."""
    granted = 0
    while snd.credit > 0:
        assert granted < CREDIT_CEILING, "the broker kept granting credit"
        body = b"m-%d" % len(sent)
        assert outcome(app.send(snd, publish_message(None, body, qos=1))) == (ACCEPTED, None)
        sent.append(body)
        granted += 1
    return granted


def slow_subscriber(net: Net, topic: str) -> MqttPeer:
    """An online MQTT subscriber (persistent session) that acknowledges nothing yet."""
    sub = net.mqtt("slow", clean=False)
    assert sub.subscribe((topic, 1)) == (1,)
    return sub


def test_sender_credit_withheld_while_mqtt_subscriber_congested_then_given_back() -> None:
    """Credit is withheld while an MQTT subscriber is past high water, and back once it drains."""
    net = flow_net()
    sub = slow_subscriber(net, "fl/t")
    app = net.amqp()
    snd = app.sender("fl/t")
    assert 0 < snd.credit <= 100
    sent: list[bytes] = []
    granted = send_until_withheld(app, snd, sent)
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    first = sub.publishes()
    assert len(first) == INFLIGHT
    sub.ack(first)
    second = sub.publishes()
    assert len(second) == INFLIGHT and snd.credit == 0     # still past high water
    got = first + second
    while len(got) < len(sent):
        sub.ack(got[-INFLIGHT:])
        more = sub.publishes()
        assert more, "the subscriber stopped receiving"
        got += more
    sub.ack(got[-INFLIGHT:])
    assert snd.credit > 0                                  # drained: credit is back
    assert [p.payload for p in got] == sent
    app.send(snd, publish_message(None, b"end", qos=1))
    assert [p.payload for p in sub.publishes()] == [b"end"]


def test_sender_credit_withheld_while_amqp_receiver_gives_no_credit() -> None:
    """A creditless AMQP receiver withholds the sender's credit until it takes its messages."""
    net = flow_net()
    taker = net.amqp()
    rcv = taker.receiver("fa/t", credit=0)
    app = net.amqp()
    snd = app.sender("fa/t")
    sent: list[bytes] = []
    granted = send_until_withheld(app, snd, sent)
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    assert rcv.new() == []                                 # no credit, nothing sent
    got: list[bytes] = []
    while len(got) < granted:
        rcv.link.flow(INFLIGHT)
        net.pump()
        batch = rcv.new()
        assert 0 < len(batch) <= INFLIGHT
        for m, dlv in batch:
            got.append(bytes(m.body))
            taker.settle(dlv, ACCEPTED)
    assert got == sent
    assert snd.credit > 0


def test_stall_timeout_gives_credit_back_and_the_queue_drops_at_its_bound() -> None:
    """After stall_timeout (not before) credit returns; the stalled queue drops at its bound."""
    net = Net(max_queued_messages=QUEUE_LIMIT, max_inflight=INFLIGHT, stall_timeout=2.0,
              sys_interval=60)
    sub = slow_subscriber(net, "st/t")
    app = net.amqp()
    snd = app.sender("st/t")
    sent: list[bytes] = []
    granted = send_until_withheld(app, snd, sent)
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    net.advance(1.99, step=0.5)
    assert snd.credit == 0
    net.advance(0.02)
    assert snd.credit > 0
    extra = 20
    for _ in range(CREDIT_CEILING + extra - granted):
        assert snd.credit > 0, "credit withheld again for a stalled subscriber"
        body = b"m-%d" % len(sent)
        assert outcome(app.send(snd, publish_message(None, body, qos=1))) == (ACCEPTED, None)
        sent.append(body)
    got = sub.publishes()
    while len(got) < CREDIT_CEILING:
        sub.ack(got[-INFLIGHT:])
        more = sub.publishes()
        assert more, f"only {len(got)} arrived"
        got += more
    sub.ack(got[-INFLIGHT:])
    assert [p.payload for p in got] == sent[:CREDIT_CEILING]
    assert sub.publishes() == []
    net.advance(60, step=10)
    assert net.broker.stats.messages_dropped == extra


def test_small_queue_bound_caps_the_credit_window() -> None:
    """A small queue bound caps the credit window, so nothing granted can overflow the queue."""
    net = flow_net(queue_limit=40)
    sub = slow_subscriber(net, "sq/t")
    app = net.amqp()
    snd = app.sender("sq/t")
    assert 0 < snd.credit <= 20
    sent: list[bytes] = []
    granted = send_until_withheld(app, snd, sent)
    assert 20 + INFLIGHT < granted <= 40 + INFLIGHT
    got = sub.publishes()
    while len(got) < len(sent):
        sub.ack(got[-INFLIGHT:])
        got += sub.publishes()
    assert [p.payload for p in got] == sent
    net.advance(60, step=10)
    assert net.broker.stats.messages_dropped == 0


# == the will grace rule after a restart, the idle time-out =================================

GRACE = 10.0


def restarted_with_will(owner: str) -> Net:
    """A broker started on a store that holds the will of ``owner`` (connected at the
    last stop), with an AMQP receiver watching the will topic."""
    will = WillMessage(owner, "gr/" + owner, b"orphan", 1, False, "amqp", 1.0)
    return Net(SnapshotStore(Snapshot(wills={owner: will})), will_grace=GRACE)


def test_orphan_will_fires_after_the_grace_period() -> None:
    """A will stored by the last run is published after will_grace seconds, not before."""
    net = restarted_with_will("gone")
    app = net.amqp()
    rcv = app.receiver("gr/#")
    net.advance(GRACE - 0.1)
    assert rcv.new() == [] and "gone" in net.broker.wills
    net.advance(0.2)
    [(m, _)] = rcv.new()
    assert (m.address, bytes(m.body), annotation(m, "x-opt-mqtt-qos")) == (
        "gr/gone", b"orphan", 1)
    assert net.broker.wills == {}


def test_will_link_attaching_within_grace_cancels_the_orphan_will() -> None:
    """A will link of the owner's name attaching within the grace period cancels its old will."""
    net = restarted_with_will("back")
    app = net.amqp()
    rcv = app.receiver("gr/#")
    net.advance(GRACE / 2)
    fe = net.fe("back")
    assert "back" not in net.broker.wills
    net.advance(GRACE)
    assert rcv.new() == []
    fe.will.close()
    net.pump()
    assert rcv.new() == []


def test_idle_timeout_closes_a_silent_peer_and_publishes_its_will() -> None:
    """A silent peer is closed at the idle time-out (resource-limit-exceeded); its will fires."""
    net = Net(idle_timeout=4.0)
    sub = watch(net, "it/#")
    fe = net.fe("idle")
    fe.peer.send(fe.will, will_message("it/idle", b"timed-out", qos=1))
    talker = net.amqp()
    fe.peer.silent = True
    net.advance(3.9, step=0.5)
    assert seen(sub) == [] and not fe.peer.wire.disconnecting
    net.advance(0.5, step=0.5)
    assert fe.peer.wire.disconnecting
    fe.peer.silent = False
    net.pump()
    assert fe.peer.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    assert seen(sub) == [("it/idle", b"timed-out", 1, False)]
    assert not talker.wire.disconnecting and not talker.lost


# == found in review of the core redesign ======================================================

def test_fe_pubrel_is_accepted_before_the_release_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The FE's AMQP_PUBREL is answered (Accepted) before the release goes out on .publish:
    the FE settles the original delivery on that answer, and only then expects it."""
    from mqttamqp.amqp import incoming, subscribers

    order: list[str] = []
    send_pubrel, answer = subscribers._SessionLink.send_pubrel, incoming.IncomingLink.answer

    def recording_pubrel(self: Any, packet_id: int) -> None:
        order.append("release on .publish")
        send_pubrel(self, packet_id)

    def recording_answer(self: Any, dlv: Any, state: int, *a: Any) -> None:
        order.append("answer on " + self.address)
        answer(self, dlv, state, *a)

    monkeypatch.setattr(subscribers._SessionLink, "send_pubrel", recording_pubrel)
    monkeypatch.setattr(incoming.IncomingLink, "answer", recording_answer)
    net = Net()
    persistent_session(net, "q2", ("q2/t", 2))
    fe = net.fe("q2")
    fe.list()
    publish = fe.attach_publish()
    net.mqtt("pub").publish("q2/t", b"x", qos=2)
    [(m, _)] = publish.new()
    rel = fe.peer.sender("$mqtt.q2.pubrel")
    order.clear()
    fe.peer.send(rel, Message(subject="pubrel", id=ulong(int(m.id))))
    assert order == ["answer on $mqtt.q2.pubrel", "release on .publish"]


def test_retained_qos0_at_receiver_attach_waits_for_credit() -> None:
    """Retained QoS 0 messages a topic receiver cannot take when it attaches (no
    credit) wait for its credit (issue #26: none dropped), then all arrive."""
    net = Net(congested_qos0_bytes=1000)
    for i in range(50):
        net.broker.publish(Message_(f"r/{i}", b"x" * 100, 0, True))
    app = net.amqp("app")
    receiver = app.receiver("r/#", credit=0)
    assert net.broker.registry.drops.dropped_total() == 0
    receiver.link.flow(100)
    net.pump()
    receiver.collect()
    assert len(receiver.new()) == 50 and net.broker.registry.drops.dropped_total() == 0


def test_console_disconnect_of_a_waiting_fe_leaves_the_mqtt_holder_alone() -> None:
    """Disconnecting an AMQP connection whose .publish receiver still waits for AMQP_LIST
    closes that connection only, not the MQTT client holding the session."""
    net = Net()
    device = net.mqtt("dev", clean=False)
    fe = net.fe("dev")
    fe.attach_publish()              # waits: the FE's AMQP_LIST decides the session
    key = next(k for k in net.broker.connections if k.startswith("amqp:"))
    done = net.broker.commands.disconnect(key, False, "console")
    net.pump()
    assert done is not None
    assert not device.transport.disconnecting
    assert net.broker.sessions["dev"].connection is not None


def test_sys_byte_counters_count_each_amqp_byte_once() -> None:
    """$SYS bytes/received and bytes/sent count AMQP socket bytes once (they were
    counted again per message)."""
    from amqp_memory import Net
    from proton import Message

    net = Net()
    peer = net.amqp("counted")
    rcv = peer.receiver("count/t")
    snd = peer.sender("count/t")
    for _ in range(5):
        peer.send(snd, Message(body=b"x" * 1000))
    assert len(rcv.bodies()) == 5
    stats = net.broker.stats
    assert stats.bytes_received == peer.server.bytes_in
    assert stats.bytes_sent == peer.server.bytes_out

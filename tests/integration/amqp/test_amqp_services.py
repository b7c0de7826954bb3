"""The Will service and the Subscription service (docs/amqp.md) with real
clients: python-qpid-proton's blocking API as the FE or a native client, paho-mqtt
as the MQTT side, one broker on loopback.

Every WS and SS message, detach with and without error, a killed connection, the
QoS 2 release loop, takeover between MQTT and AMQP consumers of one session, the
FE-role scenario of seed 000 side by side with an MQTT client doing the same, and
malformed control messages (Rejected ``amqp:decode-error``, link kept).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import (
    ACCEPTED,
    AT_LEAST_ONCE,
    REJECTED,
    TIMEOUT,
    body_bytes,
    conns,
    outcome,
    paho,
    receiver,
    send_expect,
    take,
    uid,
    wait_messages,
    will_client_process,
)
from amqp_messages import annotation, control, will_message
from brokerproc import BrokerProcess
from proton import Condition, Message, int32, ulong
from proton.utils import BlockingConnection, LinkDetached

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("amqp-services")),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def detach_with_error(sender: Any) -> None:
    sender.link.condition = Condition("amqp:link:detach-forced", "client lost")
    sender.close()


def marker_after(pub: Any, sub: Any, topic: str) -> list[Any]:
    """Publish a marker on ``topic`` and return what ``sub`` got up to it."""
    pub.publish(topic, b"marker", qos=1)
    return sub.until(topic)


# == the Will service =========================================================================

def test_will_published_on_detach_with_error(broker, conns, paho) -> None:
    """AMQP_WILL is Accepted; a detach with an error publishes it with its QoS and retain."""
    topic = uid("wt") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = conns(broker)
    ws = conn.create_sender("$mqtt.willservice", name=uid("fe"), options=AT_LEAST_ONCE)
    d = ws.send(will_message(topic, b"gone", qos=1, retain=True))
    assert d.remote_state == ACCEPTED
    detach_with_error(ws)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"gone", 1)
    late = paho(broker, uid("late"))
    late.subscribe((topic, 2))
    r = late.get()
    assert (r.payload, r.retain, r.qos) == (b"gone", True, 1)


def test_detach_without_error_deletes_the_will(broker, conns, paho) -> None:
    """A clean detach of the will link deletes the will; nothing is published."""
    topic = uid("wc") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = conns(broker)
    ws = conn.create_sender("$mqtt.willservice", name=uid("fe"), options=AT_LEAST_ONCE)
    ws.send(will_message(topic, b"never", qos=1))
    ws.close()
    got = marker_after(paho(broker, uid("p")), sub, topic)
    assert [m.payload for m in got] == [b"marker"]


def test_will_clear_then_detach_with_error_publishes_nothing(broker, conns, paho) -> None:
    """AMQP_WILL_CLEAR deletes the will: a later brute detach has nothing to publish."""
    topic = uid("wx") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = conns(broker)
    ws = conn.create_sender("$lwt", name=uid("fe"), options=AT_LEAST_ONCE)
    ws.send(will_message(topic, b"never", qos=0))
    d = ws.send(Message(subject="will-clear"))
    assert d.remote_state == ACCEPTED
    detach_with_error(ws)
    got = marker_after(paho(broker, uid("p")), sub, topic)
    assert [m.payload for m in got] == [b"marker"]


def test_will_overwritten_mid_connection(broker, conns, paho) -> None:
    """A second AMQP_WILL replaces the first; only the second is published."""
    topic = uid("wo") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = conns(broker)
    ws = conn.create_sender("$mqtt.lwtservice", name=uid("fe"), options=AT_LEAST_ONCE)
    ws.send(will_message(topic, b"first", qos=1))
    ws.send(will_message(topic, b"second", qos=2))
    detach_with_error(ws)
    m = sub.get()
    assert (m.payload, m.qos) == (b"second", 2)
    got = marker_after(paho(broker, uid("p")), sub, topic)
    assert [x.payload for x in got] == [b"marker"]


def test_will_qos_falls_back_to_durable(broker, conns, paho) -> None:
    """Without x-opt-mqtt-qos, durable true means QoS 1 (seed 000), durable false QoS 0."""
    topic = uid("wd") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = conns(broker)
    for durable, expected in ((True, 1), (False, 0)):
        ws = conn.create_sender("$mqtt.willservice", name=uid("fe"))
        ws.send(will_message(topic, b"d", qos=None, durable=durable))
        detach_with_error(ws)
        assert sub.get().qos == expected


def test_will_published_when_connection_is_killed(broker, paho) -> None:
    """A connection lost without detaching the will link (process killed) publishes the will."""
    topic = uid("wk") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    proc = will_client_process(broker, uid("fe"), topic, "killed", qos=1)
    try:
        proc.kill()
        proc.wait(TIMEOUT)
        m = sub.get()
        assert (m.topic, m.payload, m.qos) == (topic, b"killed", 1)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_clean_connection_close_deletes_the_will(broker, conns, paho) -> None:
    """A clean AMQP close (no error) detaches implicitly without error: no will."""
    topic = uid("wcl") + "/will"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 2))
    conn = BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=TIMEOUT)
    ws = conn.create_sender("$mqtt.willservice", name=uid("fe"))
    ws.send(will_message(topic, b"never", qos=1))
    conn.close()
    got = marker_after(paho(broker, uid("p")), sub, topic)
    assert [m.payload for m in got] == [b"marker"]


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
def test_malformed_will_is_rejected_and_link_kept(broker, conns, message: Message,
                                                   why: str) -> None:
    """A malformed AMQP_WILL is Rejected with amqp:decode-error; the link stays attached."""
    conn = conns(broker)
    ws = conn.create_sender("$mqtt.willservice", name=uid("fe"))
    d = send_expect(ws, message)
    assert outcome(d) == (REJECTED, "amqp:decode-error"), why
    assert d.remote.condition.description
    ok = ws.send(will_message(uid("ok") + "/w", b"fine", qos=0))
    assert ok.remote_state == ACCEPTED
    ws.close()


# == the Subscription service ===================================================================

class FE:
    """A native AMQP client in the FE role of seed 000, for one client id."""

    def __init__(self, broker: BrokerProcess, conns: Any, client_id: str,
                 publish_now: bool = False) -> None:
        self.client_id = client_id
        self.conn: BlockingConnection = conns(broker)
        self.will = self.conn.create_sender("$mqtt.willservice", name=client_id,
                                            options=AT_LEAST_ONCE)
        self.ss = self.conn.create_sender("$mqtt.subscriptionservice", name=uid("ss"),
                                          options=AT_LEAST_ONCE)
        self.control = receiver(self.conn, f"$mqtt.to.{client_id}.control",
                                options=AT_LEAST_ONCE)
        self.publish: Any = None
        if publish_now:
            self.attach_publish()

    def attach_publish(self, credit: int = 20) -> None:
        self.publish = receiver(self.conn, f"$mqtt.to.{self.client_id}.publish", credit=credit,
                                options=AT_LEAST_ONCE)

    def send(self, message: Message) -> Any:
        return send_expect(self.ss, message)

    def list(self) -> dict[str, int]:
        d = self.send(control("list", self.client_id,
                              reply_to=f"$mqtt.to.{self.client_id}.control"))
        assert d.remote_state == ACCEPTED
        reply, _ = take(self.conn, self.control)
        self.control.accept()
        assert reply.subject == "subscriptions"
        assert reply.correlation_id == f"$mqtt.to.{self.client_id}.publish"
        assert isinstance(reply.body, dict)
        assert all(type(v) is int32 for v in reply.body.values())   # sent as ints
        return {str(k): int(v) for k, v in reply.body.items()}

    def subscribe(self, filters: dict[str, Any], packet_id: int = 1) -> Any:
        return self.send(control("subscribe", self.client_id, body=filters,
                                 message_id=ulong(packet_id)))

    def next(self) -> tuple[Message, Any]:
        return take(self.conn, self.publish)


def test_list_replies_with_the_sessions_subscriptions(broker, conns, paho) -> None:
    """AMQP_LIST: Accepted, then AMQP_SUBSCRIPTIONS (filter -> int QoS) to reply-to."""
    cid = uid("ls")
    mq = paho(broker, cid, clean=False)
    mq.subscribe((f"{cid}/a/#", 1), (f"{cid}/b", 2))
    mq.stop()
    fe = FE(broker, conns, cid)
    assert fe.list() == {f"{cid}/a/#": 1, f"{cid}/b": 2}
    assert FE(broker, conns, uid("none")).list() == {}


def test_list_opens_an_offline_persistent_session(broker, conns, paho) -> None:
    """AMQP_LIST for a client id with no session opens a persistent one: empty at first,
    and the MQTT client connecting later with clean session 0 finds it."""
    cid = uid("lo")
    fe = FE(broker, conns, cid)
    assert fe.list() == {}
    fe.conn.close()
    device = paho(broker, cid, clean=False)
    assert device.session_present is True


def test_subscribe_provisions_a_device_before_it_connects(broker, conns, paho) -> None:
    """AMQP_SUBSCRIBE for an unknown client id creates its offline persistent session with
    the subscription; what is published meanwhile waits for the device's first CONNECT."""
    cid = uid("pv")
    ss = conns(broker).create_sender("$mqtt.subscriptionservice", options=AT_LEAST_ONCE)
    d = send_expect(ss, control("subscribe", cid, body={f"{cid}/cmd": int32(1)},
                                message_id=ulong(1)))
    assert d.remote_state == ACCEPTED
    paho(broker, uid("p")).publish(f"{cid}/cmd", b"reboot", qos=1)
    device = paho(broker, cid, clean=False)
    assert device.session_present is True
    m = device.get()
    assert (m.topic, m.payload, m.qos) == (f"{cid}/cmd", b"reboot", 1)


def test_list_without_reply_to_is_precondition_failed(broker, conns) -> None:
    """AMQP_LIST without a usable reply-to is Rejected with amqp:precondition-failed."""
    fe = FE(broker, conns, uid("lp"))
    d = fe.send(control("list", fe.client_id))
    assert outcome(d) == (REJECTED, "amqp:precondition-failed")
    d = fe.send(Message(subject="list", reply_to=f"$mqtt.to.{fe.client_id}.control"))
    assert outcome(d) == (REJECTED, "amqp:precondition-failed")
    assert fe.list() == {}   # the link is kept


def test_close_removes_the_session(broker, conns, paho) -> None:
    """AMQP_CLOSE removes session, subscriptions and queue: the MQTT client finds no session."""
    cid = uid("cl")
    mq = paho(broker, cid, clean=False)
    mq.subscribe((f"{cid}/t", 1))
    mq.stop()
    paho(broker, uid("p")).publish(f"{cid}/t", b"queued", qos=1)
    fe = FE(broker, conns, cid)
    d = fe.send(control("close", cid))
    assert d.remote_state == ACCEPTED
    back = paho(broker, cid, clean=False)
    assert back.session_present is False
    assert fe.list() == {}   # (AMQP_LIST opens the session again, empty)
    back.subscribe((f"{cid}/m", 1))
    got = marker_after(paho(broker, uid("p")), back, f"{cid}/m")
    assert [m.payload for m in got] == [b"marker"]   # the queued message went with it


def test_subscribe_delivers_retained_then_live_to_publish(broker, conns, paho) -> None:
    """AMQP_SUBSCRIBE: Accepted, retained messages to .publish with retain set, then live ones."""
    cid = uid("sb")
    pub = paho(broker, uid("p"))
    pub.publish(f"{cid}/r", b"kept", qos=1, retain=True)
    fe = FE(broker, conns, cid)
    assert fe.list() == {}
    fe.attach_publish()
    d = fe.subscribe({f"{cid}/+": int32(1), f"{cid}/s": "2"})  # an int and a decimal string
    assert d.remote_state == ACCEPTED
    m, _ = fe.next()
    assert (m.address, body_bytes(m), annotation(m, "x-opt-retain-message")) == (
        f"{cid}/r", b"kept", True)
    fe.publish.accept()
    pub.publish(f"{cid}/s", b"live", qos=2)
    m, dlv = fe.next()
    assert (body_bytes(m), annotation(m, "x-opt-retain-message")) == (b"live", False)
    assert annotation(m, "x-opt-mqtt-qos") == 2 and not dlv.settled
    fe.publish.accept()
    assert fe.list() == {f"{cid}/+": 1, f"{cid}/s": 2}


def test_subscribe_all_filters_failed_is_rejected(broker, conns) -> None:
    """AMQP_SUBSCRIBE where every filter fails is Rejected (SUBACK 0x80 for all)."""
    fe = FE(broker, conns, uid("sf"), publish_now=True)
    d = fe.subscribe({"a/#/b": 1, "": 0})
    assert outcome(d)[0] == REJECTED


@pytest.mark.parametrize("body,why", [
    (["a/b"], "list instead of map"),
    ({"a/b": "high"}, "qos not a number"),
    ({"a/b": 5}, "qos out of range"),
    ({}, "no filters"),
])
def test_malformed_subscribe_is_rejected_and_link_kept(broker, conns, body: Any,
                                                        why: str) -> None:
    """A malformed AMQP_SUBSCRIBE is Rejected with amqp:decode-error; the link stays."""
    fe = FE(broker, conns, uid("ms"), publish_now=True)
    d = fe.subscribe(body)
    assert outcome(d) == (REJECTED, "amqp:decode-error"), why
    assert fe.subscribe({f"{fe.client_id}/ok": 0}).remote_state == ACCEPTED


def test_malformed_control_messages(broker, conns) -> None:
    """Unknown subjects, a bad correlation-id or unsubscribe body: decode-error, link kept."""
    fe = FE(broker, conns, uid("mc"), publish_now=True)
    for message in (control("frobnicate", fe.client_id),
                    Message(subject="subscribe", correlation_id="not-an-address", body={}),
                    control("unsubscribe", fe.client_id, body={"a": 1})):
        assert outcome(fe.send(message)) == (REJECTED, "amqp:decode-error")
    assert fe.list() == {}


def test_unsubscribe(broker, conns, paho) -> None:
    """AMQP_UNSUBSCRIBE (list of filters) is Accepted and the route is gone."""
    cid = uid("un")
    fe = FE(broker, conns, cid, publish_now=True)
    fe.subscribe({f"{cid}/a": 1, f"{cid}/b": 1})
    d = fe.send(control("unsubscribe", cid, body=[f"{cid}/a"]))
    assert d.remote_state == ACCEPTED
    pub = paho(broker, uid("p"))
    pub.publish(f"{cid}/a", b"gone", qos=1)
    pub.publish(f"{cid}/b", b"kept", qos=1)
    m, _ = fe.next()
    fe.publish.accept()
    assert body_bytes(m) == b"kept"
    assert fe.list() == {f"{cid}/b": 1}


def test_qos2_release_loop_completes(broker, conns, paho) -> None:
    """QoS 2 to an FE: AMQP_PUBREL to $mqtt.<id>.pubrel, AMQP_PUBREL back on .publish, done."""
    cid = uid("q2")
    fe = FE(broker, conns, cid)
    fe.list()
    fe.attach_publish()
    fe.subscribe({f"{cid}/t": 2})
    pub = paho(broker, uid("p"))
    pub.publish(f"{cid}/t", b"exactly", qos=2)
    m, dlv = fe.next()
    assert annotation(m, "x-opt-mqtt-qos") == 2 and not dlv.settled
    packet_id = int(m.id)
    rel = fe.conn.create_sender(f"$mqtt.{cid}.pubrel", options=AT_LEAST_ONCE)
    d = rel.send(Message(subject="pubrel", id=ulong(packet_id)))
    assert d.remote_state == ACCEPTED
    fe.publish.accept()                        # settles the original delivery
    back, _ = fe.next()
    assert back.subject == "pubrel" and int(back.id) == packet_id
    fe.publish.accept()                        # PUBCOMP from the client
    # Completed: a new .publish receiver (same session) gets neither again.
    fe.publish.close()
    fe.attach_publish()
    pub.publish(f"{cid}/t", b"next", qos=1)
    m, _ = fe.next()
    fe.publish.accept()
    assert body_bytes(m) == b"next"


def test_malformed_pubrel_is_rejected(broker, conns) -> None:
    """AMQP_PUBREL without a packet id in message-id is Rejected with amqp:decode-error."""
    conn = conns(broker)
    rel = conn.create_sender(f"$mqtt.{uid('pr')}.pubrel")
    assert outcome(send_expect(rel, Message(subject="pubrel"))) == (REJECTED,
                                                                     "amqp:decode-error")
    assert rel.send(Message(subject="pubrel", id=ulong(9))).remote_state == ACCEPTED


# == one session, MQTT and AMQP consumers ==========================================

def test_amqp_publish_receiver_takes_over_from_mqtt(broker, conns, paho) -> None:
    """A .publish receiver takes the session over from an MQTT connection and drains its queue."""
    cid = uid("to")
    mq = paho(broker, cid, clean=False)
    mq.subscribe((f"{cid}/t", 1))
    mq.stop()
    pub = paho(broker, uid("p"))
    pub.publish(f"{cid}/t", b"while-away", qos=1)
    holder = paho(broker, cid, clean=False)     # online again: holds the session
    assert holder.session_present is True
    assert holder.get().payload == b"while-away"
    pub.publish(f"{cid}/t", b"queued", qos=1)
    assert holder.get().payload == b"queued"
    conn = conns(broker)
    rcv = receiver(conn, f"$mqtt.to.{cid}.publish")
    assert holder.disconnected.wait(TIMEOUT)    # taken over like two MQTT connections
    pub.publish(f"{cid}/t", b"to-amqp", qos=1)
    m, _ = take(conn, rcv)
    rcv.accept()
    if body_bytes(m) == b"queued":
        # (paho acknowledges after get() returned: when the takeover came first,
        # "queued" was still in flight, and a session redelivers what is unacknowledged)
        m, _ = take(conn, rcv)
        rcv.accept()
    assert body_bytes(m) == b"to-amqp"
    back = paho(broker, cid, clean=False)       # and MQTT takes it back: the link is detached
    assert back.session_present is True
    with pytest.raises(LinkDetached):
        conn.wait(lambda: False, timeout=TIMEOUT)
    assert rcv.link.remote_condition.name == "amqp:link:stolen"


# == the FE role of seed 000, against an MQTT client doing the same ==================

def kill_socket(conn: BlockingConnection) -> None:
    """Drop the TCP connection under a blocking client, without any AMQP close."""
    sock = conn.conn.transport._selectable._delegate
    sock.shutdown(socket.SHUT_RDWR)
    conn.closing = True     # proton's loop does not see its own shutdown: never close() it


def _as_fe(broker: BrokerProcess, conns: Any, cid: str, topic: str,
           will_topic: str) -> tuple[bool, Any, Any]:
    fe = FE(broker, conns, cid)
    assert fe.will.send(will_message(will_topic, b"will", qos=1)).remote_state == ACCEPTED
    present = bool(fe.list())
    fe.attach_publish()
    if not present:
        assert fe.subscribe({topic: 1}).remote_state == ACCEPTED
    m, _ = fe.next()
    fe.publish.accept()
    fe.list()     # a round trip: the broker has the Accepted before anything else happens
    return present, (body_bytes(m), bool(annotation(m, "x-opt-retain-message"))), fe


def _as_mqtt(broker: BrokerProcess, paho: Any, cid: str, topic: str,
             will_topic: str) -> tuple[bool, Any, Any]:
    client = paho(broker, cid, clean=False, will=(will_topic, b"will", 1, False))
    present = bool(client.session_present)
    if not present:
        client.subscribe((topic, 1))
    m = client.get()
    client.publish(f"{cid}/scratch", b"", qos=1)   # a round trip: our PUBACK went out first
    return present, (m.payload, m.retain), client


def test_fe_role_scenario_matches_an_mqtt_client(broker, conns, paho) -> None:
    """Seed 000's FE role (will, list, subscribe, drop) behaves exactly like an MQTT client."""
    pub = paho(broker, uid("p"))
    watcher = paho(broker, uid("w"))
    seen: dict[str, list[Any]] = {}
    for kind in ("fe", "mqtt"):
        cid = uid(kind)
        topic, will_topic = f"{cid}/data", f"{cid}/will"
        watcher.subscribe((will_topic, 2))
        pub.publish(topic, b"retained", qos=1, retain=True)
        if kind == "fe":
            present, first, fe = _as_fe(broker, conns, cid, topic, will_topic)
            kill_socket(fe.conn)
        else:
            present, first, client = _as_mqtt(broker, paho, cid, topic, will_topic)
            client.c.socket().shutdown(socket.SHUT_RDWR)
            assert client.disconnected.wait(TIMEOUT)
            client.c.loop_stop()
        will = watcher.get()
        pub.publish(topic, b"while-away", qos=1)
        if kind == "fe":
            present2, queued, _ = _as_fe(broker, conns, cid, topic, will_topic)
        else:
            present2, queued, _ = _as_mqtt(broker, paho, cid, topic, will_topic)
        seen[kind] = [present, first, (will.payload, will.qos), present2, queued]
    assert seen["fe"] == seen["mqtt"] == [
        False, (b"retained", True), (b"will", 1), True, (b"while-away", False)]


def test_fe_dropped_connection_fires_will_and_keeps_session(broker, conns, paho) -> None:
    """An FE whose socket dies fires the will; its persistent session stays with its routes."""
    cid = uid("fd")
    will_topic = f"{cid}/will"
    watcher = paho(broker, uid("w"))
    watcher.subscribe((will_topic, 1))
    fe = FE(broker, conns, cid)
    fe.will.send(will_message(will_topic, b"fe-died", qos=1))
    fe.list()
    fe.attach_publish()
    fe.subscribe({f"{cid}/d": 1})
    kill_socket(fe.conn)
    m = watcher.get()
    assert (m.payload, m.qos) == (b"fe-died", 1)
    again = FE(broker, conns, cid)
    assert again.list() == {f"{cid}/d": 1}


def test_list_reply_precedes_queued_messages(broker, conns, paho) -> None:
    """.publish attached before AMQP_LIST (seed order): AMQP_SUBSCRIPTIONS comes first."""
    cid = uid("or")
    mq = paho(broker, cid, clean=False)
    mq.subscribe((f"{cid}/t", 1))
    mq.stop()
    pub = paho(broker, uid("p"))
    for i in range(3):
        pub.publish(f"{cid}/t", b"q%d" % i, qos=1)
    fe = FE(broker, conns, cid, publish_now=True)     # the four links first
    d = fe.send(control("list", cid, reply_to=f"$mqtt.to.{cid}.control"))
    assert d.remote_state == ACCEPTED
    wait_messages(fe.conn, fe.publish, 1)
    assert fe.control.fetcher.has_message == 1       # the reply arrived before it
    reply = fe.control.fetcher.pop()
    assert {str(k): int(v) for k, v in reply.body.items()} == {f"{cid}/t": 1}
    got = [body_bytes(fe.next()[0]) for _ in range(3)]
    fe.publish.accept()
    assert got == [b"q0", b"q1", b"q2"]


def test_close_with_publish_attached_starts_clean(broker, conns, paho) -> None:
    """AMQP_CLOSE after the .publish attach: old session and queue gone, a clean one serves."""
    cid = uid("cc")
    mq = paho(broker, cid, clean=False)
    mq.subscribe((f"{cid}/t", 1))
    mq.stop()
    pub = paho(broker, uid("p"))
    pub.publish(f"{cid}/t", b"old", qos=1)
    fe = FE(broker, conns, cid, publish_now=True)
    assert fe.send(control("close", cid)).remote_state == ACCEPTED
    assert fe.subscribe({f"{cid}/n": 1}).remote_state == ACCEPTED
    pub.publish(f"{cid}/t", b"unrouted", qos=1)
    pub.publish(f"{cid}/n", b"new", qos=1)
    m, _ = fe.next()
    fe.publish.accept()
    assert body_bytes(m) == b"new"
    assert fe.list() == {}          # a clean session is not listed as present
